"""The meta-policy trainers by name. A trainer is one module that declares itself: its config dataclass (a
``BaseConfig``), its ``train(cfg, env_fn) -> Policy`` (which saves ``<cfg.out>/policy.pt``) and the leaderboard rows it
plays, in one ``Trainer`` and one ``register_trainer`` call; ``python -m baselines.meta.train --algo NAME`` trains it
and the benchmark suite (``bench/benchmark/benchmark_suite.py``) lists its rows. Nothing else changes:

    from baselines.meta.config import BaseConfig
    from baselines.meta.trainers import Trainer, register_trainer

    @dataclass
    class MyConfig(BaseConfig):
        episodes: int = 1000

    def train(cfg: MyConfig, env_fn=None) -> Policy: ...

    register_trainer(Trainer("mine", MyConfig, train))

The built-in trainers (``BUILT_IN``) register themselves the same way, in their own modules, which ``trainers()``
imports on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

BUILT_IN = ("baselines.meta.softrankpo", "baselines.meta.grpo", "baselines.meta.ppo", "baselines.meta.magrpo",
            "baselines.meta.sft")
"""The modules of the trainers shipped here, in the leaderboard's column order."""


@dataclass(frozen=True)
class Trainer:
    """A trainer's declaration (the module docstring)."""

    name: str
    """Its ``--algo`` name."""
    config: type
    """Its config dataclass: a ``baselines.meta.config.BaseConfig``, whose fields are its flags."""
    train: Callable[..., Any]
    """``train(cfg, env_fn=None) -> Policy``: trains on ``env_fn``'s envs (None: the config's) and saves
    ``<cfg.out>/policy.pt``."""
    rows: Mapping[str, Mapping[str, Any]] | None = None
    """The leaderboard rows it plays: row name -> the config keywords of that row (``ppo``: itself, and ``mappo``
    with ``centralized_critic=True``); None: one row of its own name and defaults; ``{}``: none."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"a trainer's name must be an identifier (its --algo), got {self.name!r}")
        if not isinstance(self.config, type) or not callable(self.train):
            raise TypeError(f"trainer {self.name!r}: config must be its config class and train a callable")
        object.__setattr__(self, "rows", {self.name: {}} if self.rows is None
                           else {row: dict(keywords) for row, keywords in self.rows.items()})


TRAINERS: dict[str, Trainer] = {}
"""Trainer name -> its declaration (``register_trainer`` adds one; ``trainers()`` also loads the built-in ones)."""


def register_trainer(trainer: Trainer, *, overwrite: bool = False) -> Trainer:
    """Make ``trainer`` a value of ``--algo`` and its rows leaderboard rows; returns it."""
    if trainer.name in TRAINERS and not overwrite:
        raise ValueError(f"trainer {trainer.name!r} is already registered; pass overwrite=True to replace it")
    taken = {row: name for name, other in TRAINERS.items() if name != trainer.name for row in other.rows or ()}
    clash = sorted(set(trainer.rows or ()) & set(taken))
    if clash:
        raise ValueError(f"trainer {trainer.name!r}: leaderboard rows {clash} are another trainer's")
    TRAINERS[trainer.name] = trainer
    return trainer


def trainers() -> dict[str, Trainer]:
    """Every registered trainer: the built-in ones first, in ``BUILT_IN``'s order (their modules are imported here),
    then the others in the order they were registered."""
    for module in BUILT_IN:
        importlib.import_module(module)  # each registers itself
    place = {module: k for k, module in enumerate(BUILT_IN)}
    ordered = sorted(TRAINERS.values(), key=lambda t: place.get(getattr(t.train, "__module__", ""), len(place)))
    return {declared.name: declared for declared in ordered}


def trainer(name: str) -> Trainer:
    """A registered trainer by name; ValueError naming the known ones."""
    known = trainers()
    if name not in known:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {sorted(known)}")
    return known[name]


def leaderboard_rows() -> dict[str, tuple[str, dict[str, Any]]]:
    """The leaderboard's rows of the registered trainers, in their order: row name -> (trainer, config keywords)."""
    return {row: (declared.name, dict(keywords)) for declared in trainers().values()
            for row, keywords in (declared.rows or {}).items()}
