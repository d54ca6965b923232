"""Competition math with numeric answers: AIME 2024 and AMC 12 2023.

- ``aime24``: ``aime24/test.jsonl`` (30 rows: ``id``, ``problem``, ``solution``, ``answer`` an
  integer string such as ``"025"``, ``url``); hub ``HuggingFaceH4/aime_2024``. Answers are
  integers 0-999.
- ``amc23``: ``amc23/test.jsonl`` (40 rows: ``id``, ``problem`` or ``question``, ``answer`` a
  number such as ``27.0``, ``url``); hub ``math-ai/amc23``. Compared numerically.

Both ask for the final answer in ``\\boxed{}``; extraction also accepts "The answer is N".
Difficulty is the problem's position in its contest (from ``url``: ``.../Problem_7``).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from deliberation_env.tasks.base import REFINE_PREAMBLE, VERDICT_CRITIC, Problem, Prompts
from deliberation_env.tasks.dataset import NumericTask, Source
from deliberation_env.tasks.numeric import normalize_number

_REFINE = REFINE_PREAMBLE + "and put the final answer in \\boxed{{}}."
_PROBLEM_NUMBER_RE = re.compile(r"Problem_(\d{1,2})\b")


class CompetitionTask(NumericTask):
    """A contest whose answers are numbers; subclasses set the data source and contest size."""

    problems_per_contest: ClassVar[int] = 25
    final_line = "Therefore, the final answer is $\\boxed{{{answer}}}$."
    fields = {"problem|question": str, "answer": (str, int, float)}

    def make_problem(self, row: dict[str, Any], index: int, split: str) -> Problem:
        question = row.get("problem") or row.get("question")
        answer = normalize_number(str(row["answer"]))
        if answer is None:
            raise ValueError(f"'answer' is {row['answer']!r}, not a number")
        low, high = self.answer_range
        if (low is not None and float(answer) < low) or (high is not None and float(answer) > high):
            raise ValueError(f"'answer' {answer} is outside {self.name}'s range {low}-{high}")
        match = _PROBLEM_NUMBER_RE.search(str(row.get("url", "")))
        difficulty = None
        if match:
            difficulty = min(1.0, (int(match.group(1)) - 1) / (self.problems_per_contest - 1))
        return Problem(
            id=f"{self.name}-{row.get('id', index)}",
            question=str(question).strip(),
            answer=answer,
            difficulty=difficulty,
            metadata={key: row[key] for key in ("url", "solution") if key in row},
        )


class AIME24Task(CompetitionTask):
    """AIME 2024 (I and II): 30 problems, integer answers 0-999."""

    name = "aime24"
    sources = {"test": Source("aime24/test.jsonl", "HuggingFaceH4/aime_2024", None, "train")}
    answer_range = (0, 999)
    problems_per_contest = 15
    default_prompts = Prompts(
        system="You are an expert competition mathematician.",
        solve=(
            "Solve the following AIME problem. The answer is an integer from 0 to 999. Reason step by "
            "step and put the final answer in \\boxed{{}}.\n\nProblem: {question}"
        ),
        refine=_REFINE + " The answer is an integer from 0 to 999.",
        critic=VERDICT_CRITIC,
    )


class AMC23Task(CompetitionTask):
    """AMC 12 2023 (A and B): 40 problems with numeric answers, compared numerically."""

    name = "amc23"
    sources = {"test": Source("amc23/test.jsonl", "math-ai/amc23", None, "test")}
    problems_per_contest = 25
    default_prompts = Prompts(
        system="You are an expert competition mathematician.",
        solve=(
            "Solve the following competition problem. Reason step by step and put the final numeric "
            "answer in \\boxed{{}}.\n\nProblem: {question}"
        ),
        refine=_REFINE,
        critic=VERDICT_CRITIC,
    )
