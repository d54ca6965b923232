"""The deliberation's settings (``DeliberationConfig``), validated on construction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from deliberation_env.core import features
from deliberation_env.core.rewards import check_weights
from deliberation_env.core.roles import make_roles, roles_literal
from deliberation_env.core.seeds import REQUEST_FORMAT, REQUEST_FORMATS

CONCEDE_TARGETS = ("most_confident", "plurality")
CONFIDENCE_SOURCES = ("critic", "critic_text", "answer_logprobs")


@dataclass(frozen=True)
class DeliberationConfig:
    """Settings of the deliberation (validated on construction). Each field is declared here once: its default, and
    the docstring under it, are the help of every program's flag for it (``cli.add_env_arguments``)."""

    num_agents: int = field(default=3, metadata={"minimum": 1})
    """Agents in the deliberation."""
    max_rounds: int = field(default=3, metadata={"minimum": 1})
    """Deliberation rounds after round 0."""
    refine_rounds: int | None = field(default=None, metadata={"minimum": 0})
    """The rounds (from the first) that offer REFINE; each later round offers PERSIST and CONCEDE only and asks for
    no generation (a CONCEDE keeps the confidence its target holds: the critic's verdict on the very text it adopts).
    A replay set then plays ``max_rounds`` beyond its recorded rounds, exactly, from the answers it holds. None: every
    round offers REFINE."""
    concede_target: str = field(default="most_confident", metadata={"argparse": {"choices": CONCEDE_TARGETS}})
    """Whom CONCEDE adopts: the most confident disagreeing peer, or the peers' plurality answer."""
    concede_to_peer: bool = False
    """Also offer one CONCEDE per peer (action ``3 + k`` adopts peer k's answer, in the observation's peer order;
    ``core.actions``), so a policy can choose whom it adopts; CONCEDE (2) keeps following ``concede_target``."""
    early_stop: bool = False
    """End the episode early when every agent PERSISTs on a unanimous answer."""
    reintrospect_concede: bool = True
    """Re-run the critic after a CONCEDE (else the agent copies the target's confidence)."""
    reward_weights: Mapping[str, float] = field(default_factory=dict)
    confidence: str = field(default="critic", metadata={"argparse": {"choices": CONFIDENCE_SOURCES}})
    """Where an agent's confidence comes from: ``critic`` (a second call; its first-token Yes/No
    log-probabilities, else the number or verdict it writes), ``critic_text`` (the same call without
    asking for log-probabilities, for servers that cannot return them), or ``answer_logprobs`` (the
    probability of the answer's own tokens in the solution: no critic call at all)."""
    max_tokens: int = field(default=512, metadata={"minimum": 1})
    """Tokens per solution or refinement."""
    critic_max_tokens: int = field(default=48, metadata={"minimum": 1})
    """Tokens per critic (confidence) call."""
    temperature: float = 0.7
    """Sampling temperature of solutions and refinements."""
    critic_temperature: float = 0.0
    """Sampling temperature of critic calls."""
    streams: int | None = field(default=None, metadata={"minimum": 1})
    """When set, every episode draws its generations from one of this many sample streams per problem: the
    episode seed picks stream ``seed % streams``, whose seed is ``stream_seed(stream, problem id)``. Replay sets
    record S streams per problem and set this to S; None (the default) uses the episode seed itself."""
    request_format: int = REQUEST_FORMAT
    """How stream seeds are derived (``REQUEST_FORMAT``); only replay sets recorded under an older format set it."""
    features: str = "v1"
    """The observation's feature set (``core.features.FEATURE_SETS``): ``v1``, or ``v2``, which adds signals read
    off each agent's latest completion and asks the backend for token log-probabilities (the requests' replay keys
    stay the same: a replay set serves both), or ``v3``: v2 and each agent's role."""
    roles: Sequence[Any] | None = field(default=None, metadata={"argparse": {"type": roles_literal, "metavar": "LIST"}})
    """One ``core.roles.Role`` per agent (a prompt style and a temperature each; a mapping or a name is read as
    one), or None: the homogeneous team. Stored as a tuple of ``Role``."""

    def __post_init__(self) -> None:
        check_minimums(self)
        if self.request_format not in REQUEST_FORMATS:
            raise ValueError(f"request_format must be one of {REQUEST_FORMATS}, got {self.request_format!r}")
        if self.confidence not in CONFIDENCE_SOURCES:
            raise ValueError(f"confidence must be one of {CONFIDENCE_SOURCES}, got {self.confidence!r}")
        features.feature_names(self.features)  # ValueError naming the feature sets
        if self.concede_target not in CONCEDE_TARGETS:
            raise ValueError(f"concede_target must be one of {CONCEDE_TARGETS}, got {self.concede_target!r}")
        for name in ("temperature", "critic_temperature"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value <= 5.0:
                raise ValueError(f"{name} must be a number in [0, 5], got {value!r}")
        for name in ("concede_to_peer", "early_stop", "reintrospect_concede"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        object.__setattr__(self, "reward_weights", check_weights(self.reward_weights))
        object.__setattr__(self, "roles", make_roles(self.roles, self.num_agents))


def check_minimums(settings: Any) -> None:
    """ValueError unless every field of dataclass ``settings`` that declares a ``minimum`` in its metadata (an integer
    field: ``num_agents``, ``max_rounds``, ...) holds an integer at least that, or None. The one check of a declared
    minimum: the env's config and the trainers' configs (which take these fields' declarations) call it."""
    for declared in fields(settings):
        value, minimum = getattr(settings, declared.name), declared.metadata.get("minimum")
        if minimum is not None and value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum):
            raise ValueError(f"{declared.name} must be an integer >= {minimum}, got {value!r}")
