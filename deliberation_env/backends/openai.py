"""Any OpenAI-compatible chat-completions server (vLLM, SGLang, llama.cpp, Ollama, TGI, hosted).

Requests run on an asyncio event loop that the backend owns (a daemon thread) over one
``httpx.AsyncClient``: ``generate()`` stays synchronous for the env, ``agenerate()`` serves
async callers. At most ``concurrency`` requests are in flight in total and ``per_replica`` on any
one replica. Routing: the requests of one episode (``Request.episode``) go to one replica while
it is healthy, so its prefix cache serves the episode's later rounds; the replica is the first
healthy one in the episode's rendezvous-hash order of ``base_url`` (stable, and a replica that
is set aside spreads its episodes evenly over the others; they return once it is back).
Requests without an episode, or with ``routing="least_busy"``, go to the least busy healthy
replica. A replica that refuses connections, drops them or answers slower than ``timeout`` is
set aside for ``cooldown`` seconds (one that answers 429 with Retry-After: for that long), and
the request fails over. Connection errors, timeouts, 429, 5xx and malformed replies are retried
with exponential backoff (at least the server's Retry-After) up to ``max_retries``; then
``BackendError`` names the URL, the failure and what to do. Other 4xx (a wrong model name, a
bad key) fail at once, and so does a server that cannot return the log-probabilities a request
asked for. ``timeout`` bounds each network read; ``deadline`` bounds a whole request from its
first attempt (every attempt and wait), by default ``DEADLINE_FACTOR`` (5) x ``timeout``, so a
server that sends a byte now and then cannot hold a request for longer than that: the request
fails at once with a ``BackendError`` naming the URL, the limit and ``deadline=``. Each request
carries an ``X-Request-Id`` (the same on every attempt) and, with an episode, an ``X-Episode-Id``
header. Replies are validated: unusable token counts are estimated from the text, unusable
log-probabilities become None, and a reply without a text content is malformed. The API key is
read from the environment variable ``api_key_env`` and never appears in reprs, errors,
``identity()`` or caches.

``agent_models``: agent i's requests name ``agent_models[i]`` (e.g. its LoRA adapter's name on vLLM). ``token_ids``:
requests for every token's log-probability also ask vLLM for the ids (``return_tokens_as_token_ids``), returned as
``Completion.token_ids`` / ``token_id_logprobs`` (what a trainer needs to score exactly the sampled tokens).
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import json
import math
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import httpx

from deliberation_env.backends.base import estimate_tokens
from deliberation_env.backends.openai_reply import (
    content_text,
    every_token_logprobs,
    first_token_logprobs,
    token_count,
    vllm_token_ids,
)
from deliberation_env.requests import Completion, Request
from deliberation_env.settings import settings_attributes, settings_from

_LOGPROBS_REFUSED = re.compile(r"logprob|logits_all", re.IGNORECASE)
_LANE = 8  # connections per httpx pool: httpcore scans every connection of a pool for every queued request
ROUTINGS = ("sticky", "least_busy")
DEADLINE_FACTOR = 5
"""The default ``deadline`` is this many times ``timeout``: time for every attempt of the default ``max_retries=4``
to wait one full ``timeout`` (600 s with the default ``timeout=120``)."""


class BackendError(RuntimeError):
    """A request that could not be answered (after retries where retrying made sense)."""


class _Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class _DeadlinePassed(Exception):
    pass


@dataclass
class OpenAISettings:
    """How an ``OpenAICompatibleBackend`` talks to its servers: every field is a keyword of its constructor."""

    api_key_env: str = "OPENAI_API_KEY"
    """The environment variable the API key is read from (never shown in reprs, errors, identities or caches)."""
    timeout: float = 120.0
    """Seconds any one network wait (connect, read, write) may take; a server that drips its reply a byte at a time
    never trips it."""
    max_retries: int = 4
    """Retries of a failed attempt (connection errors, timeouts, 429, 5xx, malformed replies), with backoff."""
    concurrency: int = 16
    """Requests in flight at once, in total."""
    backoff: float = 0.5
    """Seconds before the first retry, doubled at each one (at least the server's Retry-After)."""
    cooldown: float = 30.0
    """Seconds a failing replica is set aside."""
    top_logprobs: int = 20
    """First-token log-probabilities a critic request asks for."""
    deadline: float | None = None
    """Seconds one request may take from its first attempt on, attempts and backoff waits included (time queued for a
    free slot before that does not count); past it the request fails at once with a ``BackendError`` naming the URL
    and the limit. None: ``DEADLINE_FACTOR`` x ``timeout`` (5 x 120 = 600 s with the defaults), filled in here."""
    logprobs: bool = True
    """False: never ask the server for log-probabilities (servers that cannot give them; critic confidence then comes
    from the critic's text)."""
    per_replica: int | None = None
    """Requests in flight on one replica at once. None: ``concurrency``, filled in here."""
    routing: str = "sticky"
    """``sticky``: one replica per episode (its prefix cache serves the later rounds); ``least_busy``."""
    agent_models: Sequence[str] | None = None
    """Agent i's requests name ``agent_models[i]`` (e.g. its LoRA adapter on vLLM); None: ``model`` for all."""
    token_ids: bool = False
    """Requests for every token's log-probability also ask vLLM for the token ids (``Completion.token_ids``)."""
    deadline_is_default: bool = field(init=False, default=False)
    """Whether ``deadline`` was left to its default (error messages say how to change it)."""

    def __post_init__(self) -> None:
        for name, value in (("timeout", self.timeout), ("deadline", self.deadline)):
            if name == "deadline" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}"
                                 + (f" (or None: {DEADLINE_FACTOR} x timeout)" if name == "deadline" else ""))
        for name, value in (("concurrency", self.concurrency), ("per_replica", self.per_replica)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive int (requests in flight at once), got {value!r}")
        if self.routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {ROUTINGS}, got {self.routing!r}")
        models = self.agent_models
        if models is not None and (isinstance(models, str) or not models
                                   or not all(isinstance(m, str) and m for m in models)):
            raise ValueError(f"agent_models must be a list of model names, one per agent, got {models!r}")
        self.agent_models = list(models) if models is not None else None
        self.deadline_is_default = self.deadline is None
        self.deadline = float(DEADLINE_FACTOR * self.timeout if self.deadline is None else self.deadline)
        self.per_replica = self.per_replica or self.concurrency

    @property
    def request_deadline(self) -> float:
        """``deadline``, in seconds."""
        return float(self.deadline if self.deadline is not None else DEADLINE_FACTOR * self.timeout)

    @property
    def replica_limit(self) -> int:
        """``per_replica``: requests in flight on one replica at once."""
        return self.per_replica or self.concurrency


@settings_attributes(OpenAISettings)
class OpenAICompatibleBackend:
    """Chat completions over HTTP (see the module docstring): ``base_url`` (one or several replicas' URLs ending in
    /v1), ``model`` (the served name), and ``settings=`` (an ``OpenAISettings``) or its fields as keywords
    (``concurrency=32``, ``timeout=30``, ...); ``backend.timeout`` and the like read and write ``backend.settings``."""

    def __init__(self, base_url: str | Sequence[str], model: str, settings: OpenAISettings | None = None,
                 **keywords: Any):
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls:
            raise ValueError("base_url needs at least one URL")
        for url in urls:
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise ValueError(f"base_url {url!r} must start with http:// or https:// (e.g. http://127.0.0.1:8000/v1)")
        self.settings = settings_from(OpenAISettings, settings, keywords, "OpenAICompatibleBackend")
        self.base_urls = list(dict.fromkeys(u.rstrip("/") for u in urls))
        self.model = model
        self._busy = dict.fromkeys(self.base_urls, 0)
        self._down_until = dict.fromkeys(self.base_urls, 0.0)
        self._lock = threading.Lock()  # start() and close() from any thread
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lanes: dict[str, list[list[Any]]] | None = None  # per replica: [client, requests in flight]
        self._total: asyncio.Semaphore | None = None
        self._slots: dict[str, asyncio.Semaphore] = {}
        self.retries = 0
        self.failovers = 0
        """Attempts sent to another replica than the one before (a replica was set aside)."""

    def identity(self) -> str:
        # logprobs=False changes what critic completions hold, so it is part of the identity (only then,
        # so that existing cache keys stay as they were).
        # agent_models and token_ids likewise only when set
        return (f"openai-compatible:model={self.model},top_logprobs={self.settings.top_logprobs}"
                + ("" if self.settings.logprobs else ",logprobs=off")
                + (f",agent_models={'|'.join(self.settings.agent_models)}" if self.settings.agent_models else "")
                + (",token_ids" if self.settings.token_ids else ""))

    def __repr__(self) -> str:
        return f"OpenAICompatibleBackend(base_url={self.base_urls!r}, model={self.model!r}, api_key_env={self.settings.api_key_env!r})"

    def close(self) -> None:
        """Closes the connections and stops the backend's event loop (a later call starts them again)."""
        with self._lock:
            loop, lanes, self._loop, self._lanes = self._loop, self._lanes, None, None
        if loop is None:
            return
        if lanes is not None:
            clients = [lane[0] for replica in lanes.values() for lane in replica]
            asyncio.run_coroutine_threadsafe(_close_all(clients), loop).result()
        loop.call_soon_threadsafe(loop.stop)

    def __del__(self) -> None:
        """Stops the event loop of a backend dropped without ``close()``. Nothing to do at interpreter exit, where
        the loop's daemon thread ends with the process and asyncio's modules may already be torn down (stopping the
        loop then raised in ``__del__``), nor for an object whose ``__init__`` failed (it has no loop)."""
        if sys is None or sys.is_finalizing():
            return
        loop = getattr(self, "_loop", None)
        try:
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(loop.stop)
        except (AttributeError, RuntimeError, TypeError):  # closed meanwhile, or modules torn down by a late gc
            pass

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        """Answers ``requests`` in order (concurrently on the backend's event loop); blocks until all are done."""
        if not requests:
            return []
        return asyncio.run_coroutine_threadsafe(self._gather(list(requests)), self._start()).result()

    async def agenerate(self, requests: Sequence[Request]) -> list[Completion]:
        """``generate`` for async callers: awaits the answers without blocking the caller's event loop."""
        loop = self._start()
        if asyncio.get_running_loop() is loop:
            return await self._gather(list(requests))
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._gather(list(requests)), loop))

    # ------------------------------------------------------------------ internals
    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=_run_loop, args=(loop,), name="openai-backend", daemon=True).start()
                asyncio.run_coroutine_threadsafe(self._open(), loop).result()
                self._loop = loop
            return self._loop

    async def _open(self) -> None:
        """Clients and semaphores, made on the loop that uses them. Each replica's connections are spread over
        small pools ("lanes" of 8): one large httpx pool costs O(requests x connections) per event."""
        key = os.environ.get(self.settings.api_key_env, "")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        limits = httpx.Limits(max_connections=_LANE, max_keepalive_connections=_LANE)
        lanes = -(-min(self.settings.replica_limit, self.settings.concurrency) // _LANE)
        self._lanes = {url: [[httpx.AsyncClient(headers=headers, timeout=self.settings.timeout, limits=limits), 0]
                             for _ in range(lanes)] for url in self.base_urls}
        self._total = asyncio.Semaphore(self.settings.concurrency)
        self._slots = {url: asyncio.Semaphore(self.settings.replica_limit) for url in self.base_urls}

    async def _gather(self, requests: list[Request]) -> list[Completion]:
        results = await asyncio.gather(*(self._one(r) for r in requests), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:  # keep what the other requests got, for a cache to store (Backend's docstring)
            error = failed[0]
            error.completed = {i: r for i, r in enumerate(results) if not isinstance(r, BaseException)}  # type: ignore[attr-defined]
            raise error
        return cast("list[Completion]", results)  # no exceptions among them

    def _route(self, episode: int | None) -> str:
        """The replica for the next attempt (see the module docstring)."""
        now = time.monotonic()
        if episode is None or self.settings.routing == "least_busy" or len(self.base_urls) == 1:
            candidates = sorted(self.base_urls, key=lambda u: self._busy[u])  # stable: ties go to the first listed
        else:
            candidates = sorted(self.base_urls, key=lambda u: _rank(episode, u))
        healthy = [u for u in candidates if self._down_until[u] <= now]
        return healthy[0] if healthy else min(candidates, key=lambda u: self._down_until[u])

    def _set_aside(self, url: str, seconds: float) -> None:
        self._down_until[url] = max(self._down_until[url], time.monotonic() + seconds)

    def model_of(self, request: Request) -> str:
        """The model a request names: its agent's entry of ``agent_models``, else ``model``."""
        if self.settings.agent_models is None:
            return self.model
        if not 0 <= request.agent < len(self.settings.agent_models):
            raise BackendError(f"request of agent {request.agent}, but agent_models names {len(self.settings.agent_models)} "
                               f"agents ({self.settings.agent_models})")
        return self.settings.agent_models[request.agent]

    def _body(self, request: Request) -> tuple[bytes, bool]:
        """The JSON body of a request, and whether it asks for log-probabilities."""
        body: dict[str, Any] = {
            "model": self.model_of(request), "messages": [m.as_dict() for m in request.messages],
            "max_tokens": request.max_tokens, "temperature": request.temperature, "top_p": request.top_p,
            "seed": int(request.seed) & 0x7FFFFFFF,
        }
        if self.settings.logprobs and (request.logprobs or request.token_logprobs):
            body["logprobs"] = True
            # always name top_logprobs, and at least 1: llama-cpp-python returns no log-probabilities at all
            # without it, and llama.cpp's server none with 0
            body["top_logprobs"] = self.settings.top_logprobs if request.logprobs else 1
            if self.settings.token_ids and request.token_logprobs:
                body["return_tokens_as_token_ids"] = True  # vLLM: tokens come back as "token_id:<id>"
        text = json.dumps(body, ensure_ascii=False)
        try:
            encoded = text.encode()
        except UnicodeEncodeError:  # lone surrogates (from a model's earlier output): sent as U+FFFD
            encoded = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace").encode()
        return encoded, "logprobs" in body

    async def _one(self, request: Request) -> Completion:
        body, asked_logprobs = self._body(request)
        headers = {"content-type": "application/json", "x-request-id": uuid.uuid4().hex}
        if request.episode is not None:
            headers["x-episode-id"] = str(request.episode)
        deadline: list[float] = []  # set when the first attempt gets its slots
        failure, url, previous = "", self.base_urls[0], None
        for attempt in range(self.settings.max_retries + 1):
            where, retry_after = [url], None
            try:
                attempt_ = self._attempt(where, body, headers, request, asked_logprobs, deadline)
                if deadline:
                    return await asyncio.wait_for(attempt_, max(0.0, deadline[0] - time.monotonic()))
                return await attempt_
            except _Retryable as error:
                failure, retry_after = str(error), error.retry_after
                if retry_after is not None:
                    self._set_aside(url, retry_after)
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as error:
                failure = f"connection failed ({type(error).__name__}: {error})"
                self._set_aside(url, self.settings.cooldown)
            except httpx.TimeoutException as error:
                failure = f"timed out after {self.settings.timeout:g} s ({type(error).__name__})"
                self._set_aside(url, self.settings.cooldown)  # too slow for now: its next requests go elsewhere
            except (_DeadlinePassed, asyncio.TimeoutError):
                self._set_aside(url, self.settings.cooldown)
                raise BackendError(
                    f"{url}: no complete answer within deadline={self._deadline_text()} (attempt {attempt + 1}; the "
                    f"server had not finished its reply, e.g. it sends a byte now and then, which never trips "
                    f"timeout={self.settings.timeout:g} s). Check that replica's load and health, add replicas, or raise "
                    "deadline= (OpenAICompatibleBackend(..., deadline=SECONDS)) for long generations."
                ) from None
            except httpx.RequestError as error:  # e.g. a body that does not decode (bad content-encoding)
                failure = f"transport error ({type(error).__name__}: {error})"
            finally:
                url = where[0]
                if previous is not None and url != previous:
                    self.failovers += 1
                previous = url
            self.retries += 1
            if attempt < self.settings.max_retries:
                wait = max(min(8.0, self.settings.backoff * 2**attempt), retry_after or 0.0)
                if retry_after is not None and self._route(request.episode) != url:
                    wait = min(8.0, self.settings.backoff * 2**attempt)  # another replica takes it; no need to wait out this one
                if time.monotonic() + wait >= (deadline[0] if deadline else math.inf):
                    asked = f" (the server asked to retry after {retry_after:g} s)" if retry_after else ""
                    raise BackendError(
                        f"{url}: {failure}; deadline={self._deadline_text()} leaves no time for attempt {attempt + 2}"
                        f"{asked}. "
                        f"Check that the server at {url} is running and serves model {self.model!r} "
                        "(or add replicas / raise deadline=).")
                await asyncio.sleep(wait)
        raise BackendError(
            f"{url}: {failure} after {self.settings.max_retries + 1} attempts. Check that the server at {url} is running, "
            f"speaks the OpenAI chat-completions API and serves model {self.model!r} "
            "(or add replicas / raise max_retries and timeout)."
        )

    async def _attempt(self, where: list[str], body: bytes, headers: dict[str, str], request: Request,
                       asked_logprobs: bool, deadline: list[float]) -> Completion:
        """One POST once a slot on its replica and a slot in total are free; the replica goes in ``where``.

        Sticky: the episode's replica first, then a total slot (no total slot is held while waiting for a
        busy replica). Least busy: a total slot first, then the replica least busy at that moment."""
        assert self._total is not None
        if self.settings.routing == "sticky" and request.episode is not None and len(self.base_urls) > 1:
            where[0] = self._route(request.episode)
            async with self._slots[where[0]], self._total:
                return await self._send(where[0], body, headers, request, asked_logprobs, deadline)
        async with self._total:
            where[0] = self._route(None)
            async with self._slots[where[0]]:
                return await self._send(where[0], body, headers, request, asked_logprobs, deadline)

    async def _send(self, url: str, body: bytes, headers: dict[str, str], request: Request, asked_logprobs: bool,
                    deadline: list[float]) -> Completion:
        """The POST itself; the first attempt starts the request's deadline."""
        if not deadline:
            deadline.append(time.monotonic() + self.settings.request_deadline)
        left = deadline[0] - time.monotonic()
        if left <= 0:
            raise _DeadlinePassed
        self._busy[url] += 1
        try:
            return await asyncio.wait_for(self._post(url, body, headers, request, asked_logprobs), left)
        finally:
            self._busy[url] -= 1

    async def _post(self, url: str, body: bytes, headers: dict[str, str], request: Request,
                    asked_logprobs: bool) -> Completion:
        assert self._lanes is not None
        lane = min(self._lanes[url], key=lambda lane: lane[1])  # never full: the replica's semaphore bounds the sum
        lane[1] += 1
        try:
            response = await lane[0].post(f"{url}/chat/completions", content=body, headers=headers)
        finally:
            lane[1] -= 1
        status = response.status_code
        if status >= 400 and asked_logprobs and _LOGPROBS_REFUSED.search(response.text):
            raise BackendError(
                f"{url}: the server cannot return the log-probabilities this request asked for (HTTP {status}: "
                f"{self._snippet(response.text)}). Start it with logprobs enabled (llama.cpp: --logits_all true; "
                f"vLLM: --max-logprobs {self.settings.top_logprobs} or more), or choose another confidence source: "
                "parallel_env(..., confidence='critic_text') uses the critic's verbalized confidence "
                "(or OpenAICompatibleBackend(..., logprobs=False) for this backend only)."
            )
        if status == 429 or status >= 500:
            raise _Retryable(f"HTTP {status}: {self._snippet(response.text)}",
                             _retry_after(response.headers.get("retry-after")))
        if status >= 400:
            raise BackendError(
                f"{url}: HTTP {status} for model {self.model_of(request)!r}: {self._snippet(response.text)}. "
                f"Check the model name, the URL (it should end in /v1) and the key in ${self.settings.api_key_env}."
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
        if not isinstance(choice, dict) or not isinstance(message, dict):
            raise _Retryable(f"malformed response (not an OpenAI chat completion): {self._snippet(raw)}")
        text = content_text(message.get("content"))
        if text is None:
            raise _Retryable(f"malformed response (message content is a {type(message.get('content')).__name__}, "
                             f"not text): {self._snippet(raw)}")
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        prompt = token_count(usage.get("prompt_tokens")) or sum(estimate_tokens(m.content) for m in request.messages)
        completion = token_count(usage.get("completion_tokens"))
        if completion is None:
            completion = estimate_tokens(text) if text else 0
        finish, logprobs = choice.get("finish_reason"), choice.get("logprobs")
        every = every_token_logprobs(logprobs) if asked_logprobs and request.token_logprobs else None
        ids = vllm_token_ids(every) if self.settings.token_ids and every is not None else None
        return Completion(
            text=text, prompt_tokens=prompt, completion_tokens=completion,
            top_logprobs=first_token_logprobs(logprobs) if asked_logprobs and request.logprobs else None,
            finish_reason=finish if isinstance(finish, str) and finish else "stop",
            token_logprobs=None if ids is not None else every,  # "token_id:<id>" is no token text
            token_ids=ids,
            token_id_logprobs=tuple(value for _, value in every) if ids is not None and every is not None else None,
        )

    def _deadline_text(self) -> str:
        """``deadline`` for messages, with where it came from when it is the default."""
        rule = f" (the default: {DEADLINE_FACTOR} x timeout={self.settings.timeout:g} s)" if self.settings.deadline_is_default else ""
        return f"{self.settings.request_deadline:g} s{rule}"

    def _snippet(self, text: str) -> str:
        key = os.environ.get(self.settings.api_key_env)
        text = text[:200].replace("\n", " ")
        return text.replace(key, "***") if key else text



def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()


async def _close_all(clients: list[httpx.AsyncClient]) -> None:
    for client in clients:
        await client.aclose()


def _rank(episode: int, url: str) -> bytes:
    """Rendezvous hashing: an episode prefers the replicas in ascending order of this key."""
    return hashlib.blake2b(f"{episode}|{url}".encode(), digest_size=8).digest()


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (a number of seconds or an HTTP date); None when absent or unusable."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    return min(max(seconds, 0.0), 3600.0) if math.isfinite(seconds) else None
