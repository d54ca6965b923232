"""``PythonTool``: answers the ``run`` requests of program-aided agents (``core.tools``) in the code sandbox.

A role with ``tool="python"`` (or ``"python_check"``) makes the core ask, after each of that agent's solutions that holds a code block,
for a ``run`` request: the program. ``PythonTool`` wraps the agents' backend; it runs those programs in the
sandbox (``deliberation_env.sandbox``: isolated, time and memory limited; no isolation, no run) and passes every
other request to the backend it wraps (``inner``). The completion's text is what the program printed, or "" when
it failed (then the agent keeps its text's answer); a run costs no tokens. The env and the recorder wrap their
backends with ``with_tools`` when a role has a tool; a replay backend is left as it is, since it answers the
recorded runs itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from deliberation_env.backends.base import Backend, Completion, Request

OUTPUT_CHARS = 2000
"""The end of a program's output that is kept (its answer is on its last lines)."""


class PythonTool:
    """A backend wrapper that runs ``run`` requests in the sandbox (see the module docstring)."""

    def __init__(self, inner: Backend, timeout: float = 5.0, memory_mb: int = 512, workers: int = 2):
        self.inner, self.timeout, self.memory_mb, self.workers = inner, timeout, memory_mb, workers

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        runs = [i for i, request in enumerate(requests) if request.kind == "run"]
        others = [i for i, request in enumerate(requests) if request.kind != "run"]
        answers: dict[int, Completion] = {}
        if others:
            answers.update(zip(others, self.inner.generate([requests[i] for i in others])))
        if runs:
            from deliberation_env.sandbox.runner import run_many

            results = run_many([requests[i].messages[-1].content for i in runs], workers=self.workers,
                               timeout=self.timeout, memory_mb=self.memory_mb)
            for i, result in zip(runs, results):
                output = result.stdout[-OUTPUT_CHARS:] if result.passed else ""
                answers[i] = Completion(output, 0, 0, finish_reason="stop" if result.passed else "error")
        return [answers[i] for i in range(len(requests))]

    def identity(self) -> str:
        return self.inner.identity()

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if callable(close):
            close()

    def __repr__(self) -> str:
        return f"PythonTool({self.inner!r})"


def with_tools(backends: Sequence[Any], roles: Sequence[Any] | None) -> list[Any]:
    """``backends`` wrapped in ``PythonTool`` (one wrapper per distinct backend; one already wrapped stays as it is)
    when a role has a tool; else unchanged."""
    if not roles or all(role.tool is None for role in roles):
        return list(backends)
    wrapped: dict[int, Any] = {}
    return [wrapped.setdefault(id(backend), backend if isinstance(backend, PythonTool) else PythonTool(backend))
            for backend in backends]
