"""Rollout collection in Ray actors: ``python -m baselines.meta.train ... --num-workers N [--ray-address ADDR]``.

``open_collector(cfg, env_fn, wave)`` gives the trainers one interface, ``collector.collect(layout, policy, specs,
key, ...)``, for both paths: ``LocalCollector`` plays the episodes in this process on ``wave`` envs (the default,
``num_workers=0``); ``RayCollector`` starts ``num_workers`` ``RolloutWorker`` actors, each building ``wave`` envs
with its own copy of ``env_fn`` (a config's ``EnvFactory`` pickles without its backend, so each worker builds its
own backend from the config). Each batch, the learner puts the policy into Ray's object store once (every worker
reads that one copy), splits the episodes into contiguous shares of whole waves, and concatenates the returned
rollouts in episode order. Since every episode samples from its own stream (``baselines.meta.rollout``) and the waves
are the same as in one process, the batch, and so the training run, is the same for any number of workers.

A worker that dies (its process exits, its node goes away: ``RayActorError``) is replaced by a fresh actor that
plays the whole share again, up to ``max_restarts`` times per share and batch; after that ``WorkerLost`` stops the
run. The learner never updates on a partial batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from baselines.meta.config import BaseConfig, EnvFactory, env_kwargs
from baselines.meta.policy import ObsLayout, Policy
from baselines.meta.rollout import EpisodeSpec, Rollouts, collect
from baselines.meta.tree_rollout import TreeCollector

RAY_MISSING = 'rollout workers need Ray, which is not installed: pip install "deliberation-env[ray]" (or --num-workers 0)'


class WorkerLost(RuntimeError):
    """A rollout worker died more often than allowed while collecting one share of a batch."""


def require_ray() -> Any:
    """The ``ray`` module; ImportError naming the extra to install when it is missing."""
    try:
        import ray
    except ImportError as error:
        raise ImportError(RAY_MISSING) from error
    return ray


def connect(address: str | None = None) -> Any:
    """``ray``, initialised: joined to the cluster at ``address``, else to a new local instance (unless this process
    already is in one)."""
    ray = require_ray()
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=True)
    return ray


def shares(episodes: int, wave: int, workers: int) -> list[range]:
    """Contiguous, non-empty shares of ``range(episodes)`` made of whole waves of ``wave`` episodes, spread as
    evenly as the waves allow over at most ``workers`` workers (earlier shares get the extra waves)."""
    waves = -(-episodes // wave)
    per, extra = divmod(waves, workers)
    out, start = [], 0
    for w in range(min(workers, waves)):
        stop = min(episodes, start + (per + (w < extra)) * wave)
        out.append(range(start, stop))
        start = stop
    return out


def concat_rollouts(parts: Sequence[Rollouts]) -> Rollouts:
    """One ``Rollouts`` of ``parts`` played one after the other (episode indices shifted to follow on)."""
    offsets = np.cumsum([0] + [len(p.episodes) for p in parts[:-1]])
    arrays = {name: np.concatenate([getattr(p, name) for p in parts])
              for name in ("obs", "mask", "actions", "logp", "rewards", "group", "agent", "step", "labels")}
    states = [p.state for p in parts if p.state is not None]
    return Rollouts(**arrays, episode=np.concatenate([p.episode + o for p, o in zip(parts, offsets)]),
                    state=np.concatenate(states) if len(states) == len(parts) else None,
                    episodes=[summary for p in parts for summary in p.episodes])


class LocalCollector:
    """Plays episodes in this process, in waves of ``wave`` envs made by ``env_fn``."""

    def __init__(self, env_fn: Callable[[], Any], wave: int):
        self.envs = [env_fn() for _ in range(wave)]
        self.env = self.envs[0]
        """An env of the learner's own (for the observation layout)."""

    def collect(self, layout: ObsLayout, policy: Policy | None, specs: Sequence[EpisodeSpec], key: Sequence[int],
                **options: Any) -> Rollouts:
        """``baselines.meta.rollout.collect`` on this collector's envs."""
        return collect(self.envs, layout, policy, specs, key, **options)

    def close(self) -> None:
        for env in self.envs:
            env.close()


