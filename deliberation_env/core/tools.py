"""Tools an agent's role may use (``Role.tool``): each one registered object that says what the core asks of it,
how it runs and how the core reads what it returns. The built-in ones are ``python`` (a program-aided agent: its
solution's last code block runs in the sandbox, and what it prints becomes its answer) and ``python_check`` (the same
run as an external check of the text's answer); ``tool_table()`` writes the table of the registered tools from their
declarations (docs/reference.md shows the built-in ones).

A tool is a ``Tool`` registered with ``register_tool``:

- ``kind``: the request kind of its runs. After a solution or refinement of an agent whose role has the tool, the core
  asks for one such request where ``request(text)`` gives its messages (greedy, ``max_tokens`` of the config, no
  log-probabilities); ``kind_id`` mixes the kind into the request's seed (``core.seeds``; default: a stable hash of
  the kind's name).
- ``run(requests)``: answers a batch of its requests, one ``Completion`` each whose text is the tool's output (empty
  when it failed). The request grouper (``deliberation_env.grouping``) sends every request of the kind here, unless the
  agent's backend answers tool requests itself (``answers_tools``: a replay backend serves the recorded runs).
- ``answers``: whether the answer the task's extractor reads off the output replaces the agent's answer (else it only
  checks it: ``tool_agrees``); ``tool_ran`` is 1 when the output holds an answer.

Its completions are recorded in replay sets like every completion (messages, seed and sampling are the key), so a
replayed team runs no tool. Tools of one kind share its runs (``python`` and ``python_check`` run the same
program; they differ in ``answers``). A new tool is one subclass and one ``register_tool`` call (docs/reference.md,
"Adding a tool").
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from deliberation_env.chat import Message
from deliberation_env.core.seeds import AGENT_KINDS, register_kind
from deliberation_env.requests import Completion, Request

OUTPUT_CHARS = 2000
"""The end of a program's output that is kept (its answer is on its last lines)."""
_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


class Tool:
    """A tool (see the module docstring): set ``name``, ``kind`` and ``answers``, define ``request`` and ``run``."""

    name: str
    kind: str
    answers: bool = False
    kind_id: int | None = None
    """The kind's number in request seeds; None: a stable hash of the kind's name."""
    summary: str = ""
    """What it does after each of the agent's solutions and refinements, in a sentence (``tool_table``)."""

    def request(self, text: str) -> tuple[Message, ...] | None:
        """The messages of the run that a solution's ``text`` asks for, or None: nothing to run."""
        raise NotImplementedError

    def run(self, requests: Sequence[Request]) -> list[Completion]:
        """Answer a batch of this tool's requests, in order (the completion's text is the tool's output)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, kind={self.kind!r}, answers={self.answers})"


TOOLS: dict[str, Tool] = {}
"""Tool name (``Role.tool``) -> the registered tool."""
_RUNNERS: dict[str, Tool] = {}
"""Request kind -> the tool that runs its requests (the first one registered with that kind)."""


def register_tool(tool: Tool, *, overwrite: bool = False) -> Tool:
    """Make ``tool`` a value of ``Role.tool`` and its kind a request kind; returns it."""
    name, kind = getattr(tool, "name", None), getattr(tool, "kind", None)
    if not isinstance(name, str) or not name or not isinstance(kind, str) or not kind:
        raise ValueError(f"a tool needs a non-empty str name and kind, got name={name!r}, kind={kind!r}")
    if kind in AGENT_KINDS:
        raise ValueError(f"tool {name!r}: kind {kind!r} is an agent's request kind; name its own kind")
    if name in TOOLS and not overwrite:
        raise ValueError(f"tool {name!r} is already registered; pass overwrite=True to replace it")
    register_kind(kind, tool.kind_id)
    TOOLS[name] = tool
    if overwrite or kind not in _RUNNERS:
        _RUNNERS[kind] = tool
    return tool


def tool_runner(kind: str) -> Tool | None:
    """The tool that runs requests of ``kind``, or None for an agent's kind (solve, refine, critic)."""
    return _RUNNERS.get(kind)


def is_tool_kind(kind: str) -> bool:
    """Whether ``kind`` is a tool's request kind (its requests never reach an agent's model)."""
    return kind in _RUNNERS


def request_kinds() -> tuple[str, ...]:
    """Every request kind: the agents' (solve, refine, critic), then the registered tools' kinds."""
    return (*AGENT_KINDS, *_RUNNERS)


def tool_table(names: Sequence[str] | None = None) -> str:
    """The markdown table of tools (name, request kind, what becomes of the text's answer, what it does), written from
    their declarations: docs/reference.md shows it (``names``: these tools; default: every registered one)."""
    rows = [("tool", "kind", "the text's answer", "after each of the agent's solutions and refinements")]
    for name in TOOLS if names is None else names:
        tool = TOOLS[name]
        rows.append((f"``{name}``", f"``{tool.kind}``",
                     "replaced by the output's, where it holds one" if tool.answers else "checked (``tool_agrees``)",
                     tool.summary))
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    lines.insert(1, "|" + "---|" * len(rows[0]))
    return "\n".join(lines)


def program_of(text: str) -> str | None:
    """The last fenced code block of a text (```python, ```py or a bare fence), or None."""
    blocks = [block for block in _BLOCK.findall(text) if block.strip()]
    return blocks[-1] if blocks else None


class PythonTool(Tool):
    """Runs the solution's last code block in the code sandbox (isolated, time and memory limited; no isolation, no
    run); its completion is the end of what the program printed, "" when it failed. A run costs no tokens."""

    kind = "run"
    kind_id = 4

    def __init__(self, name: str, answers: bool, timeout: float = 5.0, memory_mb: int = 512, workers: int = 2,
                 summary: str = ""):
        self.name, self.answers, self.summary = name, answers, summary
        self.timeout, self.memory_mb, self.workers = timeout, memory_mb, workers

    def request(self, text: str) -> tuple[Message, ...] | None:
        program = program_of(text)
        return None if program is None else (Message("user", program),)

    def run(self, requests: Sequence[Request]) -> list[Completion]:
        from deliberation_env.sandbox.runner import run_many

        results = run_many([request.messages[-1].content for request in requests], workers=self.workers,
                           timeout=self.timeout, memory_mb=self.memory_mb)
        return [Completion(result.stdout[-OUTPUT_CHARS:] if result.passed else "", 0, 0,
                           finish_reason="stop" if result.passed else "error") for result in results]


BUILT_IN_TOOLS = ("python", "python_check")
"""The tools shipped here (docs/reference.md's table)."""
register_tool(PythonTool("python", answers=True, summary=(
    "the solution's last Python code block runs in the sandbox (``deliberation_env.sandbox``; no isolation, no run); "
    "what it prints, read by the task's answer extractor, becomes the agent's answer: a program-aided agent")))
register_tool(PythonTool("python_check", answers=False, summary=(
    "the same run as ``python``'s (the two share it), as an external verifier: the text's answer stands, and "
    "``tool_agrees`` says whether the program printed it")))
