"""Jigsaw arithmetic: a problem whose numbers are split between the agents, so no agent can solve it alone.

Each problem names ``parts`` people (2 or 3) who each hold some items; the question, which every agent sees,
asks for something about all of them together, and each person's count is known to one agent only. An agent's
view is its role's prompt style (``core.roles``): ``view_k`` shows the shared question and person k's count, so a
team needs ``roles=[{"prompt": "view_0"}, {"prompt": "view_1"}]`` (``JIGSAW_TEAM``). The first turn can only be
guessed; the refine turn shows each agent its peers' answers and the end of their solutions, so the team is right
only when an agent writes what it knows and a peer uses it: a task that needs cooperation, unlike ``arithmetic``,
which any one agent can solve alone. ``full`` (the default, and what a team without roles gets) shows every count:
the same problems with nothing to share, the control.

| level | question (every count 10-99)                                                         | answer           |
|-------|--------------------------------------------------------------------------------------|------------------|
| 0     | they put their items together: how many in all?                                     | sum              |
| 1     | ... and share them equally into k boxes (k shown to all): how many in one box?      | sum / k (exact)  |
| 2     | ... and then buy p packs of q more (p, q shown to all): how many in all?             | sum + p * q      |

Splits: ``train`` (2,000) and ``test`` (500), seeded, disjoint and free of repeats. The simulated backend's
distractors are the answers of an agent that used only its own count (or only some of them).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from dataclasses import replace

from deliberation_env.tasks.arithmetic import ITEMS, NAMES
from deliberation_env.tasks.base import VERDICT_CRITIC, BaseTask, Problem, Prompts, unknown_split
from deliberation_env.tasks.numeric import extract_number, numbers_equal

LEVELS = (0, 1, 2)
SPLITS = {"train": (0, 2000), "test": (1, 500)}

FULL_PROMPTS = Prompts(
    system="You are a careful math assistant.",
    solve=(
        "Solve the problem step by step. End with a line 'The answer is N' where N is an integer.\n\n"
        "Problem: {question}\nWhat is known: {known}"
    ),
    refine=(
        "Problem: {question}\nWhat is known: {known}\n\nYour previous solution:\n{own_solution}\n\n"
        "Other agents' answers:\n{peer_solutions}\n\n"
        "Re-examine the problem using their reasoning where it helps. Solve it again step by step "
        "and end with a line 'The answer is N'."
    ),
    critic=VERDICT_CRITIC,
)


def view_prompts(part: int) -> Prompts:
    """The prompts of the agent that knows person ``part``'s count alone."""
    return replace(
        FULL_PROMPTS,
        solve=(
            "You are one of a team of agents. Each of you knows a different part of the problem, and your "
            "teammates will read the end of your solution. Write down what you know; do not make up what you do "
            "not know. Then give your best answer, ending with a line 'The answer is N' where N is an integer.\n\n"
            f"Problem: {{question}}\nWhat only you know: {{private_{part}}}"
        ),
        refine=(
            f"Problem: {{question}}\nWhat only you know: {{private_{part}}}\n\n"
            "Your previous solution:\n{own_solution}\n\n"
            "Your teammates' answers:\n{peer_solutions}\n\n"
            "Your teammates know what you do not: take the numbers you lack from their reasoning above. Solve the "
            "problem again step by step and end with a line 'The answer is N'."
        ),
    )


JIGSAW_TEAM = ({"name": "view_0", "prompt": "view_0"}, {"name": "view_1", "prompt": "view_1"})
"""The 2-agent team of a 2-part jigsaw (``roles=JIGSAW_TEAM``)."""


def answer_of(extra: dict, counts: Sequence[int]) -> int:
    """The answer to a problem with these counts and level terms (``boxes``; or ``packs`` of ``size``)."""
    total = sum(counts)
    if "boxes" in extra:
        return total // extra["boxes"]
    return total + extra.get("packs", 0) * extra.get("size", 0)


def generate_problem(rng: random.Random, level: int, parts: int, index: int, split: str) -> Problem:
    """One seeded problem of ``level`` (0-2) split ``parts`` ways."""
    names, item = rng.sample(NAMES, parts), rng.choice(ITEMS)
    counts = [rng.randint(10, 99) for _ in range(parts)]
    total = sum(counts)
    together = f"{', '.join(names[:-1])} and {names[-1]} put their {item} together."
    if level == 0:
        question = f"{together} How many {item} do they have in all?"
        extra: dict = {}
    elif level == 1:
        boxes = rng.choice([k for k in range(2, 10) if total % k == 0] or [1])
        if boxes == 1:  # a prime-ish total: add one item to the last count so that it splits
            counts[-1] += 1
            total += 1
            boxes = rng.choice([k for k in range(2, 10) if total % k == 0])
        question = f"{together} They share them equally into {boxes} boxes. How many {item} are in one box?"
        extra = {"boxes": boxes}
    else:
        packs, size = rng.randint(2, 6), rng.randint(2, 9)
        question = f"{together} Then they buy {packs} packs with {size} {item} in each. How many {item} do they have now?"
        extra = {"packs": packs, "size": size}
    private = [f"{name} has {count} {item}." for name, count in zip(names, counts)]
    return Problem(id=f"jigsaw-{split}-{index}", question=question, answer=str(answer_of(extra, counts)),
                   difficulty=level / 2,
                   metadata={"level": level, "counts": counts, "names": names, "item": item, "private": private,
                             **extra})


