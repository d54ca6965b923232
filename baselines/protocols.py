"""Fixed meta-policies (METHOD.md section 3), as policies over the same environment.

A protocol maps the step's observations and infos to one action per live agent:
``protocol.act(observations, infos) -> {agent: action}``. They read the confidence and
action mask from infos and observations, and the oracle reads the privileged
``oracle_action`` info (an upper bound, never a fair competitor).

| name              | rule                                                                          |
|-------------------|-------------------------------------------------------------------------------|
| `single`          | one agent, no deliberation (evaluate with ``num_agents=1``; always PERSIST)    |
| `self_consistency`| every agent always PERSISTs: the answers of round 0, plurality vote            |
| `debate`          | every agent REFINEs every round, seeing its peers                              |
| `threshold`       | PERSIST if confidence >= threshold, else CONCEDE to a more confident peer if any, else REFINE |
| `random`          | a uniformly random legal action                                                |
| `oracle`          | PERSIST if right, CONCEDE if the concede target is right, else REFINE          |
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import numpy as np

PERSIST, REFINE, CONCEDE = 0, 1, 2


class FixedProtocol(ABC):
    name = "fixed"

    def reset(self, seed: int | None = None) -> None:
        """Called at the start of every episode."""

    @abstractmethod
    def act(self, observations: Mapping[str, Any], infos: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
        """One action per agent in ``observations``."""


class Constant(FixedProtocol):
    def __init__(self, action: int, name: str):
        self.action, self.name = action, name

    def act(self, observations, infos):
        return {agent: self.action for agent in observations}


class Threshold(FixedProtocol):
    name = "threshold"

    def __init__(self, threshold: float = 0.7):
        self.threshold = threshold

    def act(self, observations, infos):
        actions = {}
        for agent, obs in observations.items():
            info = infos[agent]
            target = info.get("concede_target")
            if info["confidence"] >= self.threshold:
                actions[agent] = PERSIST
            elif target is not None and obs["action_mask"][CONCEDE] and infos[target]["confidence"] > info["confidence"]:
                actions[agent] = CONCEDE
            else:
                actions[agent] = REFINE
        return actions


class RandomLegal(FixedProtocol):
    name = "random"

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def reset(self, seed: int | None = None) -> None:
        if seed is not None:
            self.rng = np.random.default_rng(seed)

    def act(self, observations, infos):
        actions = {}
        for agent, obs in observations.items():
            legal = np.flatnonzero(obs["action_mask"])
            actions[agent] = int(self.rng.choice(legal))
        return actions


class Oracle(FixedProtocol):
    name = "oracle"

    def act(self, observations, infos):
        return {agent: int(infos[agent]["oracle_action"]) for agent in observations}


def make_protocol(name: str, **kwargs: Any) -> FixedProtocol:
    """A fixed protocol by name (see the table in the module docstring)."""
    factories = {
        "single": lambda: Constant(PERSIST, "single"),
        "self_consistency": lambda: Constant(PERSIST, "self_consistency"),
        "debate": lambda: Constant(REFINE, "debate"),
        "threshold": lambda: Threshold(**kwargs),
        "random": lambda: RandomLegal(**kwargs),
        "oracle": lambda: Oracle(),
    }
    if name not in factories:
        raise ValueError(f"unknown protocol {name!r}; known: {sorted(factories)}")
    return factories[name]()


PROTOCOLS = ("single", "self_consistency", "debate", "threshold", "random", "oracle")
