"""A SQLite (WAL) completion cache around any backend.

The key of a request is a SHA-256 of the inner backend's ``identity()``, the messages, the
sampling parameters (``Request.sampling_params()``) and the request seed; never
the request's labels (``episode``, ``source``, ``problem``) nor the agent index (the seed already mixes the agent in). Misses go to
the inner backend in one batch and are committed in one transaction, so a process killed
mid-write loses only its uncommitted batch. Several processes may share one file
(``busy_timeout`` plus retries on "database is locked").

Text that UTF-8 cannot encode (lone surrogates such as ``"\\ud800"``) is stored as a BLOB of
its ``surrogatepass`` encoding and comes back as the same Python string. A cache file that
cannot be written (``read_only=True``, ``$DELIBERATION_ENV_CACHE_READ_ONLY=1``, or a file or
folder without write permission) is opened read-only: replay works, and a request that is
not in it fails before anything is computed. Errors name the file and the fix.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
import urllib.parse
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace

from deliberation_env.backends.base import Backend, completed_before
from deliberation_env.requests import Completion, Request

log = logging.getLogger(__name__)

READ_ONLY_ENV = "DELIBERATION_ENV_CACHE_READ_ONLY"
"""Set to 1 to open every cache file read-only (replay only)."""

_SCHEMA = """CREATE TABLE IF NOT EXISTS completions (
    key TEXT PRIMARY KEY, text TEXT NOT NULL, prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL, top_logprobs TEXT, finish_reason TEXT NOT NULL, created REAL NOT NULL,
    token_logprobs TEXT)"""
_COLUMNS = "key, text, prompt_tokens, completion_tokens, top_logprobs, finish_reason, created, token_logprobs"
_SELECT = "SELECT key, text, prompt_tokens, completion_tokens, top_logprobs, finish_reason, {} FROM completions WHERE key IN "
_INT64 = (-(2**63), 2**63 - 1)


class CacheError(RuntimeError):
    """A cache file that cannot be read, or written where writing is needed (names the path and the fix)."""


class CacheWriteWarning(RuntimeWarning):
    """Fresh completions were returned but could not be stored in the cache."""


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0


_KEY_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"))  # json.dumps(..., sort_keys=True, separators=...)


class _KeyHasher:
    """``cache_key`` with the identity's part of the hash computed once.

    The hashed text is exactly the JSON of ``{"identity", "messages", "params", "seed"}`` with sorted
    keys: the identity comes first, so ``{"identity":...,`` is hashed once and the rest, one JSON
    object without its opening brace, is added per request.
    """

    def __init__(self, identity: str):
        self._head = hashlib.sha256(('{"identity":' + _KEY_JSON.encode(identity) + ",").encode())

    def __call__(self, request: Request) -> str:
        rest = _KEY_JSON.encode({"messages": [[m.role, m.content] for m in request.messages],
                                 "params": request.sampling_params(), "seed": int(request.seed)})
        digest = self._head.copy()
        digest.update(rest[1:].encode())
        return digest.hexdigest()


def cache_key(identity: str, request: Request) -> str:
    """The cache key of a request for a backend of the given identity."""
    return _KeyHasher(identity)(request)


def _to_sql_text(text: str) -> str | bytes:
    """``text`` itself, or its ``surrogatepass`` UTF-8 bytes when it holds lone surrogates."""
    try:
        text.encode()
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def _from_sql_text(value: str | bytes) -> str:
    return value.decode("utf-8", "surrogatepass") if isinstance(value, bytes) else value


def _row(key: str, completion: Completion) -> tuple | None:
    """The table row of a completion, or None when it cannot be stored so as to replay equal."""
    text, finish = completion.text, completion.finish_reason
    counts = (completion.prompt_tokens, completion.completion_tokens)
    if not isinstance(text, str) or not isinstance(finish, str):
        return None
    if any(type(count) is not int or not _INT64[0] <= count <= _INT64[1] for count in counts):
        return None
    tokens = getattr(completion, "token_logprobs", None)
    try:
        logprobs = json.dumps(completion.top_logprobs) if completion.top_logprobs else None
        token_logprobs = json.dumps(tokens) if tokens is not None else None
    except (TypeError, ValueError):
        return None
    return (key, _to_sql_text(text), *counts, logprobs, _to_sql_text(finish), time.time(), token_logprobs)


def _tokens_from_json(value: str) -> tuple[tuple[str, float], ...]:
    return tuple(tuple(item) for item in json.loads(value))


def _has_token_logprobs(conn: sqlite3.Connection) -> bool:
    return any(row[1] == "token_logprobs" for row in conn.execute("PRAGMA table_info(completions)"))


class CachedBackend:
    """Answers repeated requests from a SQLite file; forwards misses to ``inner``.

    ``read_only``: True opens the file read-only (replay only; a miss raises ``CacheError``
    before the inner backend is called); None (default) does so when ``$DELIBERATION_ENV_CACHE_READ_ONLY``
    is 1 or the file or its folder is not writable.
    """

    def __init__(self, inner: Backend, path: str | os.PathLike[str], timeout: float = 60.0,
                 read_only: bool | None = None):
        self.inner, self.path, self.timeout = inner, os.fspath(path), timeout
        self.read_only = read_only
        self.stats = CacheStats()
        self._identity = inner.identity()
        self._key = _KeyHasher(self._identity)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._conn_read_only = False
        self._select = _SELECT.format("token_logprobs")
        self._pid = -1

    def identity(self) -> str:
        return self._identity

    def __repr__(self) -> str:
        return f"CachedBackend({self.inner!r}, path={self.path!r}, hits={self.stats.hits}, misses={self.stats.misses})"

    # ------------------------------------------------------------------ opening
    def _wants_read_only(self) -> bool:
        if self.read_only is not None:
            return self.read_only
        if os.environ.get(READ_ONLY_ENV, "").strip().lower() in ("1", "true", "yes"):
            return True
        folder = os.path.dirname(os.path.abspath(self.path))
        # WAL mode writes -wal and -shm files beside the database, so the folder must be writable too.
        return (os.path.exists(self.path) and not os.access(self.path, os.W_OK)) or not os.access(folder, os.W_OK)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None or self._pid != os.getpid():  # never share a connection across fork
            read_only = self._wants_read_only()
            try:
                conn = self._open_read_only() if read_only else self._open_read_write()
            except sqlite3.DatabaseError as error:
                raise CacheError(self._cannot_read(error)) from error
            self._conn, self._conn_read_only, self._pid = conn, read_only, os.getpid()
        return self._conn

    def _open_read_write(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout={int(self.timeout * 1000)}")
            self._retry(lambda: conn.execute("PRAGMA journal_mode=WAL"))
            conn.execute("PRAGMA synchronous=NORMAL")  # durable across process crashes in WAL mode
            self._retry(lambda: conn.execute(_SCHEMA))
            if not _has_token_logprobs(conn):  # a file written before the column existed
                try:
                    self._retry(lambda: conn.execute("ALTER TABLE completions ADD COLUMN token_logprobs TEXT"))
                except sqlite3.OperationalError as error:
                    if "duplicate column" not in str(error):  # another process added it first
                        raise
        except BaseException:
            conn.close()
            raise
        self._select = _SELECT.format("token_logprobs")
        return conn

    def _open_read_only(self) -> sqlite3.Connection:
        if not os.path.exists(self.path):
            raise CacheError(f"cache file {self.path!r} does not exist and the cache is read-only (read_only=True, "
                             f"${READ_ONLY_ENV}, or its folder is not writable); point cache= at an existing cache "
                             "file or at a writable folder")
        uri = "file:" + urllib.parse.quote(os.path.abspath(self.path))
        # mode=ro needs the WAL's -shm file or the right to create it; immutable=1 reads a WAL database
        # in a read-only folder (where no -wal file can appear beside it, so "immutable" holds).
        for options in ("?mode=ro", "?mode=ro&immutable=1"):
            conn = sqlite3.connect(uri + options, uri=True, timeout=self.timeout, isolation_level=None,
                                   check_same_thread=False)
            try:
                conn.execute(f"PRAGMA busy_timeout={int(self.timeout * 1000)}")
                conn.execute("SELECT key FROM completions LIMIT 1").fetchall()
                self._select = _SELECT.format("token_logprobs" if _has_token_logprobs(conn) else "NULL")
                return conn
            except sqlite3.DatabaseError as error:
                conn.close()
                if type(error) is not sqlite3.OperationalError or "no such table" in str(error) or "immutable" in options:
                    raise
        raise AssertionError("unreachable")

    def _cannot_read(self, error: BaseException) -> str:
        return (f"cache file {self.path!r} cannot be read ({type(error).__name__}: {error}). If it is damaged or not "
                "a completion cache, delete it (it is rebuilt from the backend) or point cache= at another file.")

    def _retry(self, action, attempts: int = 20):
        for attempt in range(attempts):
            try:
                return action()
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) and "busy" not in str(error) or attempt == attempts - 1:
                    raise
                time.sleep(min(1.0, 0.01 * 2**attempt))

    # ------------------------------------------------------------------ generate
    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        keys = [self._key(r) for r in requests]
        unique = list(dict.fromkeys(keys))
        with self._lock:
            conn = self._connection()
            try:
                found = self._lookup(conn, unique)
            except sqlite3.DatabaseError as error:
                raise CacheError(self._cannot_read(error)) from error
        missing = [k for k in unique if k not in found]
        if missing:
            if self._conn_read_only:
                raise CacheError(
                    f"cache file {self.path!r} is read-only but {len(missing)} of {len(unique)} distinct requests are "
                    "not in it, and their answers could not be stored. Make the file and its folder writable (and do "
                    f"not set read_only=True or ${READ_ONLY_ENV}=1), or point cache= at a writable copy of it.")
            first = {k: i for i, k in reversed(list(enumerate(keys)))}
            try:
                fresh = self.inner.generate([requests[first[k]] for k in missing])
            except Exception as error:  # store what the backend did answer before failing, then fail
                done = completed_before(error)
                if done:
                    with self._lock:
                        self._store([(missing[i], c) for i, c in sorted(done.items()) if 0 <= i < len(missing)])
                raise
            if len(fresh) != len(missing):
                raise CacheError(f"{self.inner!r} answered {len(fresh)} completions to {len(missing)} requests")
            with self._lock:
                self._store(list(zip(missing, fresh)))
            for key, completion in zip(missing, fresh):
                found[key] = replace(completion, cached=False) if completion.cached else completion
        missed = set(missing)
        hits = sum(1 for k in keys if k not in missed)
        self.stats.hits += hits
        self.stats.misses += len(keys) - hits
        return [found[k] for k in keys]

    def _lookup(self, conn: sqlite3.Connection, unique: list[str]) -> dict[str, Completion]:
        found: dict[str, Completion] = {}
        loads = json.loads
        for start in range(0, len(unique), 500):
            chunk = unique[start : start + 500]
            rows = conn.execute(self._select + f"({','.join('?' * len(chunk))})", chunk).fetchall()
            for key, text, prompt, completion, logprobs, finish, tokens in rows:
                if text.__class__ is bytes or finish.__class__ is bytes:
                    text, finish = _from_sql_text(text), _from_sql_text(finish)
                found[key] = Completion(text, prompt, completion, loads(logprobs) if logprobs else None, finish, True,
                                        None if tokens is None else _tokens_from_json(tokens))
        return found

    def _store(self, items: list[tuple[str, Completion]]) -> None:
        """Commits the rows in one transaction; a failure warns and keeps the (returned) completions."""
        rows = [row for row in (_row(k, c) for k, c in items) if row is not None]
        if len(rows) < len(items):
            warnings.warn(f"{len(items) - len(rows)} completions from {self.inner!r} cannot be stored in the cache "
                          f"{self.path!r} (text not a str, or token counts not 64-bit ints); they are returned but "
                          "will be generated again next time", CacheWriteWarning, stacklevel=3)
        if not rows:
            return
        conn = self._connection()

        def write() -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(f"INSERT OR IGNORE INTO completions ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

        try:
            self._retry(write)
        except sqlite3.Error as error:
            warnings.warn(f"could not store {len(rows)} completions in the cache file {self.path!r} ({error}); they "
                          "are returned but will be generated again next time. Check that the file and its folder "
                          "are writable and the disk is not full, or point cache= elsewhere.",
                          CacheWriteWarning, stacklevel=3)

    def close(self) -> None:
        log.info("%r closed", self)
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None
        close = getattr(self.inner, "close", None)
        if callable(close):
            close()
