"""Rewards as named, weighted components (docs/method.md, section 3).

Each component is a function of the facts of one round and an agent index:

| name     | value for agent i                                                          | default weight |
|----------|----------------------------------------------------------------------------|----------------|
| `local`  | 1[i correct after the round] - 1[i correct before it]                      | 1.0            |
| `global` | 1[consensus of all correct] - 1[consensus without i correct] (after round) | 1.0            |
| `team`   | 1[final consensus correct], on the last round only                         | 0.0            |
| `tokens` | -(tokens agent i used this round); the weight is the cost per token        | 0.0            |

The reward is ``sum(weight[name] * component(name))``. Register more with ``REWARD_COMPONENTS``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class RoundFacts:
    """What happened in one round; all rewards are computed from this alone."""

    correct_before: tuple[bool, ...]
    correct_after: tuple[bool, ...]
    consensus_correct: bool
    leave_one_out_correct: tuple[bool, ...]
    tokens: tuple[int, ...]
    final: bool


def local_reward(facts: RoundFacts, agent: int) -> float:
    return float(facts.correct_after[agent]) - float(facts.correct_before[agent])


def global_reward(facts: RoundFacts, agent: int) -> float:
    return float(facts.consensus_correct) - float(facts.leave_one_out_correct[agent])


def team_reward(facts: RoundFacts, agent: int) -> float:
    return float(facts.consensus_correct) if facts.final else 0.0


def token_reward(facts: RoundFacts, agent: int) -> float:
    return -float(facts.tokens[agent])


REWARD_COMPONENTS: dict[str, Callable[[RoundFacts, int], float]] = {
    "local": local_reward,
    "global": global_reward,
    "team": team_reward,
    "tokens": token_reward,
}
DEFAULT_REWARD_WEIGHTS: dict[str, float] = {"local": 1.0, "global": 1.0, "team": 0.0, "tokens": 0.0}


def check_weights(weights: Mapping[str, float], defaults: Mapping[str, float] = DEFAULT_REWARD_WEIGHTS) -> dict[str, float]:
    """``defaults`` updated by ``weights``; names not in ``defaults`` and non-finite values are errors."""
    unknown = sorted(set(weights) - set(defaults))
    if unknown:
        raise ValueError(f"unknown reward components {unknown}; known: {sorted(defaults)}")
    merged = dict(defaults)
    for name, value in weights.items():
        number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
        if not math.isfinite(number):
            raise ValueError(f"reward_weights[{name!r}] must be a finite number, got {value!r}")
        merged[name] = number
    return merged


def reward_components(facts: RoundFacts, agent: int) -> dict[str, float]:
    return {name: component(facts, agent) for name, component in REWARD_COMPONENTS.items()}


def total_reward(components: Mapping[str, float], weights: Mapping[str, float]) -> float:
    return sum(weights.get(name, 0.0) * value for name, value in components.items())
