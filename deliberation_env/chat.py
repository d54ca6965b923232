"""Chat messages: the plain data that tasks write (their prompts) and backends read (``Request.messages``).

A leaf module: it imports nothing of ``deliberation_env``, so tasks and backends can both depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True)
class Message:
    """One chat message."""

    role: Role
    content: str

    def as_dict(self) -> dict[str, str]:
        """The ``{"role", "content"}`` dict of chat templates and OpenAI-compatible APIs."""
        return {"role": self.role, "content": self.content}
