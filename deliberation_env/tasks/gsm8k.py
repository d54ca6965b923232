"""GSM8K: grade-school math word problems (Cobbe et al., 2021).

Data: ``gsm8k/train.jsonl`` (7,473 rows) and ``gsm8k/test.jsonl`` (1,319) with ``question``
and ``answer`` (a worked solution with ``<<a*b=c>>`` calculator marks, ending ``#### N``);
hub: ``openai/gsm8k`` config ``main``. The gold answer is N, normalised (``"1,080"`` ->
``"1080"``). Grading is numeric equality after normalisation (commas, ``$``, units, ``%``,
trailing ``.0``). Difficulty grows with the number of calculator steps.
"""

from __future__ import annotations

import random
import re
from typing import Any

from deliberation_env.tasks.base import REFINE_PREAMBLE, VERDICT_CRITIC, Problem, Prompts
from deliberation_env.tasks.dataset import NumericTask, Source
from deliberation_env.tasks.numeric import normalize_number

PROMPTS = Prompts(
    system="You are a careful math assistant.",
    solve=(
        "Solve the math word problem step by step. End with a line 'The answer is N' where N is "
        "the final number, without units.\n\nProblem: {question}"
    ),
    refine=REFINE_PREAMBLE + "and end with a line 'The answer is N'.",
    critic=VERDICT_CRITIC,
)

_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_CALCULATOR_RE = re.compile(r"<<[^<>\n]{0,200}>>")
_RESULT_RE = re.compile(r"<<[^<>\n=]{0,200}=([^<>\n=]{1,50})>>")


def gold_answer(solution: str) -> str:
    """The normalised N of a GSM8K solution's ``#### N`` line (ValueError if absent)."""
    if "####" not in solution:
        raise ValueError("the 'answer' field has no '#### N' final line")
    final = solution.rsplit("####", 1)[1].strip()
    value = normalize_number(final)
    if value is None:
        raise ValueError(f"the '#### ' line holds {final!r}, not a number")
    return value


class GSM8KTask(NumericTask):
    """GSM8K word problems; numeric grading of the final number."""

    name = "gsm8k"
    sources = {
        "train": Source("gsm8k/train.jsonl", "openai/gsm8k", "main", "train"),
        "test": Source("gsm8k/test.jsonl", "openai/gsm8k", "main", "test"),
    }
    fields = {"question": str, "answer": str}
    default_prompts = PROMPTS

    def make_problem(self, row: dict[str, Any], index: int, split: str) -> Problem:
        solution = row["answer"]
        steps = max(1, len(_CALCULATOR_RE.findall(solution)))
        return Problem(
            id=f"gsm8k-{split}-{index}",
            question=row["question"].strip(),
            answer=gold_answer(solution),
            difficulty=min(1.0, (steps - 1) / 6),
            metadata={"solution": solution, "steps": steps},
        )

    def intermediates(self, problem: Problem) -> list[str]:
        results = [normalize_number(x) for x in _RESULT_RE.findall(problem.metadata["solution"])]
        return [r for r in reversed(results) if r is not None]

    def rationale(self, problem: Problem, answer: str, rng: random.Random) -> list[str]:
        """The gold worked solution without calculator marks; a wrong answer is a slip in its last step.

        The slip replaces the last number of the last line, so a wrong solution has the same
        shape (lines, '=' signs) as the right one and its form does not give correctness away.
        """
        body = problem.metadata["solution"].rsplit("####", 1)[0]
        lines = [line.strip() for line in _CALCULATOR_RE.sub("", body).splitlines() if line.strip()]
        if answer != problem.answer and lines:
            numbers = list(_NUMBER_RE.finditer(lines[-1]))
            if numbers:
                last = numbers[-1]
                lines[-1] = lines[-1][: last.start()] + answer + lines[-1][last.end() :]
            else:
                lines[-1] = rng.choice(("Putting it together, the total comes to {a}.", "So the result is {a}.")).format(
                    a=answer
                )
        return lines
