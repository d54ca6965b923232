"""A backend that answers each request with its seed: for tests of what wraps a backend (the SQLite cache above all),
in-process or in a subprocess script."""

from __future__ import annotations

from deliberation_env.requests import Completion, Request


class EchoBackend:
    """Answers ``"<text> <seed>"`` (3 prompt tokens, 2 completion tokens; ``fields`` are further Completion fields) and
    counts the requests it was asked in ``asked``."""

    def __init__(self, text: str = "answer", **fields):
        self.text, self.fields, self.asked = text, fields, 0

    def identity(self) -> str:
        return "echo"

    def generate(self, requests: list[Request]) -> list[Completion]:
        self.asked += len(requests)
        return [Completion(f"{self.text} {r.seed}", 3, 2, **self.fields) for r in requests]
