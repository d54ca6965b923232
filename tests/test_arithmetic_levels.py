"""Arithmetic task: levels 1-5 stay exactly as they were, level 0 (one step), the no-code prompt."""

from __future__ import annotations

import hashlib

import pytest

import deliberation_env
from deliberation_env.tasks.arithmetic import ArithmeticTask
from deliberation_env.tasks.base import PeerView

# Digests of every problem's id, text, answer and difficulty, taken before level 0 existed. The
# determinism tests and the benchmark tables depend on these problems not changing by one character.
# One exception, on purpose: level 1 alone repeated a question in train (arithmetic-train-1866), which is now
# drawn again (unique splits); with unique=False the old digest still holds (test below).
PINNED_DIGESTS = {
    (1, 2, 3, 4, 5): ("b709f0af921e699e", "da19ec77c702bb44"),
    (1,): ("a36a5bc9679b295b", "d47d6c5e9ee7751e"),
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


def test_without_unique_level_one_is_what_it_was():
    old = ArithmeticTask(levels=(1,), unique=False)
    assert (_digest(old, "train"), _digest(old, "test")) == ("53378079f37e0bf4", "d47d6c5e9ee7751e")
    new = ArithmeticTask(levels=(1,))
    changed = [p.id for p, q in zip(new.problems("train"), old.problems("train")) if p.question != q.question]
    assert changed == ["arithmetic-train-1866"]


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


def test_level_zero_is_one_operation_on_small_numbers():
    task = ArithmeticTask(levels=(0,))
    problems = task.problems("test")
    assert len(problems) == 500
    ops = set()
    for problem in problems:
        steps = problem.metadata["steps"]
        assert problem.metadata["level"] == 0 and problem.difficulty == 0.0 and len(steps) == 1
        (op, amount, _, after), start = steps[0], problem.metadata["start"]
        assert 5 <= start <= 30 and op != "packs"
        assert problem.question.count(".") == 2 and problem.question.endswith("have now?")
        expected = {"add": start + amount, "remove": start - amount, "multiply": start * amount,
                    "share": start // amount}[op]
        assert int(problem.answer) == after == expected >= 1
        assert task.grade(problem, task.extract_answer(task.render_solution(problem, problem.answer, None)))
        ops.add(op)
    assert ops == {"add", "remove", "multiply", "share"}
    # level 0 mixes with the others without touching them: a (0, 1) split has both kinds
    mixed = {p.metadata["level"] for p in ArithmeticTask(levels=(0, 1)).problems("test")}
    assert mixed == {0, 1}


def test_level_zero_episode_through_env_options():
    env = deliberation_env.parallel_env(task="arithmetic", task_kwargs={"levels": [0], "prompt": "no_code"},
                                        backend="sim", max_rounds=2)
    observations, infos = env.reset(seed=3)
    assert env.task.levels == (0,) and env.deliberation.problem.metadata["level"] == 0
    while env.agents:
        observations, _, _, _, infos = env.step({agent: 1 for agent in env.agents})  # everyone refines
    assert all(isinstance(info["correct"], bool) for info in infos.values())


def test_no_code_prompt_applies_to_solve_and_refine_only():
    default, no_code = ArithmeticTask(), ArithmeticTask(prompt="no_code")
    problem = default.problems("test")[0]
    solve = no_code.solve_messages(problem)[-1].content
    assert "do not write code" in solve and problem.question in solve and "'The answer is N'" in solve
    assert "code" not in default.solve_messages(problem)[-1].content
    refine = no_code.refine_messages(problem, "It is 3.", [PeerView("4", "I added.")])[-1].content
    assert "do not write code" in refine and "Agent 1 answered 4" in refine
    assert no_code.critic_messages(problem, "x") == default.critic_messages(problem, "x")
    assert no_code.prompts.system == default.prompts.system
    # the prompt changes what is asked, never which problems are asked
    assert [p.question for p in no_code.problems("test")] == [p.question for p in default.problems("test")]


@pytest.mark.parametrize("levels", [(), (6,), (-1,), (1, 7), 3, "12", (True,), (1.0,), None, [0, "1"]])
def test_bad_levels_are_named(levels):
    with pytest.raises(ValueError, match=r"integers from 0 to 5.*got"):
        ArithmeticTask(levels=levels)


def test_levels_accept_any_integer_sequence_with_the_same_problems():
    numpy = pytest.importorskip("numpy")
    as_numpy = ArithmeticTask(levels=numpy.array([1, 2]))
    assert as_numpy.levels == (1, 2)
    assert as_numpy.problems("test") == ArithmeticTask(levels=[1, 2]).problems("test")


def test_bad_prompt_is_named():
    with pytest.raises(ValueError, match=r"prompt must be one of \['default', 'no_code', 'program'\], got 'nocode'"):
        ArithmeticTask(prompt="nocode")
