"""CachedBackend: exact replay, seeds as keys, hit/miss counts (real SQLite, real sim backend)."""

from __future__ import annotations

import sqlite3

import deliberation_env
from deliberation_env.backends.cache import CachedBackend
from deliberation_env.backends.sim import SimBackend


def _episode(cache_path, seed: int):
    env = deliberation_env.parallel_env(task="arithmetic", backend="sim", cache=str(cache_path))
    observations, infos = env.reset(seed=seed)
    trace = [(observations, infos)]
    while env.agents:
        actions = {agent: 1 for agent in env.agents}
        trace.append(env.step(actions))
    backend = env.backends[0]
    env.close()
    return trace, backend


def same_value(a, b) -> bool:
    import numpy as np

    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return a == b


def test_replay_is_exact_and_all_hits(tmp_path):
    path = tmp_path / "runs.sqlite"
    first, backend1 = _episode(path, seed=3)
    assert isinstance(backend1, CachedBackend) and backend1.stats.misses > 0
    second, backend2 = _episode(path, seed=3)
    assert backend2.stats.misses == 0
    assert backend2.stats.hits == backend1.stats.hits + backend1.stats.misses
    assert same_value(first, second)
    assert "hits=" in repr(backend2)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_different_seeds_make_different_entries(tmp_path):
    path = tmp_path / "runs.sqlite"
    _, a = _episode(path, seed=1)
    _, b = _episode(path, seed=2)
    assert b.stats.misses > 0
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM completions").fetchone()[0] > a.stats.misses


def test_hits_are_marked_cached(tmp_path):
    env = deliberation_env.parallel_env(task="arithmetic", backend="sim")
    env.begin_reset(env.problems[0], 5)
    requests = env.pending_requests()
    cached = CachedBackend(SimBackend(), tmp_path / "c.sqlite")
    fresh = cached.generate(requests)
    again = cached.generate(requests)
    assert not any(c.cached for c in fresh) and all(c.cached for c in again)
    assert [c.text for c in fresh] == [c.text for c in again]
