"""The deliberation's state: each agent's local state, what a round produced, and the phases of a round
(``core.deliberation`` drives them)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from deliberation_env.core import features
from deliberation_env.core.actions import Action

__all__ = ["AgentState", "Phase", "RoundOutcome"]


@dataclass
class AgentState:
    """One agent's local state z_i = (answer, profile, confidence), plus bookkeeping."""

    text: str = ""
    answer: str | None = None
    correct: bool = False
    """Privileged: whether ``answer`` is right. Never part of an observation."""
    confidence: float = 0.5
    confidence_source: str = "none"
    profile: tuple[float, ...] = (0.0,) * len(features.PROFILE_FEATURES)
    signals: features.CompletionSignals = features.NO_SIGNALS
    """The raw signals of its latest completion (kept under a feature set that needs log-probabilities, as ``v2``;
    a CONCEDE takes its target's)."""
    tool_ran: bool = False
    """Its role's tool (``core.tools``) read an answer off its latest solution's program output."""
    tool_agrees: bool = False
    """That answer equals the one its text states (an external check of the text)."""
    last_action: Action | None = None
    refinements: int = 0
    step_tokens: int = 0
    total_tokens: int = 0

    def copy(self) -> AgentState:
        """A shallow copy (the round-start snapshot); several times faster than ``dataclasses.replace``."""
        clone = object.__new__(AgentState)
        clone.__dict__.update(self.__dict__)
        return clone


@dataclass(frozen=True)
class RoundOutcome:
    """Everything a round produced, per agent where it is a tuple."""

    round: int
    consensus: str | None
    consensus_correct: bool
    leave_one_out: tuple[str | None, ...]
    components: tuple[dict[str, float], ...]
    rewards: tuple[float, ...]
    done: bool


class Phase(Enum):
    IDLE = "idle"
    GENERATE = "generate"
    TOOL = "tool"
    CRITIC = "critic"
    READY = "ready"
