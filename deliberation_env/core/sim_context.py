"""What the simulated backend knows beyond a request's text, and where it gets it: a hook the core owns.

Requests carry no simulator state. Each deliberation registers itself here under a process-unique number
(``register_source``) and names it on its requests (``Request.source``); ``SimBackend`` asks the registered
deliberation for a request's ``SimContext`` (``sim_context``) when it answers it, while the request is pending.
Real, cached and replay backends never look here, so no context is built for their requests.

Why a process-wide registry rather than passing the context along: every backend answers ``generate(requests)``
through the one request grouper, and only the sim needs more than the text. Passing contexts explicitly would put a
parameter that one backend reads into every backend's signature and the grouper's, or put the live deliberation on
the request, where it would travel with it into caches, logs and pickles (Ray workers, replicas). The registry holds
weak references only, is read by the sim alone, and a request whose maker is gone gets ``None``.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Protocol

from deliberation_env.requests import Request
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


class SimContextSource(Protocol):
    """What made a request and can tell the simulator about it (``core.deliberation.Deliberation``)."""

    def sim_context(self, request: Request) -> SimContext: ...


_SOURCES: weakref.WeakValueDictionary[int, SimContextSource] = weakref.WeakValueDictionary()
"""``Request.source`` -> the live deliberation that made the request (dropped when it is garbage)."""


def register_source(number: int, source: SimContextSource) -> None:
    """Make ``source`` the one that answers ``sim_context`` for requests whose ``source`` is ``number``."""
    _SOURCES[number] = source


def sim_context(request: Request) -> SimContext | None:
    """The context of a pending request, from the deliberation that made it; None for a request made elsewhere."""
    source = _SOURCES.get(request.source) if request.source is not None else None
    return None if source is None else source.sim_context(request)
