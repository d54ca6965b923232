"""Batching across envs: identical results to one-by-one stepping, one generate call per phase."""

from __future__ import annotations

import deliberation_env
from deliberation_env.backends.cache import CachedBackend
from deliberation_env.backends.sim import SimBackend
from deliberation_env.vector import run_batched
from tests.test_backend_cache import same_value


class CountingBackend:
    """A real wrapper that counts generate calls."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def identity(self) -> str:
        return self.inner.identity()

    def generate(self, requests):
        self.calls += 1
        return self.inner.generate(requests)


def _policy(index, observations):
    return {agent: (index + k) % 2 for k, agent in enumerate(sorted(observations))}


def _sequential(seeds, backend):
    traces = []
    for i, seed in enumerate(seeds):
        env = deliberation_env.parallel_env(task="arithmetic", backend=backend)
        trace = [env.reset(seed=seed)]
        while env.agents:
            trace.append(env.step(_policy(i, trace[-1][0])))
        traces.append(trace)
    return traces


def test_batched_equals_sequential_and_one_call_per_phase(tmp_path):
    seeds = list(range(6))
    expected = _sequential(seeds, SimBackend())
    counting = CountingBackend(SimBackend())
    envs = [deliberation_env.parallel_env(task="arithmetic", backend=counting) for _ in seeds]
    got = run_batched(envs, _policy, seeds)
    assert same_value(expected, got)
    # reset: solve + critic; each of 3 steps: at most refine + critic
    assert counting.calls <= 2 + 3 * 2
    cached = CachedBackend(SimBackend(), tmp_path / "c.sqlite")
    envs = [deliberation_env.parallel_env(task="arithmetic", backend=cached) for _ in seeds]
    assert same_value(expected, run_batched(envs, _policy, seeds))
    envs = [deliberation_env.parallel_env(task="arithmetic", backend=cached) for _ in seeds]
    assert same_value(expected, run_batched(envs, _policy, seeds)) and cached.stats.misses > 0


def test_heterogeneous_team(tmp_path):
    team = [SimBackend(), CachedBackend(SimBackend(skills=(0.3,)), tmp_path / "h.sqlite"), SimBackend()]
    env = deliberation_env.parallel_env(task="arithmetic", backend=team)
    observations, _ = env.reset(seed=1)
    while env.agents:
        observations, *_ = env.step({agent: 1 for agent in env.agents})
    assert team[1].stats.misses > 0
