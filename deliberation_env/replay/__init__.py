"""Replay: a real model's recorded deliberation tree as a backend (``replay.dataset``, ``replay.backend``)."""

from __future__ import annotations

import os
from typing import Any

from deliberation_env.replay.backend import ReplayBackend, ReplayMiss
from deliberation_env.replay.dataset import (
    ReplayError,
    ReplaySet,
    env_settings,
    load_card,
    shipped,
    split_mismatch,
    task_mismatch,
)


def replay_env(dataset: str | os.PathLike[str] | ReplaySet, split: str = "test", *, fallback: Any = None,
               fallback_model: str | None = None, data_dir: str | None = None, **options: Any):
    """A ``parallel_env`` on a replay set with the set's own recorded settings (task, prompts, agents, rounds,
    confidence, tokens, streams); ``options`` override env keywords (e.g. ``observation="flat"``, ``max_rounds``
    below the recorded rounds, another recorded ``confidence``). ``fallback`` answers what the set lacks; it must be
    the recorded model unless ``fallback_model`` names the one you accept instead."""
    from deliberation_env.env import DeliberationEnv  # the env imports replay.backend: import it on use

    replay = dataset if isinstance(dataset, ReplaySet) else ReplaySet(dataset)
    card, where = replay.card, f"replay set {replay.card.name!r} ({replay.path})"
    if options.get("task", card.task) != card.task:
        raise ReplayError(task_mismatch(card, where, options["task"]))
    if dict(options.get("task_kwargs", card.task_kwargs)) != card.task_kwargs:
        raise ReplayError(f"{where} was recorded with task_kwargs {card.task_kwargs}, not {options['task_kwargs']}: "
                          "drop task_kwargs= (replay_env() builds the recorded task), or record a set with them")
    if split not in card.splits:  # before the env asks the task for a split it may not have
        raise ReplayError(split_mismatch(card, where, split))
    kwargs = {**env_settings(card), **options}
    backend = ReplayBackend(replay, fallback=fallback, fallback_model=fallback_model)
    return DeliberationEnv(backend=backend, split=split, data_dir=data_dir, **kwargs)


__all__ = ["ReplayBackend", "ReplayError", "ReplayMiss", "ReplaySet", "env_settings", "load_card", "replay_env",
           "shipped"]
