"""How an episode's requests get their seeds: one formula, used by the core and by everything that must find
where a recorded request sits (replay, recording).

A request's seed is ``request_seed(episode seed, round, agent, kind)``. With ``DeliberationConfig.streams`` the
episode seed is ``stream_seed(stream, problem id)``: each (problem, stream) has a seed of its own.
"""

from __future__ import annotations

import hashlib

from deliberation_env.requests import RequestKind

AGENT_KINDS = ("solve", "refine", "critic")
"""The request kinds an agent's model answers; a tool adds its own (``core.tools.register_tool``)."""
KIND_IDS: dict[str, int] = {"solve": 1, "refine": 2, "critic": 3}
"""Request kind -> the number mixed into its requests' seeds (part of every recorded request's identity: never
change one)."""
REQUEST_FORMAT = 2
"""The version of how requests are derived from an episode (seeds, kinds, rounds). Bump it with any change that
makes the same episode ask for other requests: recorded replay sets store it and refuse to load under another.
Format 2 mixes the problem's id into each sample stream's seed (``stream_seed``); format 1, kept only to read
sets recorded with it, gave stream s the same seed on every problem, so every problem reused one random stream."""
REQUEST_FORMATS = (1, 2)
_STREAM_TAG = 0x5EED5


def stream_seed(stream: int, problem_id: str, request_format: int = REQUEST_FORMAT) -> int:
    """The episode seed of sample stream ``stream`` of a problem (``DeliberationConfig.streams``): a seed of its own
    for every (problem, stream), so that no two problems share a request seed (format 1 ignored the problem)."""
    if request_format == 1:
        return mix_seed(_STREAM_TAG, stream)
    return mix_seed(_STREAM_TAG, problem_key(problem_id), stream)


def problem_key(problem_id: str) -> int:
    """A stable 63-bit integer of a problem id (the same on every machine and Python run)."""
    return int.from_bytes(hashlib.sha256(problem_id.encode("utf-8", "surrogatepass")).digest()[:8], "little") >> 1


def request_seed(episode_seed: int, round_: int, agent: int, kind: RequestKind) -> int:
    """The seed of one request of an episode: its round, agent and kind mixed into the episode's seed."""
    return mix_seed(episode_seed, round_, agent, KIND_IDS[kind])


def register_kind(kind: str, kind_id: int | None = None) -> int:
    """Give a tool's request kind its number in request seeds (``kind_id``, or a stable hash of the kind's name);
    registering a kind again with the same number is a no-op. Returns the number."""
    number = problem_key(f"request kind {kind}") if kind_id is None else kind_id
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise ValueError(f"request kind {kind!r}: its number must be an int >= 1, got {kind_id!r}")
    if KIND_IDS.get(kind, number) != number:
        raise ValueError(f"request kind {kind!r} is already numbered {KIND_IDS[kind]} in request seeds, not {number}")
    taken = next((other for other, value in KIND_IDS.items() if value == number and other != kind), None)
    if taken is not None:
        raise ValueError(f"request kind {kind!r}: number {number} already belongs to kind {taken!r}")
    KIND_IDS[kind] = number
    return number


def mix_seed(*parts: int) -> int:
    """Combine integers into one 63-bit seed (splitmix64 steps; stable across runs and platforms)."""
    state = 0x9E3779B97F4A7C15
    for part in parts:
        state = (state ^ (part & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        state = (state ^ (state >> 31)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
    return state >> 1
