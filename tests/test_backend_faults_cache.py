"""CachedBackend faults: text UTF-8 cannot encode, unreadable files, read-only files (real SQLite files)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import deliberation_env
from deliberation_env.backends.base import Completion, Message, Request
from deliberation_env.backends.cache import READ_ONLY_ENV, CachedBackend, CacheError, CacheWriteWarning, cache_key
from deliberation_env.testing.echo import EchoBackend

SURROGATES = "lone \ud800 high, \udfff low, \ud83d\ude00 a pair"


def _requests(seeds, content: str = "q") -> list[Request]:
    return [Request((Message("user", content),), "solve", 0, seed, 64, 0.7) for seed in seeds]


def _old_request_key(identity: str, request: Request) -> str:
    """The key formula every existing cache file was written with."""
    payload = {"identity": identity, "messages": [[m.role, m.content] for m in request.messages],
               "params": request.sampling_params(), "seed": int(request.seed)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@settings(max_examples=200, deadline=None)
@given(identity=st.text(), contents=st.lists(st.text(), min_size=1, max_size=3), seed=st.integers(-2**70, 2**70),
       temperature=st.floats(allow_nan=False), max_tokens=st.integers(1, 10**6), logprobs=st.booleans())
def test_request_key_is_the_old_formula(identity, contents, seed, temperature, max_tokens, logprobs):
    request = Request(tuple(Message("user", c) for c in contents), "critic", 1, seed, max_tokens=max_tokens,
                      temperature=temperature, logprobs=logprobs)
    assert cache_key(identity, request) == _old_request_key(identity, request)


def test_lone_surrogates_are_stored_and_replayed_equal(tmp_path):
    path = tmp_path / "c.sqlite"
    inner = EchoBackend(SURROGATES, top_logprobs={"Yes\ud800": -0.5, "No": -1.0}, finish_reason="stop\udc80")
    requests = _requests([1, 2], content="prompt with \ud800")
    fresh = CachedBackend(inner, path).generate(requests)
    replayed = CachedBackend(inner, path).generate(requests)
    assert inner.asked == 2 and all(c.cached for c in replayed)
    assert [c.text for c in replayed] == [c.text for c in fresh] == [f"{SURROGATES} 1", f"{SURROGATES} 2"]
    assert replayed[0].top_logprobs == {"Yes\ud800": -0.5, "No": -1.0} and replayed[0].finish_reason == "stop\udc80"
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    plain = tmp_path / "plain.sqlite"
    CachedBackend(EchoBackend(), plain).generate(_requests([1]))
    with sqlite3.connect(plain) as conn:  # ordinary text stays TEXT, readable by any SQLite tool
        assert conn.execute("SELECT typeof(text), text FROM completions").fetchone() == ("text", "answer 1")


def test_unstorable_completions_are_returned_with_a_warning(tmp_path):
    path = tmp_path / "c.sqlite"
    huge = EchoBackend()
    huge.generate = lambda requests: [Completion("big", 10**30, 2) for _ in requests]  # beyond SQLite's 64-bit ints
    cache = CachedBackend(huge, path)
    with pytest.warns(CacheWriteWarning, match="c.sqlite"):
        out = cache.generate(_requests([1]))
    assert out[0].text == "big" and out[0].prompt_tokens == 10**30 and cache.stats.misses == 1


def test_garbage_file_names_the_path_and_the_fix(tmp_path):
    path = tmp_path / "notes.sqlite"
    path.write_bytes(b"these are my notes, not a database\n" * 200)
    for read_only in (None, True):
        with pytest.raises(CacheError) as error:
            CachedBackend(EchoBackend(), path, read_only=read_only).generate(_requests([1]))
        assert str(path) in str(error.value) and "delete it" in str(error.value) and "cache=" in str(error.value)
    assert path.read_bytes().startswith(b"these are my notes")  # untouched


def _read_only_copy(tmp_path: Path, seeds) -> Path:
    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "c.sqlite"
    cache = CachedBackend(EchoBackend(), path)
    cache.generate(_requests(seeds))
    cache.close()
    path.chmod(0o444)
    folder.chmod(0o555)
    return path


def test_read_only_file_replays_and_refuses_misses_before_generating(tmp_path):
    path = _read_only_copy(tmp_path, range(5))
    try:
        before = path.read_bytes()
        inner = EchoBackend()
        cache = CachedBackend(inner, path, read_only=True)
        assert [c.text for c in cache.generate(_requests(range(5)))] == [f"answer {s}" for s in range(5)]
        with pytest.raises(CacheError, match="read-only") as error:
            cache.generate(_requests([3, 99]))
        assert str(path) in str(error.value) and "1 of 2" in str(error.value)
        assert inner.asked == 0 and cache.stats.hits == 5  # nothing generated, nothing lost
        assert path.read_bytes() == before
    finally:
        path.parent.chmod(0o755)


def test_read_only_by_environment_variable_replays_an_episode(tmp_path, monkeypatch):
    path = tmp_path / "c.sqlite"
    env = deliberation_env.parallel_env(task="arithmetic", backend="sim", cache=str(path))
    env.reset(seed=4)
    first = env.step({a: 1 for a in env.agents})[0]
    env.close()
    monkeypatch.setenv(READ_ONLY_ENV, "1")
    replay = deliberation_env.parallel_env(task="arithmetic", backend="sim", cache=str(path))
    replay.reset(seed=4)
    again = replay.step({a: 1 for a in replay.agents})[0]
    assert replay.backends[0].stats.misses == 0
    assert all((first[a]["self"] == again[a]["self"]).all() for a in first)
    with pytest.raises(CacheError, match="read-only"):
        replay.reset(seed=5)


AUTO = r"""
import sys
from deliberation_env.backends.base import Message, Request
from deliberation_env.backends.cache import CachedBackend, CacheError
from deliberation_env.testing.echo import EchoBackend

