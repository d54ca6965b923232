"""The privileged facts that ride on every ``Request`` as ``context``, for the simulated backend only.

The core (``deliberation_env.core.deliberation``) fills one in per request; ``SimBackend`` reads it to
model "refining helps when a peer is right" and informative confidence. Real backends and caches
ignore it: it is not part of a request's identity.
"""

from __future__ import annotations

from dataclasses import dataclass

from deliberation_env.tasks.base import Problem, Task


@dataclass(frozen=True)
class SimContext:
    """Privileged facts for the simulated backend (ignored by real backends).

    ``own_correct`` / ``peer_correct`` are gradings of answers already held, so the
    simulator can model "refining helps when a peer is right" and informative confidence.
    """

    task: Task
    problem: Problem
    own_answer: str | None = None
    own_correct: bool = False
    peer_answers: tuple[str | None, ...] = ()
    peer_correct: tuple[bool, ...] = ()
