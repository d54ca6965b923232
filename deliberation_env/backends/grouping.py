"""The one request grouper: answer requests that belong to different backends with one call per backend."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from deliberation_env.backends.base import Backend, Completion, Request


def generate_by_backend(requests: Sequence[Request], backends: Sequence[Backend]) -> list[Completion]:
    """Answer ``requests[i]`` with ``backends[i]``: one ``generate`` call per distinct backend (by identity), each
    with its requests in their order; the completions come back in the order of ``requests``."""
    if len(backends) != len(requests):
        raise ValueError(f"{len(requests)} requests but {len(backends)} backends: give one backend per request")
    if len({id(b) for b in backends}) <= 1:
        return backends[0].generate(requests) if requests else []
    groups: dict[int, list[int]] = {}
    for position, backend in enumerate(backends):
        groups.setdefault(id(backend), []).append(position)
    completions: list[Completion | None] = [None] * len(requests)
    for positions in groups.values():
        answered = backends[positions[0]].generate([requests[p] for p in positions])
        for position, completion in zip(positions, answered):
            completions[position] = completion
    return cast("list[Completion]", completions)  # every position belongs to one group: all filled
