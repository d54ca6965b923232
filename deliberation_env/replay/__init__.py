"""Replay: a real model's recorded deliberation tree as a backend (``replay.dataset``, ``replay.backend``)."""

from __future__ import annotations

import os
from typing import Any

from deliberation_env.replay.backend import ReplayBackend, ReplayMiss
from deliberation_env.replay.dataset import ReplayError, ReplaySet, shipped


def replay_env(dataset: str | os.PathLike[str] | ReplaySet, split: str = "test", *, fallback: Any = None,
               data_dir: str | None = None, **options: Any):
    """A ``parallel_env`` on a replay set with the set's own recorded settings (task, prompts, agents, rounds,
    confidence, tokens, streams); ``options`` override env keywords (e.g. ``observation="flat"``, ``max_rounds``
    below the recorded rounds, another recorded ``confidence``)."""
    from deliberation_env import parallel_env

    replay = dataset if isinstance(dataset, ReplaySet) else ReplaySet(dataset)
    card = replay.card
    settings: dict[str, Any] = dict(card.settings)
    num_agents = settings.pop("num_agents")
    options.setdefault("max_rounds", card.rounds)
    options.setdefault("confidence", card.confidence)
    for name, value in settings.items():
        options.setdefault(name, value)
    return parallel_env(task=card.task, backend=ReplayBackend(replay, fallback=fallback), num_agents=num_agents,
                        split=split, data_dir=data_dir, task_kwargs=dict(card.task_kwargs), **options)


__all__ = ["ReplayBackend", "ReplayError", "ReplayMiss", "ReplaySet", "replay_env", "shipped"]
