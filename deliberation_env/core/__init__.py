"""The deliberation as a plain state machine: states, meta-actions, consensus, rewards."""

from deliberation_env.core.confidence import answer_confidence, parse_confidence
from deliberation_env.core.consensus import plurality, support
from deliberation_env.core.deliberation import (
    Action,
    AgentState,
    Deliberation,
    DeliberationConfig,
    RoundOutcome,
)
from deliberation_env.core.rewards import DEFAULT_REWARD_WEIGHTS, REWARD_COMPONENTS, RoundFacts

__all__ = [
    "Action",
    "AgentState",
    "DEFAULT_REWARD_WEIGHTS",
    "Deliberation",
    "DeliberationConfig",
    "REWARD_COMPONENTS",
    "RoundFacts",
    "RoundOutcome",
    "answer_confidence",
    "parse_confidence",
    "plurality",
    "support",
]
