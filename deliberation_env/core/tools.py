"""Tools an agent's role may use (``Role.tool``): what the core asks for and how it reads the answer.

| tool         | after each of the agent's solutions and refinements                                         |
|--------------|----------------------------------------------------------------------------------------------|
| python       | the solution's last Python code block is run (a ``run`` request, answered in the sandbox by   |
|              | ``backends.tools.PythonTool``); what the program prints, read by the task's answer extractor, |
|              | becomes the agent's answer, else its text's answer stands                                   |
| python_check | the same run, but the text's answer always stands: the program only checks it (an external  |
|              | verifier; ``tool_agrees`` says whether the program printed the text's answer)               |

A ``run`` request carries the program as its one message; its completion's text is the program's output
(empty when it failed). Like every completion it is recorded in replay sets, so a replayed program-aided team
runs no code.
"""

from __future__ import annotations

import re

from deliberation_env.chat import Message

TOOLS = ("python", "python_check")
ANSWERING_TOOLS = ("python",)
"""Tools whose program output replaces the agent's answer (the others only check it)."""
_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def program_of(text: str) -> str | None:
    """The last fenced code block of a text (```python, ```py or a bare fence), or None."""
    blocks = [block for block in _BLOCK.findall(text) if block.strip()]
    return blocks[-1] if blocks else None


def run_messages(program: str) -> tuple[Message, ...]:
    """A ``run`` request's messages: the program alone."""
    return (Message("user", program),)
