"""Replay: a real model's recorded deliberation tree as a backend (``replay.dataset``, ``replay.backend``); a set's
card and identity (``replay.card``: ``set_digest``, the shipped sets' ``PINNED`` digests).

``replay_env`` (a ``parallel_env`` on a set's own settings) lives in ``deliberation_env.make``, above the env and
replay (``from deliberation_env import replay_env``); replay never imports the env."""

from __future__ import annotations

from deliberation_env.replay.backend import ReplayBackend, ReplayMiss
from deliberation_env.replay.card import PINNED, set_digest
from deliberation_env.replay.dataset import (
    ReplayError,
    ReplaySet,
    departures,
    env_settings,
    load_card,
    loaded,
    shipped,
)

__all__ = ["PINNED", "ReplayBackend", "ReplayError", "ReplayMiss", "ReplaySet", "departures", "env_settings", "loaded",
           "load_card", "set_digest", "shipped"]
