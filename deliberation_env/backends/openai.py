"""Any OpenAI-compatible chat-completions server (vLLM, SGLang, llama.cpp, Ollama, TGI, hosted).

Requests run concurrently on a thread pool (``concurrency``) over one ``httpx.Client``. Each
request goes to the least busy healthy replica among ``base_url``; a replica that refuses
connections or answers too slowly is set aside for ``cooldown`` seconds and the request fails
over to another. Connection errors, timeouts, 429, 5xx and malformed replies are retried with
exponential backoff up to ``max_retries``; then ``BackendError`` names the URL, the failure and
what to do. Other 4xx (a wrong model name, a bad key) fail at once, and so does a server that
cannot return the log-probabilities a request asked for. ``timeout`` bounds each network read;
``deadline`` bounds a whole request (all attempts and waits), so a server that sends a byte
now and then cannot hold a request forever. Replies are validated: unusable token counts are
estimated from the text, unusable log-probabilities become None, and a reply without a text
content is malformed. The API key is read from the environment variable ``api_key_env`` and
never appears in reprs, errors, ``identity()`` or caches.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import httpcore
import httpx

from deliberation_env.backends.base import Completion, Request, estimate_tokens

_MAX_TOKEN_COUNT = 10**9  # beyond any context window: a larger usage count is garbage
_LOGPROBS_REFUSED = re.compile(r"logprob|logits_all", re.IGNORECASE)


class BackendError(RuntimeError):
    """A request that could not be answered (after retries where retrying made sense)."""


class _Retryable(Exception):
    pass


class OpenAICompatibleBackend:
    """Chat completions over HTTP (see the module docstring).

    ``deadline`` (seconds, default 600): the most one request may take in total, attempts and
    backoff waits included. ``logprobs=False`` never asks the server for log-probabilities (for
    servers that cannot give them; critic confidence then comes from the critic's text).
    """

    def __init__(self, base_url: str | Sequence[str], model: str, api_key_env: str = "OPENAI_API_KEY",
                 timeout: float = 120.0, max_retries: int = 4, concurrency: int = 16, backoff: float = 0.5,
                 cooldown: float = 30.0, top_logprobs: int = 20, deadline: float = 600.0, logprobs: bool = True):
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls:
            raise ValueError("base_url needs at least one URL")
        for url in urls:
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise ValueError(f"base_url {url!r} must start with http:// or https:// (e.g. http://127.0.0.1:8000/v1)")
        for name, value in (("timeout", timeout), ("deadline", deadline)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        self.base_urls = [u.rstrip("/") for u in urls]
        self.model, self.api_key_env, self.timeout, self.deadline = model, api_key_env, timeout, float(deadline)
        self.max_retries, self.concurrency, self.backoff = max_retries, concurrency, backoff
        self.cooldown, self.top_logprobs, self.logprobs = cooldown, top_logprobs, logprobs
        self._busy = dict.fromkeys(self.base_urls, 0)
        self._down_until = dict.fromkeys(self.base_urls, 0.0)
        self._lock = threading.Lock()
        self._deadlines = _Deadlines()
        self._client: httpx.Client | None = None
        self._pool: ThreadPoolExecutor | None = None
        self.retries = 0

    def identity(self) -> str:
        # logprobs=False changes what critic completions hold, so it is part of the identity (only then,
        # so that existing cache keys stay as they were).
        return f"openai-compatible:model={self.model},top_logprobs={self.top_logprobs}" + (
            "" if self.logprobs else ",logprobs=off")

    def __repr__(self) -> str:
        return f"OpenAICompatibleBackend(base_url={self.base_urls!r}, model={self.model!r}, api_key_env={self.api_key_env!r})"

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self._client is not None:
            self._client.close()
        self._client = self._pool = None

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        if self._client is None or self._pool is None:
            key = os.environ.get(self.api_key_env, "")
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            limits = httpx.Limits(max_connections=self.concurrency)
            self._client = httpx.Client(headers=headers, timeout=self.timeout, limits=limits)
            _enforce_deadlines(self._client, self._deadlines)
            self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="openai-backend")
        futures = [self._pool.submit(self._one, request) for request in requests]
        wait(futures)
        failed = [f.exception() for f in futures if f.exception() is not None]
        if failed:  # keep what the other requests got, for a cache to store (Backend's docstring)
            error = failed[0]
            error.completed = {i: f.result() for i, f in enumerate(futures) if f.exception() is None}
            raise error
        return [f.result() for f in futures]

    # ------------------------------------------------------------------ internals
    def _pick(self) -> str:
        with self._lock:
            now = time.monotonic()
            healthy = [u for u in self.base_urls if self._down_until[u] <= now] or self.base_urls
            url = min(healthy, key=lambda u: self._busy[u])
            self._busy[url] += 1
            return url

    def _set_aside(self, url: str) -> None:
        with self._lock:
            self._down_until[url] = time.monotonic() + self.cooldown

    def _body(self, request: Request) -> tuple[bytes, bool]:
        """The JSON body of a request, and whether it asks for log-probabilities."""
        body: dict[str, Any] = {
            "model": self.model, "messages": [m.as_dict() for m in request.messages],
            "max_tokens": request.max_tokens, "temperature": request.temperature, "top_p": request.top_p,
            "seed": int(request.seed) & 0x7FFFFFFF,
        }
        if self.logprobs and (request.logprobs or request.token_logprobs):
            body["logprobs"] = True
            if request.logprobs:
                body["top_logprobs"] = self.top_logprobs
        text = json.dumps(body, ensure_ascii=False)
        try:
            encoded = text.encode()
        except UnicodeEncodeError:  # lone surrogates (from a model's earlier output): sent as U+FFFD
            encoded = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace").encode()
        return encoded, "logprobs" in body

    def _one(self, request: Request) -> Completion:
        body, asked_logprobs = self._body(request)
        deadline = time.monotonic() + self.deadline
        failure = ""
        url = self.base_urls[0]
        for attempt in range(self.max_retries + 1):
            url = self._pick()
            self._deadlines.at = deadline
            try:
                return self._post(url, body, request, asked_logprobs)
            except _Retryable as error:
                failure = str(error)
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as error:
                failure = f"connection failed ({type(error).__name__}: {error})"
                self._set_aside(url)
            except httpx.TimeoutException as error:
                if time.monotonic() >= deadline - 0.05:  # the read was cut short by the deadline
                    self._set_aside(url)
                    raise BackendError(
                        f"{url}: no complete answer within deadline={self.deadline:g} s (attempt {attempt + 1}; the "
                        f"server kept the connection open but each read stayed under timeout={self.timeout:g} s). "
                        f"Check that replica's load and health, add replicas, or raise deadline= for long generations."
                    ) from None
                failure = f"timed out after {self.timeout:g} s ({type(error).__name__})"
            except httpx.RequestError as error:  # e.g. a body that does not decode (bad content-encoding)
                failure = f"transport error ({type(error).__name__}: {error})"
            finally:
                self._deadlines.at = None
                with self._lock:
                    self._busy[url] -= 1
            self.retries += 1
            if attempt < self.max_retries:
                wait = min(8.0, self.backoff * 2**attempt)
                if time.monotonic() + wait >= deadline:
                    raise BackendError(
                        f"{url}: {failure}; deadline={self.deadline:g} s leaves no time for attempt {attempt + 2}. "
                        f"Check that the server at {url} is running and serves model {self.model!r} "
                        "(or add replicas / raise deadline=).")
                time.sleep(wait)
        raise BackendError(
            f"{url}: {failure} after {self.max_retries + 1} attempts. Check that the server at {url} is running, "
            f"speaks the OpenAI chat-completions API and serves model {self.model!r} "
            "(or add replicas / raise max_retries and timeout)."
        )

    def _post(self, url: str, body: bytes, request: Request, asked_logprobs: bool) -> Completion:
        assert self._client is not None
        response = self._client.post(f"{url}/chat/completions", content=body,
                                     headers={"content-type": "application/json"})
        status = response.status_code
        if status >= 400 and asked_logprobs and _LOGPROBS_REFUSED.search(response.text):
            raise BackendError(
                f"{url}: the server cannot return the log-probabilities this request asked for (HTTP {status}: "
                f"{self._snippet(response.text)}). Start it with logprobs enabled (llama.cpp: --logits_all true; "
                f"vLLM: --max-logprobs {self.top_logprobs} or more), or choose another confidence source: "
                "parallel_env(..., confidence='critic_text') uses the critic's verbalized confidence "
                "(or OpenAICompatibleBackend(..., logprobs=False) for this backend only)."
            )
        if status == 429 or status >= 500:
            raise _Retryable(f"HTTP {status}: {self._snippet(response.text)}")
        if status >= 400:
            raise BackendError(
                f"{url}: HTTP {status} for model {self.model!r}: {self._snippet(response.text)}. "
                f"Check the model name, the URL (it should end in /v1) and the key in ${self.api_key_env}."
            )
        try:
            data = response.json()
        except (ValueError, RecursionError):
            raise _Retryable(f"malformed response (not JSON): {self._snippet(response.text)}") from None
        return self._completion(data, request, asked_logprobs, response.text)

    def _completion(self, data: Any, request: Request, asked_logprobs: bool, raw: str) -> Completion:
        """The Completion in a parsed reply; raises _Retryable when the reply is not a chat completion."""
        choices = data.get("choices") if isinstance(data, dict) else None
        choice = choices[0] if isinstance(choices, list) and choices else None
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            raise _Retryable(f"malformed response (not an OpenAI chat completion): {self._snippet(raw)}")
        text = _content_text(message.get("content"))
        if text is None:
            raise _Retryable(f"malformed response (message content is a {type(message.get('content')).__name__}, "
                             f"not text): {self._snippet(raw)}")
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        prompt = _token_count(usage.get("prompt_tokens")) or sum(estimate_tokens(m.content) for m in request.messages)
        completion = _token_count(usage.get("completion_tokens"))
        if completion is None:
            completion = estimate_tokens(text) if text else 0
        finish, logprobs = choice.get("finish_reason"), choice.get("logprobs")  # type: ignore[union-attr]
        return Completion(
            text=text, prompt_tokens=prompt, completion_tokens=completion,
            top_logprobs=_first_token_logprobs(logprobs) if asked_logprobs and request.logprobs else None,
            finish_reason=finish if isinstance(finish, str) and finish else "stop",
            token_logprobs=_every_token_logprobs(logprobs) if asked_logprobs and request.token_logprobs else None,
        )

    def _snippet(self, text: str) -> str:
        key = os.environ.get(self.api_key_env)
        text = text[:200].replace("\n", " ")
        return text.replace(key, "***") if key else text


def _content_text(content: Any) -> str | None:
    """A message's text: a string, null (""), or a list of text parts joined; None when it is none of these."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    return None


def _token_count(value: Any) -> int | None:
    """A usage count as a non-negative int, or None when it is missing or unusable."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return int(value) if 0 <= value <= _MAX_TOKEN_COUNT else None


def _logprob(value: Any) -> float | None:
    """A finite log-probability (<= 0, tiny positive rounding clipped), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:  # an int beyond float range
        return None
    if not math.isfinite(value) or value > 1e-6:
        return None
    return min(value, 0.0)


def _first_token_logprobs(logprobs: Any) -> dict[str, float] | None:
    """{token: logprob} of the first generated token (chat or legacy format); None when unusable."""
    if not isinstance(logprobs, dict):
        return None
    pairs: list[tuple[Any, Any]] = []
    content, legacy = logprobs.get("content"), logprobs.get("top_logprobs")
    if isinstance(content, list) and content:
        first = content[0].get("top_logprobs") if isinstance(content[0], dict) else None
        if isinstance(first, list):
            pairs = [(item.get("token"), item.get("logprob")) for item in first if isinstance(item, dict)]
    elif isinstance(legacy, list) and legacy and isinstance(legacy[0], dict):
        pairs = list(legacy[0].items())
    result: dict[str, float] = {}
    for token, raw in pairs:
        value = _logprob(raw)
        if isinstance(token, str) and value is not None:
            if token in result:  # the same text from two token ids: P adds up
                high, low = max(result[token], value), min(result[token], value)
                value = high + math.log1p(math.exp(low - high))
            result[token] = value
    return result or None


def _every_token_logprobs(logprobs: Any) -> tuple[tuple[str, float], ...] | None:
    """(token, logprob) of every generated token (chat format); None when unusable."""
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list) or not content:
        return None
    pairs = []
    for item in content:
        value = _logprob(item.get("logprob")) if isinstance(item, dict) else None
        if value is None or not isinstance(item.get("token"), str):
            return None  # a gap would misalign the tokens with the text
        pairs.append((item["token"], value))
    return tuple(pairs)


