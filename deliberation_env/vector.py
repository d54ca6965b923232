"""The one episode runner: many envs played together, one backend call per phase.

``BatchedEnvs(envs, backend=None)`` begins a reset/step on every env, answers the ``pending_requests()`` of
all envs together (``grouping.answer_pending``: one ``generate`` call per distinct backend per
phase; ``backend`` if given, else each env's own per-agent backends), and ends the reset/step on every env.
Envs whose class does not declare ``phased = True`` (other PettingZoo envs, wrapped envs; ``DeliberationEnv`` and
the trace wrapper do) are reset and stepped one by one.
Each env's own PettingZoo API stays synchronous and unchanged.

``run_episodes(envs, starts, act, on_step)`` plays a list of episodes on such a pool, in waves of ``len(envs)``:
training rollouts, evaluation, analysis and the bench play their episodes through it (the few hand-written loops left
are named, with their reasons, in ``tests/test_architecture.py``).

| Call                                         | What it does                                                        |
|----------------------------------------------|---------------------------------------------------------------------|
| ``run_episodes(envs, starts, act, on_step)`` | episode i starts as ``starts[i]`` says, on ``envs[i % len(envs)]``; |
|                                              | ``act(steps)``: the actions of every live episode's last ``Step``,  |
|                                              | once per round; ``on_step(step)`` sees every reset and step         |
| ``run_batched(envs, policy, seeds)``         | one episode per env: each env's reset and step results              |
| ``BatchedEnvs(envs).reset(seeds)``           | one reset of every env                                              |
| ``BatchedEnvs(envs).step(actions)``          | one step of every env whose actions are not None                    |
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from deliberation_env.backends.base import Backend
from deliberation_env.grouping import answer_pending
from deliberation_env.tasks.base import Problem


@dataclass
class Start:
    """How an episode begins: ``env.reset(seed=seed, options=options)``; or, with ``problem`` (deliberation envs
    only), that problem with ``seed`` as its episode seed (``env.begin_reset``: no draws from the env's generator)."""

    seed: int | None = None
    options: Mapping[str, Any] | None = None
    problem: Problem | None = None


@dataclass
class Step:
    """One env's reset (``actions`` None) or step, as ``run_episodes`` hands it to ``act`` and ``on_step``."""

    episode: int
    """The episode's index in ``starts``."""
    slot: int
    """Its env's index in ``envs``."""
    env: Any
    observations: dict[str, Any]
    infos: dict[str, Any]
    actions: Mapping[str, Any] | None = None
    rewards: dict[str, float] = field(default_factory=dict)
    terminations: dict[str, bool] = field(default_factory=dict)
    truncations: dict[str, bool] = field(default_factory=dict)
    done: bool = False
    """The episode has ended (no live agents, or every acting agent terminated or truncated)."""


class BatchedEnvs:
    """A batch of envs answered together (see the module docstring)."""

    def __init__(self, envs: Sequence[Any], backend: Backend | None = None):
        if not envs:
            raise ValueError("BatchedEnvs needs at least one env")
        self.envs, self.backend = list(envs), backend

    def reset(self, seeds: Sequence[int | None] | None = None, options: Sequence[Mapping[str, Any] | None] | None = None,
              problems: Sequence[Problem] | None = None) -> list[tuple[Any, Any]]:
        """Like ``env.reset(seed=...)`` on every env; returns a list of (observations, infos). With ``problems``,
        env i plays ``problems[i]`` with episode seed ``seeds[i]`` (``Start.problem``)."""
        seeds = list(seeds) if seeds is not None else [None] * len(self.envs)
        options = list(options) if options is not None else [None] * len(self.envs)
        phased = [env for env in self.envs if _phased(env)]
        if problems is not None and len(phased) < len(self.envs):
            raise ValueError("a problem to play needs a DeliberationEnv (begin_reset); give plain envs reset seeds")
        for i, env in enumerate(self.envs):
            if _phased(env) and problems is not None:
                seed = seeds[i]
                if seed is None:
                    raise ValueError("a problem to play needs its episode seed")
                env.begin_reset(problems[i], seed)
            elif _phased(env):
                env.begin_episode(seeds[i], options[i])
        answer_pending(phased, self.backend)
        return [env.end_reset() if _phased(env) else env.reset(seed=seed, options=option)
                for env, seed, option in zip(self.envs, seeds, options)]

    def step(self, actions: Sequence[Mapping[str, Any] | None]) -> list[tuple[Any, ...] | None]:
        """Like ``env.step`` on every env whose actions are not None; None for skipped envs."""
        live = [(env, a) for env, a in zip(self.envs, actions) if a is not None]
        phased = [(env, action) for env, action in live if _phased(env)]
        for env, action in phased:
            env.begin_step(action)
        answer_pending([env for env, _ in phased], self.backend)
        results = iter([env.end_step() if _phased(env) else env.step(action)
                        for env, action in live])
        return [next(results) if a is not None else None for a in actions]


def _phased(env: Any) -> bool:
    """Whether ``env`` may be driven in phases: its class (not a wrapped env's, which a wrapper's attribute lookup
    would reach) declares it, and so records or transforms in ``end_reset``/``end_step`` whatever it must."""
    return bool(getattr(type(env), "phased", False))


Act = Callable[[list[Step]], Sequence[Mapping[str, Any]]]


def run_episodes(envs: Sequence[Any], starts: Sequence[Start], act: Act, on_step: Callable[[Step], None] | None = None,
         backend: Backend | None = None) -> None:
    """Play ``starts`` on ``envs`` in waves of ``len(envs)`` (episode i on ``envs[i % len(envs)]``), the envs of a
    wave answered together (``BatchedEnvs``). Once per round, ``act(steps)`` gets the last ``Step`` of every live
    episode of the wave (in env order) and returns their actions, in that order (one call: e.g. one forward pass
    for all of them); ``on_step`` sees every env's reset and every step, in env order."""
    for first in range(0, len(starts), len(envs)):
        wave = list(starts[first : first + len(envs)])
        batch = BatchedEnvs(envs[: len(wave)], backend)
        problems = [start.problem for start in wave if start.problem is not None]
        if problems and len(problems) < len(wave):
            raise ValueError("a wave's starts give a problem for every episode or for none")
        resets = batch.reset([start.seed for start in wave], [start.options for start in wave], problems or None)
        live = []
        for slot, (observations, infos) in enumerate(resets):
            step = Step(first + slot, slot, batch.envs[slot], observations, infos, done=not batch.envs[slot].agents)
            if on_step is not None:
                on_step(step)
            if not step.done:
                live.append(step)
        while live:
            chosen = dict(zip((step.slot for step in live), act(live)))
            results = batch.step([chosen.get(slot) for slot in range(len(wave))])
            stepped = []
            for last in live:
                result = results[last.slot]
                if result is None:  # every live env was given actions
                    raise RuntimeError(f"env {last.slot} of the wave is live but was not stepped")
                observations, rewards, terminations, truncations, infos = result
                actions = chosen[last.slot]
                ended = all(terminations.get(a, False) or truncations.get(a, False) for a in actions)
                step = Step(last.episode, last.slot, last.env, observations, infos, actions, rewards, terminations,
                            truncations, done=ended or not last.env.agents)
                if on_step is not None:
                    on_step(step)
                stepped.append(step)
            live = [step for step in stepped if not step.done]


def run_batched(envs: Sequence[Any], policy: Callable[[int, Any], Mapping[str, Any]], seeds: Sequence[int],
                backend: Backend | None = None) -> list[list[tuple[Any, ...]]]:
    """Run one episode per env; ``policy(env_index, observations) -> actions``. Returns per-env step lists."""
    traces: list[list[tuple[Any, ...]]] = [[] for _ in envs]

    def record(step: Step) -> None:
        result = (step.observations, step.infos) if step.actions is None else \
            (step.observations, step.rewards, step.terminations, step.truncations, step.infos)
        traces[step.slot].append(result)

    run_episodes(envs, [Start(seed) for seed in seeds[: len(envs)]],
         lambda steps: [policy(step.slot, step.observations) for step in steps], record, backend)
    return traces
