"""Procedural multi-step arithmetic word problems (the embedded default task).

Needs no data and no network. Each problem starts from a quantity and applies
``level + 1`` operations (add, remove, multiply, share equally, buy packs); the answer is
an integer. Levels 1-5 set the number of steps and the size of the numbers. Level 0 is one
operation (add, remove, multiply or share) on small numbers, for small real models; it is not
in the default ``levels``. A split is a fixed, seeded list: ``train`` (2,000 problems) and
``test`` (500), with levels drawn uniformly; no question appears twice, within a split or across them.

``prompt="no_code"`` asks for a solution in words and arithmetic instead of code (small coder
models otherwise often write a program and never state the result); ``prompt="program"`` asks for a Python
program that prints the answer, for a program-aided role (``Role(prompt="program", tool="python")``, whose
program the sandbox runs).

Distractors (for the simulated backend) are the answers of typical slips: skipping the
last step, reversing one add/remove, off-by-one in a pack count.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterable, Sequence
from dataclasses import replace
from numbers import Integral

from deliberation_env.tasks.base import VERDICT_CRITIC, BaseTask, Problem, Prompts, unknown_split
from deliberation_env.tasks.numeric import extract_number, numbers_equal

NAMES = ("Ava", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hiro", "Iris", "Jonas")
ITEMS = ("apples", "marbles", "books", "coins", "stickers", "pencils", "shells", "stamps")

PROMPTS = Prompts(
    system="You are a careful math assistant.",
    solve=(
        "Solve the problem step by step. End with a line 'The answer is N' where N is an integer.\n\n"
        "Problem: {question}"
    ),
    refine=(
        "Problem: {question}\n\nYour previous solution:\n{own_solution}\n\n"
        "Other agents' answers:\n{peer_solutions}\n\n"
        "Re-examine the problem using their reasoning where it helps. Solve it again step by step "
        "and end with a line 'The answer is N'."
    ),
    critic=VERDICT_CRITIC,
)
NO_CODE_PROMPTS = replace(
    PROMPTS,
    solve=(
        "Solve the problem step by step in words and arithmetic; do not write code. End with a line "
        "'The answer is N' where N is an integer.\n\nProblem: {question}"
    ),
    refine=PROMPTS.refine.replace(
        "Solve it again step by step and", "Solve it again step by step in words and arithmetic (do not write code) and"
    ),
)
PROGRAM_PROMPTS = replace(
    PROMPTS,
    solve=(
        "Write a short Python program that computes the answer to the problem and prints it (only the number). "
        "Reply with the program alone, in one ```python code block.\n\nProblem: {question}"
    ),
    refine=(
        "Problem: {question}\n\nYour previous solution:\n{own_solution}\n\n"
        "Other agents' answers:\n{peer_solutions}\n\n"
        "Re-examine the problem using their reasoning where it helps. Write a short Python program that computes "
        "the answer and prints it (only the number), in one ```python code block."
    ),
)
PROMPT_STYLES = {"default": PROMPTS, "no_code": NO_CODE_PROMPTS, "program": PROGRAM_PROMPTS}
LEVELS = (0, 1, 2, 3, 4, 5)
ALL_OPS = ("add", "remove", "multiply", "share", "packs")
ONE_STEP_OPS = ("add", "remove", "multiply", "share")  # packs is two operations (x * y, then add)

SPLITS = {"train": (0, 2000), "test": (1, 500)}


def _apply(value: int, op: str, x: int, y: int) -> int:
    if op == "add":
        return value + x
    if op == "remove":
        return value - x
    if op == "multiply":
        return value * x
    if op == "share":
        return value // x
    return value + x * y  # packs


def _describe(op: str, name: str, item: str, x: int, y: int) -> str:
    return {
        "add": f"{name} finds {x} more {item}.",
        "remove": f"{name} gives away {x} {item}.",
        "multiply": f"{name}'s pile of {item} grows to {x} times its size.",
        "share": f"{name} splits the {item} equally into {x} boxes and keeps one box.",
        "packs": f"{name} buys {x} packs with {y} {item} in each.",
    }[op]


def generate_problem(rng: random.Random, level: int, index: int, split: str) -> Problem:
    """One seeded problem of the given level (0-5).

    Levels 1-5 draw exactly the random numbers they always drew, so their problems never change.
    """
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    ops: tuple[str, ...]
    if level == 0:  # one step, start 5-30, added/removed amounts 2-12
        step_count, max_start, max_amount, ops = 1, 30, 12, ONE_STEP_OPS
    else:
        scale = 10 * level
        step_count, max_start, max_amount, ops = level + 1, 5 + 4 * scale, 2 + scale, ALL_OPS
    value = rng.randint(5, max_start)
    start = value
    steps: list[tuple[str, int, int, int]] = []  # (op, x, y, value after)
    for _ in range(step_count):
        op = rng.choice(ops)
        x, y = rng.randint(2, max_amount), 0
        if op == "multiply":
            x = rng.randint(2, 4)
        elif op == "share":
            divisors = [d for d in range(2, 10) if value % d == 0 and value // d >= 2]
            if not divisors:
                op = "add"
            else:
                x = rng.choice(divisors)
        elif op == "remove" and value - x < 1:
            op = "add"
        elif op == "packs":
            x, y = rng.randint(2, 6), rng.randint(2, 3 + level * 2)
        value = _apply(value, op, x, y)
        steps.append((op, x, y, value))
    sentences = [f"{name} has {start} {item}."]
    sentences += [_describe(op, name, item, x, y) for op, x, y, _ in steps]
    sentences.append(f"How many {item} does {name} have now?")
    return Problem(
        id=f"arithmetic-{split}-{index}",
        question=" ".join(sentences),
        answer=str(value),
        difficulty=max(0, level - 1) / 4,  # level 0 shares level 1's 0.0 (difficulty stays in [0, 1])
        metadata={"level": level, "start": start, "steps": steps, "name": name, "item": item},
    )


def _checked_levels(levels: object) -> tuple[int, ...]:
    """``levels`` as a tuple of plain ints (it is part of each split's seed), or a ValueError."""
    items = None if isinstance(levels, (Integral, str)) or not isinstance(levels, Iterable) else tuple(levels)
    if not items or any(isinstance(v, bool) or not isinstance(v, Integral) or v not in LEVELS for v in items):
        raise ValueError(
            f"arithmetic levels must be a non-empty sequence of integers from 0 to 5, e.g. (0,) or (1, 2, 3, 4, 5); "
            f"got {levels!r}"
        )
    return tuple(int(level) for level in items)


@functools.lru_cache(maxsize=16)
def _generate_split(split: str, seed: int, count: int, levels: tuple[int, ...], unique: bool = True
                    ) -> tuple[Problem, ...]:
    """A split's problems, generated once per process (every env of a vector of envs asks for the same split).

    With ``unique`` a problem whose question came earlier in the split, or anywhere in an earlier split of
    ``SPLITS`` (train before test), is drawn again from a generator of its own, so the splits are disjoint and free
    of repeats while every other problem stays what it always was."""
    rng = random.Random(f"arithmetic/{split}/{seed}/{levels}")
    seen: set[str] = set()
    if unique:
        for earlier in list(SPLITS)[:list(SPLITS).index(split)]:
            seen.update(p.question for p in _generate_split(earlier, SPLITS[earlier][0], SPLITS[earlier][1], levels))
    problems = []
    for index in range(count):
        problem = generate_problem(rng, rng.choice(levels), index, split)
        redraw = random.Random(f"arithmetic/{split}/{seed}/{levels}/{index}/redraw")
        while unique and problem.question in seen:
            problem = generate_problem(redraw, redraw.choice(levels), index, split)
        seen.add(problem.question)
        problems.append(problem)
    return tuple(problems)


class ArithmeticTask(BaseTask):
    """Seeded multi-step integer word problems; exact grading.

    ``levels``: which levels (0-5) a split draws from, uniformly; ``prompt``: ``"default"``, ``"no_code"`` (solve and
    refine ask for words and arithmetic, not code) or ``"program"`` (a Python program that prints the answer); ``unique``: splits disjoint and free of
    repeated questions (False only to read replay sets recorded before repeats were drawn again).
    """

    name = "arithmetic"
    prompt_styles = PROMPT_STYLES

    def __init__(self, data_dir: object = None, levels: Sequence[int] = (1, 2, 3, 4, 5), num_problems: int | None = None,
                 prompt: str = "default", unique: bool = True):
        self.levels = _checked_levels(levels)
        if not isinstance(unique, bool):
            raise ValueError(f"arithmetic unique must be True or False, got {unique!r}")
        self.unique = unique
        if num_problems is not None and num_problems < 1:
            raise ValueError(f"num_problems must be >= 1, got {num_problems}")
        if prompt not in PROMPT_STYLES:
            raise ValueError(f"arithmetic prompt must be one of {sorted(PROMPT_STYLES)}, got {prompt!r}")
        self.num_problems = num_problems
        self.prompt = prompt
        self.prompts = PROMPT_STYLES[prompt]
        self._splits: dict[str, list[Problem]] = {}
        self._rendered: dict[tuple[str, str], str] = {}

    def problems(self, split: str) -> Sequence[Problem]:
        if split not in SPLITS:
            raise unknown_split("arithmetic", list(SPLITS), split)
        if split not in self._splits:
            seed, count = SPLITS[split]
            self._splits[split] = list(_generate_split(split, seed, self.num_problems or count, self.levels,
                                                       self.unique))
        return self._splits[split]

    def extract_answer(self, text: str) -> str | None:
        return extract_number(text)

    def grade(self, problem: Problem, answer: str | None) -> bool:
        return numbers_equal(answer, problem.answer)

    def distractors(self, problem: Problem, rng: random.Random) -> list[str]:
        steps, value0 = problem.metadata["steps"], problem.metadata["start"]
        candidates: list[int] = []
        if len(steps) > 1:
            candidates.append(steps[-2][3])  # forgot the last step
        for slip in range(len(steps)):  # one step done wrong
            value = value0
            for index, (op, x, y, _) in enumerate(steps):
                if index == slip:
                    op, x = {"add": ("remove", x), "remove": ("add", x), "multiply": ("add", x),
                             "share": ("remove", x), "packs": ("packs", x + 1)}[op]
                value = _apply(value, op, x, y)
            candidates.append(value)
        gold = int(problem.answer)
        unique = list(dict.fromkeys(c for c in candidates if c != gold))
        return [str(c) for c in unique[:4]] or [str(gold + 1)]

    def render_solution(self, problem: Problem, answer: str | None, rng: random.Random) -> str:
        if answer is None:  # no numbers at all, so nothing can be extracted
            return "I tried to track the quantities but lost count, so I cannot give a final answer."
        key = (problem.id, answer)
        if key not in self._rendered:
            if len(self._rendered) > 20_000:
                self._rendered.clear()
            self._rendered[key] = self._render(problem, answer)
        return self._rendered[key]

    @staticmethod
    def _render(problem: Problem, answer: str) -> str:
        meta = problem.metadata
        lines = [f"Start: {meta['start']} {meta['item']}."]
        value = meta["start"]
        last = len(meta["steps"])
        for number, (op, x, y, after) in enumerate(meta["steps"], start=1):
            symbol = {"add": f"+ {x}", "remove": f"- {x}", "multiply": f"* {x}", "share": f"/ {x}",
                      "packs": f"+ {x} * {y}"}[op]
            # A wrong answer is a slip in the last step, written in the same shape as a right one,
            # so that the text's form (lines, '=' signs) does not give correctness away.
            shown = answer if number == last else after
            lines.append(f"Step {number}: {value} {symbol} = {shown}.")
            value = after
        lines.append(f"The answer is {answer}.")
        return "\n".join(lines)
