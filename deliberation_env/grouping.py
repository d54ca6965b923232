"""The one request grouper, and the one loop that answers envs' pending requests through it.

``generate_by_backend`` answers requests that belong to different backends with one call per backend;
``answer_pending`` answers the pending requests of one or many envs (``DeliberationEnv`` and anything with its
``pending_requests`` / ``receive`` / ``backends``), wave after wave, until none is left: every env's
``reset``/``step`` and the episode runner (``deliberation_env.vector``) go through it. It sits beside the runner,
above the core (whose registered tools it applies) and the backends (whose ``generate`` it calls).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

from deliberation_env.backends.base import Backend
from deliberation_env.core.tools import Tool, tool_runner
from deliberation_env.requests import Completion, Request


def generate_by_backend(requests: Sequence[Request], backends: Sequence[Backend]) -> list[Completion]:
    """Answer ``requests[i]`` with ``backends[i]``: one ``generate`` call per distinct backend (by identity), each
    with its requests in their order; the completions come back in the order of ``requests``.

    A tool's request (``core.tools``: a program-aided role's ``run``) goes to the tool that runs its kind instead, one
    ``run`` call per tool, unless its backend answers tool requests itself (``answers_tools``: a replay backend
    serves the recorded runs). This is the one place where tools are applied, for the envs and the recorder alike."""
    if len(backends) != len(requests):
        raise ValueError(f"{len(requests)} requests but {len(backends)} backends: give one backend per request")
    answerers: list[Backend | Tool] = [
        backend if (tool := tool_runner(request.kind)) is None or getattr(backend, "answers_tools", False) else tool
        for request, backend in zip(requests, backends)]
    if len({id(a) for a in answerers}) <= 1:
        return _answer(answerers[0], requests) if requests else []
    groups: dict[int, list[int]] = {}
    for position, answerer in enumerate(answerers):
        groups.setdefault(id(answerer), []).append(position)
    completions: list[Completion | None] = [None] * len(requests)
    for positions in groups.values():
        answered = _answer(answerers[positions[0]], [requests[p] for p in positions])
        for position, completion in zip(positions, answered):
            completions[position] = completion
    return cast("list[Completion]", completions)  # every position belongs to one group: all filled


def _answer(answerer: Backend | Tool, requests: Sequence[Request]) -> list[Completion]:
    return answerer.run(requests) if isinstance(answerer, Tool) else answerer.generate(requests)


def generate_grouped(requests: Sequence[Request], backends: Sequence[Backend]) -> list[Completion]:
    """Answer requests with each agent's backend (``backends[request.agent]``): one call per distinct backend."""
    return generate_by_backend(requests, [backends[request.agent] for request in requests])


def answer_pending(envs: Sequence[Any], backend: Backend | None = None,
                   when: Callable[[list[Request]], bool] | None = None) -> None:
    """Answer the envs' pending requests, one wave (one call per distinct backend, all envs together) per phase,
    until no env has any: with ``backend`` if given, else each env's agent's own (``env.backends[agent]``).
    ``when``: answer an env's requests only while ``when(requests)`` holds (the others are left pending)."""
    while True:
        pending = [(env, env.pending_requests()) for env in envs]
        pending = [(env, requests) for env, requests in pending if requests and (when is None or when(requests))]
        if not pending:
            return
        flat = [(env, request) for env, requests in pending for request in requests]
        answered = iter(generate_by_backend([request for _, request in flat],
                                            [backend or env.backends[request.agent] for env, request in flat]))
        for env, requests in pending:
            env.receive([next(answered) for _ in requests])
