"""Replay: a real model's recorded deliberation tree as a backend (``replay.dataset``, ``replay.backend``).

``replay_env`` (a ``parallel_env`` on a set's own settings) lives in ``deliberation_env.make``, above the env, and
is importable from here too."""

from __future__ import annotations

from typing import Any

from deliberation_env.replay.backend import ReplayBackend, ReplayMiss
from deliberation_env.replay.dataset import ReplayError, ReplaySet, departures, env_settings, load_card, shipped


def __getattr__(name: str) -> Any:
    """``replay_env`` under its old path: it lives in ``deliberation_env.make`` (replay never imports the env)."""
    if name == "replay_env":
        from deliberation_env.make import replay_env

        return replay_env
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ReplayBackend", "ReplayError", "ReplayMiss", "ReplaySet", "departures", "env_settings", "load_card",
           "replay_env", "shipped"]
