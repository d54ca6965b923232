"""A SQLite (WAL) completion cache around any backend.

The key of a request is a SHA-256 of the inner backend's ``identity()``, the messages, the
sampling parameters (``Request.sampling_params()``) and the request seed; never
``Request.context`` nor the agent index (the seed already mixes the agent in). Misses go to
the inner backend in one batch and are committed in one transaction, so a process killed
mid-write loses only its uncommitted batch. Several processes may share one file
(``busy_timeout`` plus retries on "database is locked").
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from deliberation_env.backends.base import Backend, Completion, Request

log = logging.getLogger(__name__)

_SCHEMA = """CREATE TABLE IF NOT EXISTS completions (
    key TEXT PRIMARY KEY, text TEXT NOT NULL, prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL, top_logprobs TEXT, finish_reason TEXT NOT NULL, created REAL NOT NULL)"""


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0


def request_key(identity: str, request: Request) -> str:
    """The cache key of a request for a backend of the given identity."""
    payload = {
        "identity": identity,
        "messages": [[m.role, m.content] for m in request.messages],
        "params": request.sampling_params(),
        "seed": int(request.seed),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class CachedBackend:
    """Answers repeated requests from a SQLite file; forwards misses to ``inner``."""

    def __init__(self, inner: Backend, path: str | os.PathLike[str], timeout: float = 60.0):
        self.inner, self.path, self.timeout = inner, os.fspath(path), timeout
        self.stats = CacheStats()
        self._identity = inner.identity()
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = -1

    def identity(self) -> str:
        return self._identity

    def __repr__(self) -> str:
        return f"CachedBackend({self.inner!r}, path={self.path!r}, hits={self.stats.hits}, misses={self.stats.misses})"

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None or self._pid != os.getpid():  # never share a connection across fork
            conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout={int(self.timeout * 1000)}")
            self._retry(lambda: conn.execute("PRAGMA journal_mode=WAL"))
            conn.execute("PRAGMA synchronous=NORMAL")  # durable across process crashes in WAL mode
            self._retry(lambda: conn.execute(_SCHEMA))
            self._conn, self._pid = conn, os.getpid()
        return self._conn

    def _retry(self, action, attempts: int = 20):
        for attempt in range(attempts):
            try:
                return action()
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) and "busy" not in str(error) or attempt == attempts - 1:
                    raise
                time.sleep(min(1.0, 0.01 * 2**attempt))

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        keys = [request_key(self._identity, r) for r in requests]
        with self._lock:
            conn = self._connection()
            found: dict[str, Completion] = {}
            unique = list(dict.fromkeys(keys))
            for start in range(0, len(unique), 500):
                chunk = unique[start : start + 500]
                rows = conn.execute(
                    "SELECT key, text, prompt_tokens, completion_tokens, top_logprobs, finish_reason FROM completions "
                    f"WHERE key IN ({','.join('?' * len(chunk))})", chunk
                ).fetchall()
                for key, text, prompt, completion, logprobs, finish in rows:
                    found[key] = Completion(text, prompt, completion, json.loads(logprobs) if logprobs else None, finish, True)
        missing = [k for k in dict.fromkeys(keys) if k not in found]
        if missing:
            first = {k: i for i, k in reversed(list(enumerate(keys)))}
            fresh = self.inner.generate([requests[first[k]] for k in missing])
            with self._lock:
                self._store(list(zip(missing, fresh)))
            for key, completion in zip(missing, fresh):
                found[key] = replace(completion, cached=False)
        hits = sum(1 for k in keys if k not in missing)
        self.stats.hits += hits
        self.stats.misses += len(keys) - hits
        return [found[k] if k not in missing else found[k] for k in keys]

    def _store(self, items: list[tuple[str, Completion]]) -> None:
        conn = self._connection()
        rows = [
            (k, c.text, c.prompt_tokens, c.completion_tokens,
             json.dumps(c.top_logprobs) if c.top_logprobs else None, c.finish_reason, time.time())
            for k, c in items
        ]

        def write() -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany("INSERT OR IGNORE INTO completions VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

        self._retry(write)

    def close(self) -> None:
        log.info("%r closed", self)
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None
        close = getattr(self.inner, "close", None)
        if callable(close):
            close()
