"""The benchmark tasks on the real data files: gold answers, simulated round trips, distractors.

Uses the ``data_dir`` fixture (``$DELIBERATION_ENV_DATA``, else the default folder named in tests/conftest.py).

MATH-500 exceptions (gold solution's last ``\\boxed{}`` not equivalent to its ``answer``):
none with the current normalisation and math-verify 0.9 (500/500 equivalent). The test
accepts up to 1% and prints any exception with its reason, so a change shows up in the log.
"""

from __future__ import annotations

import random
from functools import cache

import pytest

from deliberation_env import TASKS
from deliberation_env.tasks.extract import is_text
from deliberation_env.tasks.latex import normalize_latex

SPLITS = {"gsm8k": ("train", "test"), "math": ("test",), "aime24": ("test",), "amc23": ("test",), "mmlu": ("test",)}
COUNTS = {("gsm8k", "train"): 7473, ("gsm8k", "test"): 1319, ("math", "test"): 500, ("aime24", "test"): 30,
          ("amc23", "test"): 40, ("mmlu", "test"): 3018}


@cache
def _task(name: str, data_dir: str):
    return TASKS.make(name, data_dir=data_dir)


@pytest.fixture
def task(request, data_dir):
    return _task(request.param, str(data_dir))


@pytest.mark.parametrize(("name", "split"), sorted(COUNTS))
def test_every_row_loads_with_the_documented_count(name, split, data_dir):
    problems = _task(name, str(data_dir)).problems(split)
    assert len(problems) == COUNTS[name, split]
    assert len({p.id for p in problems}) == len(problems)
    assert all(p.question.strip() and p.answer for p in problems)
    assert all(p.difficulty is None or 0.0 <= p.difficulty <= 1.0 for p in problems)


@pytest.mark.parametrize("split", ["train", "test"])
def test_gsm8k_gold_solutions_extract_and_grade_correct(split, data_dir):
    task = _task("gsm8k", str(data_dir))
    problems = task.problems(split)
    extracted = [task.extract_answer(p.metadata["solution"]) for p in problems]
    mismatches = [(p.id, e, p.answer) for p, e in zip(problems, extracted) if e != p.answer]
    assert mismatches == []
    assert all(task.grade(p, e) for p, e in zip(problems, extracted))
    assert len(extracted) == COUNTS["gsm8k", split]
    assert "," not in "".join(p.answer for p in problems)  # "1,080" was normalised to "1080"


def test_gsm8k_gold_is_numeric_equal_to_the_raw_final_line(data_dir):
    task = _task("gsm8k", str(data_dir))
    for problem in task.problems("test"):
        raw = problem.metadata["solution"].rsplit("####", 1)[1].strip()
        assert task.grade(problem, raw.replace(",", "")) and task.grade(problem, raw)


def test_math500_gold_boxed_is_equivalent_to_answer_for_99_percent(data_dir):
    task = _task("math", str(data_dir))
    problems = task.problems("test")
    exceptions = []
    for problem in problems:
        boxed = task.extract_answer(problem.metadata["solution"])
        if not task.grade(problem, boxed):
            exceptions.append((problem.id, problem.metadata["answer"], boxed))
    print(f"MATH-500: {len(problems) - len(exceptions)}/{len(problems)} equivalent; exceptions: {exceptions}")
    assert len(exceptions) <= len(problems) // 100
    assert [p.difficulty for p in problems[:3]] == [(p.metadata["level"] - 1) / 4 for p in problems[:3]]


def test_math500_normal_form_is_idempotent_on_gold(data_dir):
    for problem in _task("math", str(data_dir)).problems("test"):
        assert normalize_latex(problem.answer) == problem.answer
        assert normalize_latex(problem.metadata["answer"]) == problem.answer


@pytest.mark.parametrize("name", ["aime24", "amc23"])
def test_competition_gold_right_and_wrong_answers(name, data_dir):
    task = _task(name, str(data_dir))
    for problem in task.problems("test"):
        gold = problem.answer
        assert task.grade(problem, gold)
        assert task.grade(problem, task.extract_answer(f"Thus the answer is $\\boxed{{{gold}}}$."))
        assert task.grade(problem, f"{gold}.0")
        assert not task.grade(problem, str(int(float(gold)) + 1))
        assert not task.grade(problem, None)
        if name == "aime24":
            assert gold.isdigit() and 0 <= int(gold) <= 999


def test_aime_gold_with_leading_zeros_is_normalised(data_dir):
    problems = _task("aime24", str(data_dir)).problems("test")
    by_id = {p.id: p for p in problems}
    assert by_id["aime24-67"].answer == "25"  # stored as "025"
    assert all(not p.answer.startswith("0") or p.answer == "0" for p in problems)


def test_mmlu_gold_letters_right_and_other_letters_wrong(data_dir):
    task = _task("mmlu", str(data_dir))
    problems = task.problems("test")
    assert {p.answer for p in problems} == {"A", "B", "C", "D"}
    for problem in problems:
        assert task.grade(problem, problem.answer)
        assert task.grade(problem, f"({problem.answer})")
        assert sum(task.grade(problem, letter) for letter in "ABCD") == 1
        for letter, choice in zip("ABCD", problem.metadata["choices"]):
            assert f"({letter}) {choice}" in problem.question


@pytest.mark.parametrize(("name", "split"), sorted(COUNTS))
def test_sim_round_trip_and_distractors_on_every_problem(name, split, data_dir):
    """render_solution -> extract_answer recovers the answer exactly (gold, each distractor, None);
    distractors are 1-4 distinct wrong answers, the same for the same problem."""
    task = _task(name, str(data_dir))
    for problem in task.problems(split):
        distractors = task.distractors(problem, random.Random(problem.id))
        assert 1 <= len(distractors) <= 4 and len(set(distractors)) == len(distractors), (problem.id, distractors)
        assert distractors == task.distractors(problem, random.Random(0))
        assert problem.answer not in distractors
        rng = random.Random(problem.id)
        for answer in (problem.answer, *distractors, None):
            text = task.render_solution(problem, answer, rng)
            assert task.extract_answer(text) == answer, (problem.id, answer, text)
        assert task.grade(problem, problem.answer)
        assert not any(task.grade(problem, d) for d in distractors), (problem.id, distractors)


LONE_SURROGATE_TEMPLATES = [  # {gold}: the problem's gold answer, so that only the surrogate makes it wrong
    "\ud800",
    "{gold}\ud800",
    "\udfff{gold}",
    "The answer is {gold}\ud800",
    "\\boxed{{{gold}\udc80}}",
    "#### {gold}\udfff",
    "The answer is ({gold}\ud800)",
    "```python\n{gold}\n# \ud800\n```",
    "\ud800" * 5000 + "{gold}",
]


@pytest.mark.parametrize("name", TASKS.names())
def test_every_task_survives_text_with_lone_surrogates(name, data_dir):
    """Such text (which UTF-8 cannot encode) never crashes an extractor or grader, and graded as an
    answer it is wrong, even when it holds the gold answer."""
    task = TASKS.make(name, data_dir=str(data_dir))
    problem = task.problems("test")[0]
    assert task.grade(problem, problem.answer) is True
    for template in LONE_SURROGATE_TEMPLATES:
        text = template.format(gold=problem.answer)
        assert task.grade(problem, text) is False, text
        extracted = task.extract_answer(text)  # may recover a clean answer, or None
        assert extracted is None or isinstance(extracted, str), (text, extracted)
        graded = task.grade(problem, extracted)
        assert isinstance(graded, bool), (text, extracted)
        if extracted is not None and not is_text(extracted):
            assert graded is False, (text, extracted)