cache = CachedBackend(EchoBackend(), sys.argv[1])
print([c.text for c in cache.generate([Request((Message("user", "q"),), "solve", 0, s, 64, 0.7) for s in range(3)])])
try:
    cache.generate([Request((Message("user", "q"),), "solve", 0, 99, 64, 0.7)])
except CacheError as error:
    print("refused:", error)
"""


def test_unwritable_file_is_detected_and_replayed(tmp_path):
    if os.geteuid() == 0:  # root writes through chmod; an unprivileged user namespace makes the bits count
        unshare = shutil.which("unshare")
        if unshare is None or subprocess.run([unshare, "-U", "true"], capture_output=True).returncode != 0:
            pytest.skip("running as root without `unshare -U`: file permissions cannot be made to apply")
        prefix = [unshare, "-U"]
    else:
        prefix = []
    path = _read_only_copy(tmp_path, range(3))
    try:
        for name in os.listdir(path.parent):
            assert name == "c.sqlite"  # a clean close leaves no -wal/-shm: the hardest read-only case
        result = subprocess.run([*prefix, sys.executable, "-c", AUTO, str(path)], capture_output=True, text=True,
                                timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[0] == "['answer 0', 'answer 1', 'answer 2']"
        assert lines[1].startswith("refused:") and str(path) in lines[1]
    finally:
        path.parent.chmod(0o755)


OLD_SCHEMA = """CREATE TABLE completions (key TEXT PRIMARY KEY, text TEXT NOT NULL, prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL, top_logprobs TEXT, finish_reason TEXT NOT NULL, created REAL NOT NULL)"""


def test_token_logprobs_replay_and_files_without_their_column(tmp_path):
    old = tmp_path / "old.sqlite"
    request = Request((Message("user", "q"),), "solve", 0, 1, 64, 0.7, token_logprobs=True)
    with sqlite3.connect(old) as conn:  # a cache written before Completion.token_logprobs existed
        conn.execute(OLD_SCHEMA)
        conn.execute("INSERT INTO completions VALUES (?, 'old answer', 3, 2, NULL, 'stop', 0)",
                     (cache_key("echo", _requests([7])[0]),))
    conn.close()
    for read_only in (True, False):
        assert CachedBackend(EchoBackend(), old, read_only=read_only).generate(_requests([7]))[0].text == "old answer"
    inner = EchoBackend(token_logprobs=(("answer", -0.5), (" 1", -0.25)))
    assert CachedBackend(inner, old).generate([request])[0].token_logprobs == (("answer", -0.5), (" 1", -0.25))
    replayed = CachedBackend(inner, old, read_only=True).generate([request])[0]
    assert replayed.cached and replayed.token_logprobs == (("answer", -0.5), (" 1", -0.25)) and inner.asked == 1