@functools.lru_cache(maxsize=16)
def _generate_split(split: str, levels: tuple[int, ...], parts: int) -> tuple[Problem, ...]:
    """A split's problems; a question seen earlier in it, or in an earlier split, is drawn again."""
    seen: set[tuple] = set()
    for earlier in list(SPLITS)[:list(SPLITS).index(split)]:
        seen.update(_identity(p) for p in _generate_split(earlier, levels, parts))
    seed, count = SPLITS[split]
    rng = random.Random(f"jigsaw/{split}/{seed}/{levels}/{parts}")
    problems = []
    for index in range(count):
        problem = generate_problem(rng, rng.choice(levels), parts, index, split)
        redraw = random.Random(f"jigsaw/{split}/{seed}/{levels}/{parts}/{index}/redraw")
        while _identity(problem) in seen:
            problem = generate_problem(redraw, redraw.choice(levels), parts, index, split)
        seen.add(_identity(problem))
        problems.append(problem)
    return tuple(problems)


def _identity(problem: Problem) -> tuple:
    return problem.question, tuple(problem.metadata["private"])


class JigsawTask(BaseTask):
    """Arithmetic whose counts are split between the agents (see the module docstring).

    ``levels``: which levels (0-2) a split draws from; ``parts``: people per problem, one count each (2 or 3);
    ``prompt``: ``"full"`` (every count shown) or ``"view_k"`` (person k's count alone), the style of every agent
    that has no role of its own.
    """

    name = "jigsaw"

    def __init__(self, data_dir: object = None, levels: Sequence[int] = (0, 1), parts: int = 2,
                 num_problems: int | None = None, prompt: str = "full"):
        if isinstance(levels, (int, str)) or not levels or any(level not in LEVELS or isinstance(level, bool)
                                                               for level in levels):
            raise ValueError(f"jigsaw levels must be a non-empty sequence of 0, 1 and 2, got {levels!r}")
        self.levels = tuple(int(level) for level in levels)
        if parts not in (2, 3) or isinstance(parts, bool):
            raise ValueError(f"jigsaw parts must be 2 or 3 (people whose counts are split), got {parts!r}")
        if num_problems is not None and num_problems < 1:
            raise ValueError(f"num_problems must be >= 1, got {num_problems}")
        self.parts, self.num_problems = parts, num_problems
        self.prompt_styles = {"full": FULL_PROMPTS, **{f"view_{k}": view_prompts(k) for k in range(parts)}}
        if prompt not in self.prompt_styles:
            raise ValueError(f"jigsaw prompt must be one of {sorted(self.prompt_styles)}, got {prompt!r}")
        self.prompt = prompt
        self.prompts = self.prompt_styles[prompt]

    def problems(self, split: str) -> Sequence[Problem]:
        if split not in SPLITS:
            raise unknown_split("jigsaw", list(SPLITS), split)
        problems = _generate_split(split, self.levels, self.parts)
        return problems[:self.num_problems] if self.num_problems else problems

    def prompt_fields(self, problem: Problem) -> dict[str, str]:
        private = problem.metadata["private"]
        return {"question": problem.question, "known": " ".join(private),
                **{f"private_{k}": text for k, text in enumerate(private)}}

    def extract_answer(self, text: str) -> str | None:
        return extract_number(text)

    def grade(self, problem: Problem, answer: str | None) -> bool:
        return numbers_equal(answer, problem.answer)

    def distractors(self, problem: Problem, rng: random.Random) -> list[str]:
        """What an agent that used only some of the counts would answer."""
        meta, gold = problem.metadata, int(problem.answer)
        wrong = [answer_of(meta, [c if i == k else 0 for i, c in enumerate(meta["counts"])])
                 for k in range(len(meta["counts"]))]
        unique = list(dict.fromkeys(w for w in wrong if w != gold))
        return [str(w) for w in unique] or [str(gold + 1)]

    def render_solution(self, problem: Problem, answer: str | None, rng: random.Random) -> str:
        if answer is None:
            return "I do not know everyone's count, so I cannot give a final answer."
        return f"{' '.join(problem.metadata['private'])}\nThe answer is {answer}."
