"""Named, weighted reward functions for the text-action env (``deliberation_env.text_env``).

Two kinds of terms, each logged separately in ``infos[agent]["reward_<name>"]`` every step:

Round terms: the core's decomposed components (``deliberation_env.core.rewards``: ``local``,
``global``, ``team``, ``tokens``), summed over the rounds that closed during the step, exactly
as the meta-action env computes them (default weights local 1, global 1, team 0, tokens 0).

Turn terms: functions of the completion an agent wrote this step (``TurnFacts``), in the
spirit of the ``verifiers`` library's rubrics (default weight 0: logged, not rewarded):

| name                | value for agent i this step                                                  |
|---------------------|------------------------------------------------------------------------------|
| `correct`           | solve/refine: 1 if the answer the task's extractor reads in the text is right |
| `consensus_correct` | 1 if the final consensus is right, on the step that ends the episode          |
| `team_turn`         | 1 if the consensus of the answers the team holds after the step is right, on  |
|                     | every step (a joint reward paid per turn, as CoMLRL's MAGRPO pays it)        |
| `format`            | solve/refine: 1 if the task's extractor finds an answer; critic: 1 if a      |
|                     | confidence (a number or a Yes/No verdict) can be read                        |
| `length`            | -(completion tokens of the text); the weight is the cost per token           |
| `calibration`       | critic: -(stated confidence - 1[own answer right])^2 (a Brier penalty)       |

An agent that waited this step (no request) gets 0 from every turn term except
``consensus_correct`` and ``team_turn`` (the team's terms). On the episode's last step ``team_turn`` equals
``consensus_correct`` (and the round term ``team``, which pays that step only). The step's reward is ``sum(weight[name] * term)`` over both kinds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from deliberation_env.core.rewards import DEFAULT_REWARD_WEIGHTS, REWARD_COMPONENTS, check_weights


@dataclass(frozen=True)
class TurnFacts:
    """What one agent's completion of this step was (all turn terms are computed from this alone)."""

    kind: str | None
    """The request answered: ``solve``, ``refine``, ``critic``, or None when the agent waited."""
    readable: bool = False
    """solve/refine: the task's extractor found an answer; critic: a confidence could be read."""
    correct: bool = False
    """solve/refine: the extracted answer is right; critic: the agent's current answer is right."""
    confidence: float | None = None
    """critic: the confidence read from the text."""
    completion_tokens: int = 0
    final: bool = False
    """The episode ended this step."""
    consensus_correct: bool = False
    """The team's consensus is right (read on the final step)."""
    team_correct: bool = False
    """The consensus of the answers the team holds after this step is right (read on every step)."""


def correct_reward(turn: TurnFacts) -> float:
    return float(turn.kind in ("solve", "refine") and turn.correct)


def consensus_correct_reward(turn: TurnFacts) -> float:
    return float(turn.final and turn.consensus_correct)


def team_turn_reward(turn: TurnFacts) -> float:
    return float(turn.team_correct)


def format_reward(turn: TurnFacts) -> float:
    return float(turn.kind is not None and turn.readable)


def length_reward(turn: TurnFacts) -> float:
    return -float(turn.completion_tokens)


def calibration_reward(turn: TurnFacts) -> float:
    if turn.kind != "critic" or turn.confidence is None:
        return 0.0
    return -((turn.confidence - float(turn.correct)) ** 2)


TURN_REWARDS: dict[str, Callable[[TurnFacts], float]] = {
    "correct": correct_reward,
    "consensus_correct": consensus_correct_reward,
    "team_turn": team_turn_reward,
    "format": format_reward,
    "length": length_reward,
    "calibration": calibration_reward,
}
DEFAULT_TURN_WEIGHTS: dict[str, float] = dict.fromkeys(TURN_REWARDS, 0.0)
ROUND_REWARDS = tuple(REWARD_COMPONENTS)
"""The core's components (``local``, ``global``, ``team``, ``tokens``)."""


def split_weights(weights: Mapping[str, float] | None) -> tuple[dict[str, float], dict[str, float]]:
    """(round weights for the core, turn weights) from one mapping over both sets of names.

    Unknown names and non-finite values are errors naming every accepted name.
    """
    weights = dict(weights or {})
    known = {**DEFAULT_REWARD_WEIGHTS, **DEFAULT_TURN_WEIGHTS}
    check_weights(weights, known)  # raises on unknown names or non-finite values, naming both sets
    round_weights = check_weights({k: v for k, v in weights.items() if k in REWARD_COMPONENTS})
    turn_weights = check_weights({k: v for k, v in weights.items() if k in TURN_REWARDS}, DEFAULT_TURN_WEIGHTS)
    return round_weights, turn_weights


def turn_terms(turn: TurnFacts) -> dict[str, float]:
    """Every turn term by name."""
    return {name: function(turn) for name, function in TURN_REWARDS.items()}


def weighted(terms: Mapping[str, float], weights: Mapping[str, float]) -> float:
    return sum(weights.get(name, 0.0) * value for name, value in terms.items())
