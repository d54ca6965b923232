"""MATH-500: the 500-problem test subset of MATH (Hendrycks et al., 2021).

Data: ``math500/test.jsonl`` with ``problem``, ``solution`` (LaTeX, final answer in
``\\boxed{}``), ``answer``, ``subject``, ``level`` (1-5) and ``unique_id``; hub
``HuggingFaceH4/MATH-500``. The gold answer is ``answer`` in the light normal form of
``deliberation_env.tasks.latex``. Extraction: the last ``\\boxed{}``, else the expression after
the last "final answer is" / "The answer is" / "Answer:" marker. Grading: mathematical
equivalence (``latex_equal``: normal forms, exact numbers, then math-verify under a time
limit). Difficulty is ``(level - 1) / 4``.
"""

from __future__ import annotations

import random
import re
from typing import Any

from deliberation_env.tasks.base import REFINE_PREAMBLE, VERDICT_CRITIC, Problem, Prompts
from deliberation_env.tasks.dataset import NO_ANSWER_TEXTS, DatasetTask, Source
from deliberation_env.tasks.extract import after_answer_marker, first_sentence, last_boxed
from deliberation_env.tasks.latex import latex_equal, normalize_latex

PROMPTS = Prompts(
    system="You are an expert mathematician.",
    solve=(
        "Solve the following math problem step by step. Put your final answer within \\boxed{{}}, "
        "in simplest form.\n\nProblem: {question}"
    ),
    refine=REFINE_PREAMBLE + "and put your final answer within \\boxed{{}}.",
    critic=VERDICT_CRITIC,
)

_INTEGER_RE = re.compile(r"\d{1,30}")
_CHOICE_RE = re.compile(r"\(([A-E])\)")
_CLAUSE_RE = re.compile(r"\s(?:because|since|as|which|where|so that|given|for)\b")
_WORD_RE = re.compile(r"[A-Za-z]{3,20}")
_NAME_RE = re.compile(r"(?<![\\A-Za-z])[A-Z][a-z]{2,19}(?![A-Za-z])")
_NOT_NAMES = frozenset(
    ["The", "Which", "What", "When", "Where", "Who", "How", "Find", "Let", "Suppose", "Each", "For", "There", "This", "That", "Then", "Compute", "Express", "Enter", "Give", "Determine", "Given", "Assume", "Consider"]
)
WORD_ANSWERS = ("even", "odd", "neither", "east", "west", "north", "south", "ellipse", "parabola", "hyperbola",
                "circle", "line")
_MAX_ANSWER_CHARS = 1000


def latex_answer(text: str) -> str | None:
    """The final LaTeX answer in ``text`` (normalised), or None; never raises."""
    try:
        found = last_boxed(text)
        if found is None:
            window = after_answer_marker(text)
            if window is None:
                return None
            window = window.strip("*_ ")
            if window.startswith("$"):
                end = window.find("$", 1)
                found = window[1:end] if end > 0 else window[1:]
            else:
                found = _CLAUSE_RE.split(first_sentence(window), maxsplit=1)[0]
            if "\\boxed" in found:  # an unclosed box: the output was cut off
                return None
        if len(found) > _MAX_ANSWER_CHARS:
            found = found[:_MAX_ANSWER_CHARS]
        answer = normalize_latex(found)
        return answer or None
    except Exception:
        return None


def perturbed_answers(gold: str, question: str) -> list[str]:
    """Wrong answers that look like the gold: a multiple-choice letter changed, one number
    changed (+1, -1, x2, +2), the sign flipped, or (for a word answer) another word of the
    question; normal forms, distinct, different from the gold."""
    candidates: list[str] = []
    choice = _CHOICE_RE.fullmatch(gold)
    if choice:
        candidates = [f"({letter})" for letter in "ABCDE" if letter != choice.group(1)]
    numbers = list(_INTEGER_RE.finditer(gold))
    for match in reversed(numbers[-2:]):
        value = int(match.group(0))
        for new in (value + 1, value - 1, value * 2, value + 2):
            if new >= 0:
                candidates.append(gold[: match.start()] + str(new) + gold[match.end() :])
    if numbers and gold.startswith("-"):
        candidates.append(gold[1:])
    elif numbers and "," not in gold and "\\" not in gold[:1]:
        candidates.append("-" + gold)
    if not numbers and not choice:
        if _WORD_RE.fullmatch(gold) and gold[0].isupper():  # a name: another name in the question
            candidates += [w for w in _NAME_RE.findall(question) if w != gold and w not in _NOT_NAMES]
        elif _WORD_RE.fullmatch(gold):
            candidates += [w for w in WORD_ANSWERS if w != gold]
        else:
            swapped = gold.replace("-", "+", 1) if "-" in gold[1:] else gold.replace("+", "-", 1)
            candidates += [swapped, f"2{gold}", f"-({gold})"]
    result: list[str] = []
    for candidate in candidates:
        normal = normalize_latex(candidate)
        if normal and normal != gold and normal not in result and not latex_equal(normal, gold):
            result.append(normal)
        if len(result) == 4:
            break
    return result


class MathTask(DatasetTask):
    """MATH-500; answers are LaTeX, graded by mathematical equivalence."""

    name = "math"
    sources = {"test": Source("math500/test.jsonl", "HuggingFaceH4/MATH-500", None, "test")}
    fields = {"problem": str, "answer": str}
    default_prompts = PROMPTS

    def __init__(self, data_dir: Any = None, *, timeout: float = 0.5, **kwargs: Any):
        super().__init__(data_dir, **kwargs)
        if not 0 < timeout <= 60:
            raise ValueError(f"timeout must be in (0, 60] seconds, got {timeout!r}")
        self.timeout = timeout
        self._distractors: dict[str, list[str]] = {}

    def make_problem(self, row: dict[str, Any], index: int, split: str) -> Problem:
        answer = normalize_latex(row["answer"])
        if not answer:
            raise ValueError("'answer' is empty")
        level = row.get("level")
        if level is not None and (isinstance(level, bool) or level not in (1, 2, 3, 4, 5)):
            raise ValueError(f"'level' should be an integer 1-5, got {level!r}")
        return Problem(
            id=str(row.get("unique_id") or f"math-{split}-{index}"),
            question=row["problem"].strip(),
            answer=answer,
            difficulty=(level - 1) / 4 if level is not None else None,
            metadata={key: row[key] for key in ("solution", "subject", "level", "answer") if key in row},
        )

    def extract_answer(self, text: str) -> str | None:
        return latex_answer(text) if isinstance(text, str) else None

    def grade(self, problem: Problem, answer: str | None) -> bool:
        return latex_equal(answer, problem.answer, self.timeout)

    def distractors(self, problem: Problem, rng: random.Random) -> list[str]:
        """Perturbations of the gold (``perturbed_answers``), computed once per problem."""
        if problem.id not in self._distractors:
            found = perturbed_answers(problem.answer, problem.question) or [f"{problem.answer}+1"]
            self._distractors[problem.id] = found
        return list(self._distractors[problem.id])

    def render_solution(self, problem: Problem, answer: str | None, rng: random.Random) -> str:
        if answer is None:
            return rng.choice(NO_ANSWER_TEXTS)
        subject = problem.metadata.get("subject", "this problem")
        return "\n".join((
            f"This is a {subject.lower()} problem; let me identify what is asked.",
            rng.choice(("I set up the relevant relations and simplify.", "I work through the algebra carefully.")),
            f"Therefore, the final answer is $\\boxed{{{answer}}}$.",
        ))
