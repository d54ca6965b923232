"""Replay: a real model's recorded deliberation tree as a backend (``replay.dataset``, ``replay.backend``).

``replay_env`` (a ``parallel_env`` on a set's own settings) lives in ``deliberation_env.make``, above the env and
replay (``from deliberation_env import replay_env``); replay never imports the env."""

from __future__ import annotations

from deliberation_env.replay.backend import ReplayBackend, ReplayMiss
from deliberation_env.replay.dataset import ReplayError, ReplaySet, departures, env_settings, load_card, shipped

__all__ = ["ReplayBackend", "ReplayError", "ReplayMiss", "ReplaySet", "departures", "env_settings", "load_card",
           "shipped"]