class _Deadlines(threading.local):
    """The monotonic deadline of the request the current thread is sending (None: no deadline)."""

    at: float | None = None

    def bound(self, timeout: float | None) -> float | None:
        """``timeout`` shortened to the time left; raises a read timeout when none is left."""
        if self.at is None:
            return timeout
        left = self.at - time.monotonic()
        if left <= 0:
            raise httpcore.ReadTimeout("the request's deadline has passed")
        return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read, write and TLS handshake waits at most until the request's deadline."""

    def __init__(self, inner: httpcore.NetworkStream, deadlines: _Deadlines):
        self._inner, self._deadlines = inner, deadlines

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._deadlines.bound(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, self._deadlines.bound(timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, self._deadlines.bound(timeout)),
                               self._deadlines)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineNetwork(httpcore.NetworkBackend):
    def __init__(self, inner: httpcore.NetworkBackend, deadlines: _Deadlines):
        self._inner, self._deadlines = inner, deadlines

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        stream = self._inner.connect_tcp(host, port, self._deadlines.bound(timeout), local_address, socket_options)
        return _DeadlineStream(stream, self._deadlines)

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        stream = self._inner.connect_unix_socket(path, self._deadlines.bound(timeout), socket_options)
        return _DeadlineStream(stream, self._deadlines)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _enforce_deadlines(client: httpx.Client, deadlines: _Deadlines) -> None:
    """Wraps the network layer of the client's connection pools so that every socket wait ends by the deadline.

    httpx has no total-time limit (its timeouts bound each read), and only the network layer sees
    every read, headers included; httpx exposes no setting for it, hence the private attributes.
    """
    wrapped = 0
    for transport in [client._transport, *client._mounts.values()]:
        pool = getattr(transport, "_pool", None)
        if pool is not None and hasattr(pool, "_network_backend"):
            pool._network_backend = _DeadlineNetwork(pool._network_backend, deadlines)
            wrapped += 1
    if not wrapped:
        warnings.warn(f"httpx {httpx.__version__} has no connection pool where expected: OpenAICompatibleBackend's "
                      "deadline= is not enforced (timeout= still bounds each read)", RuntimeWarning, stacklevel=3)
