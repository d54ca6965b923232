"""Any OpenAI-compatible chat-completions server (vLLM, SGLang, llama.cpp, Ollama, TGI, hosted).

Requests run concurrently on a thread pool (``concurrency``) over one ``httpx.Client``. Each
request goes to the least busy healthy replica among ``base_url``; a replica that refuses
connections is set aside for ``cooldown`` seconds and the request fails over to another.
Connection errors, timeouts, 429 and 5xx are retried with exponential backoff up to
``max_retries``; then ``BackendError`` names the URL, the failure and what to do. Other 4xx
(a wrong model name, a bad key) fail at once. The API key is read from the environment
variable ``api_key_env`` and never appears in reprs, errors, ``identity()`` or caches.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from deliberation_env.backends.base import Completion, Request, estimate_tokens


class BackendError(RuntimeError):
    """A request that could not be answered (after retries where retrying made sense)."""


class _Retryable(Exception):
    pass


class OpenAICompatibleBackend:
    """Chat completions over HTTP (see the module docstring)."""

    def __init__(self, base_url: str | Sequence[str], model: str, api_key_env: str = "OPENAI_API_KEY",
                 timeout: float = 120.0, max_retries: int = 4, concurrency: int = 16, backoff: float = 0.5,
                 cooldown: float = 30.0, top_logprobs: int = 20):
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls:
            raise ValueError("base_url needs at least one URL")
        self.base_urls = [u.rstrip("/") for u in urls]
        self.model, self.api_key_env, self.timeout = model, api_key_env, timeout
        self.max_retries, self.concurrency, self.backoff = max_retries, concurrency, backoff
        self.cooldown, self.top_logprobs = cooldown, top_logprobs
        self._busy = dict.fromkeys(self.base_urls, 0)
        self._down_until = dict.fromkeys(self.base_urls, 0.0)
        self._lock = threading.Lock()
        self._client: httpx.Client | None = None
        self._pool: ThreadPoolExecutor | None = None
        self.retries = 0

    def identity(self) -> str:
        return f"openai-compatible:model={self.model},top_logprobs={self.top_logprobs}"

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
            self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="openai-backend")
        return list(self._pool.map(self._one, requests))

    # ------------------------------------------------------------------ internals
    def _pick(self) -> str:
        with self._lock:
            now = time.monotonic()
            healthy = [u for u in self.base_urls if self._down_until[u] <= now] or self.base_urls
            url = min(healthy, key=lambda u: self._busy[u])
            self._busy[url] += 1
            return url

    def _one(self, request: Request) -> Completion:
        body: dict[str, Any] = {
            "model": self.model, "messages": [m.as_dict() for m in request.messages],
            "max_tokens": request.max_tokens, "temperature": request.temperature, "top_p": request.top_p,
            "seed": int(request.seed) & 0x7FFFFFFF,
        }
        if request.logprobs:
            body.update(logprobs=True, top_logprobs=self.top_logprobs)
        failure = ""
        url = self.base_urls[0]
        for attempt in range(self.max_retries + 1):
            url = self._pick()
            try:
                return self._post(url, body, request)
            except _Retryable as error:
                failure = str(error)
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as error:
                failure = f"connection failed ({type(error).__name__}: {error})"
                with self._lock:
                    self._down_until[url] = time.monotonic() + self.cooldown
            except httpx.TimeoutException as error:
                failure = f"timed out after {self.timeout:g} s ({type(error).__name__})"
            finally:
                with self._lock:
                    self._busy[url] -= 1
            self.retries += 1
            if attempt < self.max_retries:
                time.sleep(min(8.0, self.backoff * 2**attempt))
        raise BackendError(
            f"{url}: {failure} after {self.max_retries + 1} attempts. Check that the server at {url} is running "
            f"and serves model {self.model!r} (or add replicas / raise max_retries and timeout)."
        )

    def _post(self, url: str, body: dict[str, Any], request: Request) -> Completion:
        assert self._client is not None
        response = self._client.post(f"{url}/chat/completions", json=body)
        if response.status_code == 429 or response.status_code >= 500:
            raise _Retryable(f"HTTP {response.status_code}: {self._snippet(response.text)}")
        if response.status_code >= 400:
            raise BackendError(
                f"{url}: HTTP {response.status_code} for model {self.model!r}: {self._snippet(response.text)}. "
                f"Check the model name, the URL (it should end in /v1) and the key in ${self.api_key_env}."
            )
        try:
            data = response.json()
            choice = data["choices"][0]
            text = (choice.get("message") or {}).get("content") or ""
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise _Retryable(f"malformed response (not an OpenAI chat completion): {self._snippet(response.text)}") from None
        usage = data.get("usage") or {}
        prompt = usage.get("prompt_tokens") or sum(estimate_tokens(m.content) for m in request.messages)
        completion = usage.get("completion_tokens")
        return Completion(
            text=text, prompt_tokens=int(prompt),
            completion_tokens=int(completion if completion is not None else (estimate_tokens(text) if text else 0)),
            top_logprobs=_first_token_logprobs(choice.get("logprobs")) if request.logprobs else None,
            finish_reason=str(choice.get("finish_reason") or "stop"),
        )

    def _snippet(self, text: str) -> str:
        key = os.environ.get(self.api_key_env)
        text = text[:200].replace("\n", " ")
        return text.replace(key, "***") if key else text


def _first_token_logprobs(logprobs: Any) -> dict[str, float] | None:
    """{token: logprob} of the first generated token (chat or legacy completions format)."""
    if not isinstance(logprobs, dict):
        return None
    result: dict[str, float] = {}
    if logprobs.get("content"):
        for item in logprobs["content"][0].get("top_logprobs") or []:
            token, value = item.get("token"), item.get("logprob")
            if isinstance(token, str) and isinstance(value, (int, float)):
                result[token] = math.log(math.exp(result[token]) + math.exp(value)) if token in result else float(value)
    elif logprobs.get("top_logprobs"):
        result = {str(k): float(v) for k, v in (logprobs["top_logprobs"][0] or {}).items()}
    return result or None
