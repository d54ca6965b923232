"""A loopback OpenAI-compatible chat server for tests and benches (127.0.0.1, threaded, keep-alive).

    server = LoopbackServer(latency=0.2)          # every POST answered after 200 ms
    backend = OpenAICompatibleBackend(server.url, model="m")
    server.inject(429, count=3, retry_after=1)    # the next 3 POSTs answer 429 with Retry-After: 1
    server.die(); server.revive()                 # listener and open connections closed; same port again
    server.close()

It counts what a fleet client must get right: 200 answers per ``X-Request-Id`` (a duplicate shows
as a count of 2), requests in flight (now and peak, also summed over a group of replicas with a
shared ``Inflight``), and prefix reuse per episode (``X-Episode-Id``): for each request, the longest
common prefix (in characters of the rendered messages) with the previous request of the same episode
on this server, as a prefix cache would reuse it. ``respond(handler, server)`` replaces the default
answer for servers that misbehave in other ways (tests).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_ANSWER = "The answer is 4. Confidence: 80%"


def chat_reply(content: str, prompt_tokens: int = 40, completion_tokens: int = 8) -> dict:
    """An OpenAI chat-completion reply holding ``content``."""
    return {"choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}}


def send_json(handler: BaseHTTPRequestHandler, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
    """Answers ``handler``'s request with ``payload`` (a str is sent as it is, anything else as JSON)."""
    body = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
    handler.send_response(status)
    handler.send_header("content-type", "application/json")
    handler.send_header("content-length", str(len(body)))
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(body)


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (binary search over slice comparisons)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


class Inflight:
    """Requests in flight now and at the peak (thread-safe); share one among replicas for a fleet total."""

    def __init__(self) -> None:
        self.now = self.peak = 0
        self._lock = threading.Lock()

    def enter(self) -> None:
        with self._lock:
            self.now += 1
            self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        with self._lock:
            self.now -= 1


@dataclass
class EpisodePrefix:
    """Prompt characters one episode sent to one server, and how many of them a prefix cache would reuse."""

    requests: int = 0
    chars: int = 0
    reused: int = 0
    last: str = field(default="", repr=False)


@dataclass
class _Fault:
    status: int
    retry_after: float | None
    body: Any


class LoopbackHTTPServer(ThreadingHTTPServer):
    """The HTTP server of the loopback test servers: a thread per request, a large backlog for bursts."""

    daemon_threads = True
    request_queue_size = 1024  # the default backlog of 5 drops the SYNs of a burst of new connections (1 s retries)


class LoopbackServer:
    """See the module docstring. ``reply(body) -> str`` gives the answer text (default a fixed answer);
    ``capacity`` is how many requests it works on at once (others queue, as on a busy GPU server)."""

    def __init__(self, respond: Callable[[BaseHTTPRequestHandler, LoopbackServer], None] | None = None, *,
                 latency: float = 0.0, capacity: int | None = None, reply: Callable[[dict], str] | None = None,
                 total: Inflight | None = None, keep_bodies: bool = True):
        self.respond, self.latency, self.reply, self.keep_bodies = respond, latency, reply, keep_bodies
        self.stopped = threading.Event()  # set by die() and close(): wakes every waiting handler
        self.bodies: list[dict] = []
        self.posts = 0
        self.answered: Counter[str] = Counter()  # X-Request-Id -> 200 answers sent
        self.episodes: dict[str, EpisodePrefix] = {}
        self.inflight, self.total = Inflight(), total
        self._slots = threading.BoundedSemaphore(capacity) if capacity else None
        self._faults: list[_Fault] = []
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._port = 0
        self._start()

    # ------------------------------------------------------------------ control
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}/v1"

    def inject(self, status: int, count: int = 1, retry_after: float | None = None, body: Any = None) -> None:
        """The next ``count`` POSTs answer HTTP ``status`` at once (with ``Retry-After`` when given)."""
        with self._lock:
            self._faults += [_Fault(status, retry_after, body or {"error": f"injected {status}"})] * count

    def die(self) -> None:
        """Stops as a crashed server: the port refuses connections, open ones are cut, nothing in flight is answered."""
        self.stopped.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._lock:
            connections, self._connections = list(self._connections), set()
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def revive(self) -> None:
        """Serves again on the same port (after ``die()``)."""
        self.stopped.clear()
        self._start(self._port)

    def close(self) -> None:
        if not self.stopped.is_set():
            self.die()

    def prefix_totals(self) -> tuple[int, int]:
        """(prompt characters, reused characters) over every episode this server saw."""
        with self._lock:
            return sum(e.chars for e in self.episodes.values()), sum(e.reused for e in self.episodes.values())

    # ------------------------------------------------------------------ serving
    def _start(self, port: int = 0) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a real server

            def setup(self) -> None:
                super().setup()
                with outer._lock:
                    outer._connections.add(self.connection)

            def finish(self) -> None:
                with outer._lock:
                    outer._connections.discard(self.connection)
                with contextlib.suppress(OSError):
                    super().finish()

            def do_POST(self) -> None:  # noqa: N802
                outer._post(self)

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = LoopbackHTTPServer(("127.0.0.1", port), Handler)
        self._port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def _post(self, handler: BaseHTTPRequestHandler) -> None:
        body = json.loads(handler.rfile.read(int(handler.headers["content-length"])))
        with self._lock:
            self.posts += 1
            if self.keep_bodies:
                self.bodies.append(body)
            fault = self._faults.pop(0) if self._faults else None
        if self.respond is not None:
            self.respond(handler, self)
            return
        meters = [self.inflight] + ([self.total] if self.total is not None else [])
        for meter in meters:
            meter.enter()
        try:
            response = self._answer(handler, body, fault)
        finally:
            # Out of flight before the answer is written: a client that reads it may send its next request at once,
            # which must not be counted beside this one.
            for meter in meters:
                meter.leave()
        if response is not None:
            send_json(handler, *response)

    def _answer(self, handler: BaseHTTPRequestHandler, body: dict, fault: _Fault | None) -> tuple | None:
        """(status, body, headers) of the reply, or None when the replica died meanwhile (no answer)."""
        if fault is not None:
            return fault.status, fault.body, {"retry-after": f"{fault.retry_after:g}"} if fault.retry_after is not None else {}
        if self._slots is not None:
            self._slots.acquire()
        try:
            if self.stopped.wait(self.latency) if self.latency > 0 else self.stopped.is_set():
                handler.close_connection = True
                return None
            self._account(handler, body)
        finally:
            if self._slots is not None:
                self._slots.release()
        content = self.reply(body) if self.reply is not None else DEFAULT_ANSWER
        return 200, chat_reply(content), {}

    def _account(self, handler: BaseHTTPRequestHandler, body: dict) -> None:
        request_id, episode = handler.headers.get("x-request-id"), handler.headers.get("x-episode-id")
        text = "".join(f"<{m.get('role')}>{m.get('content')}" for m in body.get("messages", []))
        with self._lock:
            if request_id is not None:
                self.answered[request_id] += 1
            if episode is not None:
                stats = self.episodes.setdefault(episode, EpisodePrefix())
                stats.requests += 1
                stats.chars += len(text)
                stats.reused += common_prefix(stats.last, text)
                stats.last = text
