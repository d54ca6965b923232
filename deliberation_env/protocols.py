"""Fixed meta-policies (docs/method.md, section 6 "Fixed protocols"), as policies over the same environment.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from deliberation_env.core.deliberation import Action


class FixedProtocol(ABC):
    """A meta-policy that needs no training: ``act(observations, infos) -> {agent: action}``."""

    name = "fixed"

    def reset(self, seed: int | None = None) -> None:
        """Called at the start of every episode."""

    @abstractmethod
    def act(self, observations: Mapping[str, Any], infos: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
        """One action per agent in ``observations``."""


class Constant(FixedProtocol):
    """Every agent takes the same action every round."""

    def __init__(self, action: Action, name: str):
        self.action, self.name = int(action), name

    def act(self, observations, infos):
        return {agent: self.action for agent in observations}


class Threshold(FixedProtocol):
    """PERSIST when confident, else CONCEDE to a more confident peer, else REFINE."""

    name = "threshold"

    def __init__(self, threshold: float = 0.7):
        self.threshold = threshold

    def act(self, observations, infos):
        actions = {}
        for agent, obs in observations.items():
            info = infos[agent]
            target = info.get("concede_target")
            can_concede = target is not None and obs["action_mask"][Action.CONCEDE]
            if info["confidence"] >= self.threshold:
                actions[agent] = int(Action.PERSIST)
            elif can_concede and infos[target]["confidence"] > info["confidence"]:
                actions[agent] = int(Action.CONCEDE)
            else:
                actions[agent] = int(Action.REFINE)
        return actions


class RandomLegal(FixedProtocol):
    """A uniformly random legal action (seeded; ``reset(seed)`` reseeds)."""

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
    """The privileged ``oracle_action`` info: an upper bound, never a fair competitor."""

    name = "oracle"

    def act(self, observations, infos):
        return {agent: int(infos[agent]["oracle_action"]) for agent in observations}


@dataclass(frozen=True)
class ProtocolSpec:
    """A fixed protocol's declaration: how it is made and the team it plays with."""

    make: Callable[..., FixedProtocol]
    """The factory; it takes the keywords of ``options``."""
    options: tuple[str, ...] = ()
    """The keywords it takes (``threshold``: its threshold; ``random``: its seed)."""
    num_agents: int | None = None
    """The team size it plays with (``single``: one agent), or None: any team."""


SPECS: dict[str, ProtocolSpec] = {
    "single": ProtocolSpec(lambda: Constant(Action.PERSIST, "single"), num_agents=1),
    "self_consistency": ProtocolSpec(lambda: Constant(Action.PERSIST, "self_consistency")),
    "debate": ProtocolSpec(lambda: Constant(Action.REFINE, "debate")),
    "threshold": ProtocolSpec(Threshold, options=("threshold",)),
    "random": ProtocolSpec(RandomLegal, options=("seed",)),
    "oracle": ProtocolSpec(Oracle),
}
"""The fixed protocols by name (the module docstring's table): the one place that says what each needs."""
PROTOCOLS = tuple(SPECS)


def _spec(name: str) -> ProtocolSpec:
    if name not in SPECS:
        raise ValueError(f"unknown protocol {name!r}; known: {sorted(SPECS)}")
    return SPECS[name]


def make_protocol(name: str, **kwargs: Any) -> FixedProtocol:
    """A fixed protocol by name (see the table in the module docstring), given those of ``kwargs`` it takes (its
    ``ProtocolSpec.options``: e.g. ``seed`` reaches only ``random``)."""
    spec = _spec(name)
    unknown = set(kwargs) - {option for known in SPECS.values() for option in known.options}
    if unknown:
        raise TypeError(f"no protocol takes {sorted(unknown)}; their options: "
                        f"{ {known: s.options for known, s in SPECS.items() if s.options} }")
    return spec.make(**{key: value for key, value in kwargs.items() if key in spec.options})


def protocol_agents(name: str, team: int | None = None) -> int | None:
    """The team size protocol ``name`` plays with: its declared one (``single``: 1), else ``team``."""
    declared = _spec(name).num_agents
    return team if declared is None else declared


def plays_team(name: str, team: int) -> bool:
    """Whether protocol ``name`` plays a team of ``team`` agents (a replay set fixes its team: a protocol that needs
    another size cannot play it)."""
    return protocol_agents(name, team) == team
