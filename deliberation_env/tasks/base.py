"""The Task protocol: problems, prompts, answer extraction and grading.

A task is a small object. The environment needs from it:

- ``problems(split)``: the problems of a split, in a fixed order;
- ``solve_messages`` / ``refine_messages`` / ``critic_messages``: the chat prompts, built
  from the templates in ``task.prompts`` (users override them: ``task.prompts = ...``);
- ``extract_answer(text)``: the normalised answer in an LLM's text, or None (never raises);
- ``grade(problem, answer)``: whether an answer is correct;
- for the simulated backend, ``distractors`` (plausible wrong answers, shared by all agents
  so that a majority can be wrong) and ``render_solution`` (text in the task's own format
  from which ``extract_answer`` recovers the answer).

``BaseTask`` implements the prompt plumbing; a concrete task fills in the rest.
"""

from __future__ import annotations

import copy
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from deliberation_env.chat import Message

DATA_ENV_VAR = "DELIBERATION_ENV_DATA"


@dataclass(frozen=True)
class Problem:
    """One problem. ``answer`` is the gold answer, already normalised by the task."""

    id: str
    question: str
    answer: str
    difficulty: float | None = None
    """In [0, 1] when the task knows it (level, step count); the sim backend uses it."""
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Prompts:
    """Prompt templates (``str.format`` fields in braces).

    solve: ``{question}``; refine: ``{question}``, ``{own_solution}``, ``{peer_solutions}``;
    critic: ``{question}``, ``{solution}``; peer: ``{index}``, ``{answer}``, ``{rationale}``
    (one entry of ``{peer_solutions}``).
    """

    system: str
    solve: str
    refine: str
    critic: str
    peer: str = "Agent {index} answered {answer}. Their reasoning: {rationale}"


# Pieces the tasks' prompts share (each task file still spells out its own Prompts).
VERDICT_CRITIC = (
    "Problem: {question}\n\nProposed solution:\n{solution}\n\n"
    "Is the final answer correct? Reply 'Yes' or 'No', then 'Confidence: p' with p between 0 and 1."
)
REFINE_PREAMBLE = (
    "Problem: {question}\n\nYour previous solution:\n{own_solution}\n\n"
    "Other agents' answers:\n{peer_solutions}\n\n"
    "Re-examine the problem, using their reasoning where it helps. Solve it again step by step "
)


@dataclass(frozen=True)
class PeerView:
    """What a refining agent sees of one peer: its answer and a short rationale."""

    answer: str | None
    rationale: str


@runtime_checkable
class Task(Protocol):
    name: str
    prompts: Prompts

    def problems(self, split: str) -> Sequence[Problem]: ...

    def solve_messages(self, problem: Problem) -> tuple[Message, ...]: ...

    def refine_messages(
        self, problem: Problem, own_solution: str, peers: Sequence[PeerView]
    ) -> tuple[Message, ...]: ...

    def critic_messages(self, problem: Problem, solution: str) -> tuple[Message, ...]: ...

    def extract_answer(self, text: str) -> str | None: ...

    def grade(self, problem: Problem, answer: str | None) -> bool: ...

    def distractors(self, problem: Problem, rng: random.Random) -> list[str]: ...

    def render_solution(self, problem: Problem, answer: str | None, rng: random.Random) -> str: ...



def unknown_split(name: str, splits: Sequence[str], split: str) -> ValueError:
    """The error of a task asked for a split it lacks; for ``"train"`` (the envs' default), how to evaluate instead."""
    hint = (f" (the envs' default split): {name} has no training split; evaluate on it with split='test'"
            if split == "train" and "test" in splits else "")
    return ValueError(f"{name} has splits {sorted(splits)}, got {split!r}{hint}")

def styled(task: Task, style: str) -> Task:
    """A view of ``task`` that solves and refines with its prompt style ``style`` (``BaseTask.prompt_styles``; a
    role's ``prompt``): the same problems, answers, grading and critic prompt. ValueError names the styles."""
    styles = getattr(task, "prompt_styles", {})
    if style not in styles:
        raise ValueError(f"task {getattr(task, 'name', task)!r} has no prompt style {style!r}; its styles: "
                         f"{sorted(styles) or 'none (only its own prompts: prompt=None)'}")
    view = copy.copy(task)
    view.prompts = replace(styles[style], critic=task.prompts.critic)
    return view


def short_rationale(text: str, max_chars: int = 400) -> str:
    """The last ``max_chars`` characters of a solution, on a line boundary where possible."""
    text = text.strip()
    if len(text) <= max_chars:
        return text
    tail = text[-max_chars:]
    newline = tail.find("\n")
    if 0 <= newline < max_chars // 2:
        tail = tail[newline + 1 :]
    return "..." + tail


class BaseTask:
    """Prompt plumbing shared by all tasks; subclasses set ``name``, ``prompts`` and the rest."""

    name: str = "task"
    prompts: Prompts
    prompt_styles: Mapping[str, Prompts] = {}
    """Named prompt styles a role may solve with (``core.roles``; ``styled``); a task may set its own per instance."""
    rationale_chars: int = 400

    def with_prompts(self, **templates: str) -> BaseTask:
        """Override some prompt templates: ``task.with_prompts(solve="...")`` (returns self)."""
        self.prompts = replace(self.prompts, **templates)
        return self

    def _messages(self, user: str) -> tuple[Message, ...]:
        if self.prompts.system:
            return (Message("system", self.prompts.system), Message("user", user))
        return (Message("user", user),)

    def prompt_fields(self, problem: Problem) -> dict[str, str]:
        """The problem's fields the templates may name: ``{question}``, and whatever a task adds."""
        return {"question": problem.question}

    def solve_messages(self, problem: Problem) -> tuple[Message, ...]:
        return self._messages(self.prompts.solve.format(**self.prompt_fields(problem)))

    def refine_messages(
        self, problem: Problem, own_solution: str, peers: Sequence[PeerView]
    ) -> tuple[Message, ...]:
        peer_text = "\n".join(
            self.prompts.peer.format(
                index=index + 1,
                answer=peer.answer if peer.answer is not None else "(no answer)",
                rationale=peer.rationale,
            )
            for index, peer in enumerate(peers)
        )
        user = self.prompts.refine.format(
            **self.prompt_fields(problem),
            own_solution=short_rationale(own_solution, 4 * self.rationale_chars),
            peer_solutions=peer_text,
        )
        return self._messages(user)

    def critic_messages(self, problem: Problem, solution: str) -> tuple[Message, ...]:
        user = self.prompts.critic.format(**self.prompt_fields(problem), solution=solution.strip())
        return self._messages(user)


def resolve_data_file(data_dir: str | os.PathLike[str] | None, relative: str, hub_id: str) -> Path | None:
    """Find ``relative`` (e.g. ``"gsm8k/test.jsonl"``) under ``data_dir`` or ``$DELIBERATION_ENV_DATA``.

    Returns None when neither is set; raises FileNotFoundError naming the expected path when one
    is set but the file is missing. ``hub_id`` only enriches the message.
    """
    for source, base in (("data_dir", data_dir), (DATA_ENV_VAR, os.environ.get(DATA_ENV_VAR))):
        if not base:
            continue
        path = Path(base).expanduser() / relative
        if path.is_file():
            return path
        raise FileNotFoundError(
            f"{source} is {str(base)!r} but {str(path)!r} does not exist. Point {DATA_ENV_VAR} "
            f"(or data_dir=) at a data folder holding {relative} (the layout is in docs/tasks.md), or unset both to "
            f"load {hub_id!r} from the Hugging Face hub."
        )
    return None
