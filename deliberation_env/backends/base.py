"""The LLM backend protocol: ``generate(list[Request]) -> list[Completion]``.

A backend answers a batch of chat requests, in order. Everything a backend needs is in
``messages`` (``deliberation_env.chat.Message``) and the sampling fields. ``Request``, ``Completion``,
``RequestKind`` and ``sanitize_completion`` live on their own floor below the core and the backends
(``deliberation_env.requests``); they are re-exported here, where users have always imported them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from deliberation_env.chat import Message
from deliberation_env.requests import MAX_TOKEN_COUNT, Completion, Request, RequestKind, sanitize_completion


@runtime_checkable
class Backend(Protocol):
    """Anything that answers a batch of requests, in order.

    A ``generate`` that fails part-way may attach what it did answer to the exception it raises,
    as ``error.completed = {position in requests: Completion}`` (see ``completed_before``):
    ``CachedBackend`` stores those, so a re-run does not generate them again.
    """

    def generate(self, requests: Sequence[Request]) -> list[Completion]: ...

    def identity(self) -> str:
        """A stable, server-independent name of the model and its settings (used by caches)."""
        ...


def completed_before(error: BaseException) -> dict[int, Completion]:
    """The completions a failed ``generate`` attached to its exception (position -> completion)."""
    completed = getattr(error, "completed", None)
    return completed if isinstance(completed, dict) else {}


def estimate_tokens(text: str) -> int:
    """A tokenizer-free token estimate (about 4 characters a token), for backends without one."""
    return max(1, (len(text) + 3) // 4)


__all__ = ["MAX_TOKEN_COUNT", "Backend", "Completion", "Message", "Request", "RequestKind", "completed_before", "estimate_tokens",
           "sanitize_completion"]