class RolloutWorker:
    """The Ray actor: ``wave`` envs from ``env_fn``; plays the episodes it is sent with the policy it is sent."""

    def __init__(self, env_fn: Callable[[], Any], wave: int, threads: int = 1):
        import torch

        torch.set_num_threads(threads)  # as the learner's collection, so that forward passes round alike
        self.envs = [env_fn() for _ in range(wave)]

    def collect(self, layout: ObsLayout, policy: Policy | None, specs: Sequence[EpisodeSpec], key: Sequence[int],
                options: dict[str, Any]) -> tuple[Rollouts, float]:
        """(rollouts, seconds spent collecting them in this worker)."""
        start = time.perf_counter()
        rollouts = collect(self.envs, layout, policy, specs, key, **options)
        return rollouts, time.perf_counter() - start

    def close(self) -> None:
        for env in self.envs:
            env.close()


class RayCollector:
    """Plays episodes on ``workers`` Ray actors (see the module docstring)."""

    def __init__(self, env_fn: Callable[[], Any], wave: int, workers: int, address: str | None = None,
                 threads: int = 1, max_restarts: int = 2):
        self.ray = connect(address)
        self.env_fn, self.wave, self.threads, self.max_restarts = env_fn, wave, threads, max_restarts
        self.env = env_fn()
        """An env of the learner's own (for the observation layout); it plays no episode."""
        self.worker_seconds: list[float] = []
        """Per share of the last batch: seconds its worker spent collecting it (the rest of the wall time is Ray's
        overhead and the wait for the slowest share)."""
        self._actor = self.ray.remote(RolloutWorker)
        self.actors = [self._start() for _ in range(workers)]

    def _start(self) -> Any:
        return self._actor.remote(self.env_fn, self.wave, self.threads)

    def collect(self, layout: ObsLayout, policy: Policy | None, specs: Sequence[EpisodeSpec], key: Sequence[int],
                **options: Any) -> Rollouts:
        """The rollouts of ``specs``, as ``baselines.meta.rollout.collect`` plays them in one process."""
        ray = self.ray
        specs = [spec if spec.stream is not None else replace(spec, stream=i) for i, spec in enumerate(specs)]
        if not specs:
            return collect([self.env], layout, policy, specs, key, **options)
        policy_ref = ray.put(policy)  # one copy in the object store, read by every worker
        parts = shares(len(specs), self.wave, len(self.actors))

        def submit(w: int) -> Any:
            return self.actors[w].collect.remote(layout, policy_ref, specs[parts[w].start:parts[w].stop], key, options)

        refs = [submit(w) for w in range(len(parts))]
        results: list[tuple[Rollouts, float]] = []
        for w, share in enumerate(parts):
            for attempt in range(self.max_restarts + 1):
                try:
                    results.append(ray.get(refs[w]))
                    break
                except ray.exceptions.RayActorError as error:
                    if attempt == self.max_restarts:
                        raise WorkerLost(
                            f"rollout worker {w} died {attempt + 1} times while playing episodes {share.start}.."
                            f"{share.stop - 1} of the batch ({type(error).__name__}: {' '.join(str(error).split())[:300]}); "
                            "the batch is incomplete, so training stops. Check the worker's log (ray logs / "
                            "/tmp/ray/session_latest/logs) and its node's memory") from error
                    ray.kill(self.actors[w], no_restart=True)
                    self.actors[w] = self._start()
                    refs[w] = submit(w)
        self.worker_seconds = [seconds for _, seconds in results]
        return concat_rollouts([rollouts for rollouts, _ in results])

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor, no_restart=True)
        self.actors = []
        self.env.close()


def open_collector(cfg: BaseConfig, env_fn: Callable[[], Any], wave: int) -> LocalCollector | RayCollector | TreeCollector:
    """``RayCollector`` with ``cfg.num_workers`` workers (at ``cfg.ray_address``); else, for a replay set's envs
    with ``cfg.engine == "tree"``, a ``TreeCollector`` on its compiled tree (the same rollouts); else a
    ``LocalCollector``."""
    if getattr(cfg, "num_workers", 0) > 0:
        return RayCollector(env_fn, wave, cfg.num_workers, cfg.ray_address, cfg.threads)
    if isinstance(env_fn, EnvFactory) and env_fn.cfg.replay and getattr(env_fn.cfg, "engine", "env") == "tree":
        options = env_kwargs(env_fn.cfg, env_fn.split, env_fn.backend)
        game = {k: v for k, v in options.items() if k not in ("split", "data_dir")}
        return TreeCollector(env_fn, wave, env_fn.split, game)
    return LocalCollector(env_fn, wave)
