"""Step many DeliberationEnv instances together, one backend call per phase.

``BatchedEnvs(envs, backend=None)`` begins a reset/step on every env, then gathers the
``pending_requests()`` of all envs into one ``generate`` call per distinct backend per phase
(``backend`` if given, else each env's own per-agent backends), hands each env its
completions with ``receive()``, and ends the reset/step on every env. Each env's own
PettingZoo API stays synchronous and unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from deliberation_env.backends.base import Backend
from deliberation_env.backends.grouping import generate_by_backend
from deliberation_env.env import DeliberationEnv


class BatchedEnvs:
    """A batch of envs answered together (see the module docstring)."""

    def __init__(self, envs: Sequence[DeliberationEnv], backend: Backend | None = None):
        if not envs:
            raise ValueError("BatchedEnvs needs at least one env")
        self.envs, self.backend = list(envs), backend

    def reset(self, seeds: Sequence[int | None] | None = None, options: Sequence[Mapping[str, Any] | None] | None = None):
        """Like ``env.reset(seed=...)`` on every env; returns a list of (observations, infos)."""
        seeds = list(seeds) if seeds is not None else [None] * len(self.envs)
        options = list(options) if options is not None else [None] * len(self.envs)
        for env, seed, option in zip(self.envs, seeds, options):
            env.begin_episode(seed, option)
        self._run(self.envs)
        return [env.end_reset() for env in self.envs]

    def step(self, actions: Sequence[Mapping[str, Any] | None]):
        """Like ``env.step`` on every env whose actions are not None; None for skipped envs."""
        live = [(env, a) for env, a in zip(self.envs, actions) if a is not None]
        for env, action in live:
            env.begin_step(action)
        self._run([env for env, _ in live])
        results = iter([env.end_step() for env, _ in live])
        return [next(results) if a is not None else None for a in actions]

    def _run(self, envs: Sequence[DeliberationEnv]) -> None:
        while True:
            pending = [(env, env.pending_requests()) for env in envs]
            pending = [(env, requests) for env, requests in pending if requests]
            if not pending:
                return
            flat = [(env, request) for env, requests in pending for request in requests]
            answered = iter(generate_by_backend([request for _, request in flat],
                                                [self.backend or env.backends[request.agent] for env, request in flat]))
            answers = [[next(answered) for _ in requests] for _, requests in pending]
            for (env, _), completions in zip(pending, answers):
                env.receive(completions)


def run_batched(envs: Sequence[DeliberationEnv], policy, seeds: Sequence[int], backend: Backend | None = None):
    """Run one episode per env; ``policy(env_index, observations) -> actions``. Returns per-env step lists."""
    batch = BatchedEnvs(envs, backend)
    traces: list[list[Any]] = [[reset] for reset in batch.reset(seeds)]
    while any(env.agents for env in batch.envs):
        actions = [policy(i, traces[i][-1][0]) if env.agents else None for i, env in enumerate(batch.envs)]
        for i, result in enumerate(batch.step(actions)):
            if result is not None:
                traces[i].append(result)
    return traces
