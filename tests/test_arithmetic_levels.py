"""Arithmetic task: levels 1-5 stay exactly as they were, level 0 (one step), the no-code prompt."""

from __future__ import annotations

import hashlib

import pytest

from deliberation_env.tasks.arithmetic import ArithmeticTask

# Digests of every problem's id, text, answer and difficulty, taken before level 0 existed. The
# determinism tests and the benchmark tables depend on these problems not changing by one character.
PINNED_DIGESTS = {
    (1, 2, 3, 4, 5): ("b709f0af921e699e", "da19ec77c702bb44"),
    (1,): ("53378079f37e0bf4", "d47d6c5e9ee7751e"),
    (2, 4): ("94870f8ae6364526", "ba733b558c4d6dc5"),
    (5, 3): ("290fa4927ee3ef83", "62790e10840f0dcc"),
}


def _digest(task: ArithmeticTask, split: str) -> str:
    digest = hashlib.sha256()
    for problem in task.problems(split):
        digest.update(f"{problem.id}|{problem.question}|{problem.answer}|{problem.difficulty}\n".encode())
    return digest.hexdigest()[:16]


@pytest.mark.parametrize("levels", sorted(PINNED_DIGESTS))
def test_existing_levels_generate_the_same_problems(levels):
    assert (_digest(ArithmeticTask(levels=levels), "train"), _digest(ArithmeticTask(levels=levels), "test")) == (
        PINNED_DIGESTS[levels]
    )


def test_default_split_is_pinned_by_text():
    default = ArithmeticTask()
    assert default.levels == (1, 2, 3, 4, 5)
    assert (_digest(default, "train"), _digest(default, "test")) == PINNED_DIGESTS[(1, 2, 3, 4, 5)]
    assert _digest(ArithmeticTask(num_problems=7), "test") == "091f36255c424548"
    second = default.problems("test")[1]
    assert second.question == (
        "Jonas has 121 stamps. Jonas finds 28 more stamps. Jonas buys 6 packs with 5 stamps in each. "
        "Jonas finds 31 more stamps. Jonas's pile of stamps grows to 2 times its size. "
        "How many stamps does Jonas have now?"
    )
    assert (second.answer, second.metadata["level"]) == ("420", 3)
    first_level_one = ArithmeticTask(levels=(1,)).problems("train")[0]
    assert first_level_one.question == (
        "Hiro has 5 marbles. Hiro finds 9 more marbles. Hiro gives away 2 marbles. How many marbles does Hiro have now?"
    )
    assert first_level_one.answer == "12"


def test_default_prompts_are_unchanged():
    prompts = ArithmeticTask().prompts
    assert prompts.solve == (
        "Solve the problem step by step. End with a line 'The answer is N' where N is an integer.\n\n"
        "Problem: {question}"
    )
    assert prompts.refine.endswith("Solve it again step by step and end with a line 'The answer is N'.")
