"""The HumanEval task: loading, extraction on realistic LLM replies, sandboxed grading, sim support."""

from __future__ import annotations

import gzip
import json
import math
import random
import sys

import numpy as np
import pytest

import deliberation_env
from deliberation_env.tasks import humaneval
from deliberation_env.tasks.base import PeerView
from deliberation_env.tasks.humaneval import HumanEvalTask, build_program, normalize_code

FILE = "humaneval/HumanEval.jsonl.gz"


@pytest.fixture(scope="module")
def task(data_dir) -> HumanEvalTask:
    assert (data_dir / FILE).is_file(), f"{data_dir / FILE} is missing"
    return HumanEvalTask(data_dir=data_dir)


@pytest.fixture(scope="module")
def problems(task):
    return {p.id: p for p in task.problems("test")}


# ------------------------------------------------------------------------------------ data
def test_loads_all_164_problems(task, problems):
    assert len(problems) == 164 and list(problems)[:2] == ["HumanEval/0", "HumanEval/1"]
    strlen = problems["HumanEval/23"]
    assert strlen.question.startswith("\n\ndef strlen(string: str) -> int:")
    assert strlen.answer == normalize_code(strlen.question + "    return len(string)\n")
    assert strlen.metadata["entry_point"] == "strlen" and "def check(candidate)" in strlen.metadata["test"]
    assert len(HumanEvalTask(data_dir=task.data_dir, num_problems=3).problems("test")) == 3


def test_bad_split_and_bad_files(task, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"splits \['test'\].*'train'"):
        task.problems("train")
    (tmp_path / "humaneval").mkdir()
    good = {"task_id": "T/0", "prompt": "def f():\n", "canonical_solution": "    return 1\n",
            "test": "def check(c):\n    assert c() == 1\n", "entry_point": "f"}
    bad_rows = {
        "invalid JSON": [json.dumps(good), "{oops"],
        r"missing or non-string field\(s\) \['test'\]": [json.dumps(good), json.dumps({**good, "test": 3})],
        "expected a JSON object": [json.dumps([1, 2])],
    }
    path = tmp_path / FILE
    for message, lines in bad_rows.items():
        with gzip.open(path, "wt") as handle:
            handle.write("\n".join(lines) + "\n")
        with pytest.raises(ValueError, match=rf"HumanEval\.jsonl\.gz:{len(lines)}: {message}"):
            HumanEvalTask(data_dir=tmp_path).problems("test")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="DELIBERATION_ENV_DATA.*humaneval/HumanEval.jsonl.gz.*openai_humaneval"):
        HumanEvalTask(data_dir=empty).problems("test")
    monkeypatch.delenv("DELIBERATION_ENV_DATA", raising=False)
    monkeypatch.setenv("DELIBERATION_ENV_CACHE", str(tmp_path / "cache"))  # not the user's cached download
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    with pytest.raises(FileNotFoundError, match="DELIBERATION_ENV_DATA.*HumanEval.jsonl.gz.*openai/openai_humaneval"):
        HumanEvalTask().problems("test")


def test_unreadable_data_files_name_the_file_line_and_fix(tmp_path):
    (tmp_path / "humaneval").mkdir()
    path = tmp_path / FILE
    good = json.dumps({"task_id": "T/0", "prompt": "def f():\n", "canonical_solution": "    return 1\n",
                       "test": "def check(c):\n    assert c() == 1\n", "entry_point": "f"})
    whole = gzip.compress((good + "\n").encode() * 50, mtime=0)
    cases = {
        r"HumanEval.jsonl.gz, line 2: not UTF-8 text": gzip.compress(good.encode() + b"\n\xff\xfe\x00binary\n"),
        r"corrupt or truncated gzip file \(EOFError.*gzip -t": whole[: len(whole) // 2],
        r"corrupt or truncated gzip file \(BadGzipFile.*at its start": b"PK\x03\x04 a zip, not a gzip file",
        r"HumanEval.jsonl.gz:2: unreadable JSON \(RecursionError": gzip.compress(
            (good + "\n" + "[" * 200_000 + "\n").encode()),
    }
    for message, content in cases.items():
        path.write_bytes(content)
        with pytest.raises(ValueError, match=message) as error:
            HumanEvalTask(data_dir=tmp_path).problems("test")
        assert str(path) in str(error.value)
        if "JSON" not in message:
            assert "intact copy" in str(error.value) and "DELIBERATION_ENV_DATA" in str(error.value)


# ------------------------------------------------------------------------------------ sandbox choice
def test_sandbox_option_and_fail_closed_construction(data_dir, monkeypatch):
    from deliberation_env.sandbox import runner as sandbox

    assert HumanEvalTask(data_dir=data_dir).isolation in ("bwrap", "unshare")
    with pytest.raises(ValueError, match="sandbox must be one of"):
        HumanEvalTask(data_dir=data_dir, sandbox="docker")
    monkeypatch.delenv(sandbox.ISOLATION_ENV_VAR, raising=False)
    monkeypatch.setattr(sandbox, "_probed", {"bwrap": False, "unshare": False, "rlimits": True})
    with pytest.raises(sandbox.SandboxUnavailableError, match="apt-get install bubblewrap"):
        HumanEvalTask(data_dir=data_dir)  # at construction, not as silently wrong grades later
    with pytest.raises(sandbox.SandboxUnavailableError, match="apt-get install bubblewrap"):
        deliberation_env.parallel_env(task="humaneval", data_dir=str(data_dir), split="test")
    with pytest.raises(sandbox.SandboxUnavailableError, match="sandbox='bwrap' does not work"):
        HumanEvalTask(data_dir=data_dir, sandbox="bwrap")
    trusted = HumanEvalTask(data_dir=data_dir, sandbox="rlimits", num_problems=1)  # the explicit opt-in
    problem = trusted.problems("test")[0]
    assert trusted.isolation == "rlimits" and trusted.grade(problem, problem.answer)
    env = deliberation_env.parallel_env(task="humaneval", data_dir=str(data_dir), task_kwargs={"sandbox": "rlimits"},
                                        split="test")
    assert env.task.isolation == "rlimits"


# ------------------------------------------------------------------------------------ grading
SURROGATE_REPLIES = [
    "\ud800",
    "```python\ndef strlen(string: str) -> int:\n    return len(string)  # \ud800\n```",
    "    return len('\udfff')",
    "def strlen(string):\n    return len(string)\n\udc80",
    "\ud800" * 5000,
]


@pytest.mark.parametrize("reply", SURROGATE_REPLIES, ids=range(len(SURROGATE_REPLIES)))
def test_text_with_lone_surrogates_grades_wrong_without_crashing(task, problems, reply):
    """Such text cannot be encoded (UTF-8 has no lone surrogates), so it cannot be run: a wrong answer."""
    strlen = problems["HumanEval/23"]
    assert task.grade(strlen, reply) is False
    for answer in (task.extract_answer(reply), task.extract_answer(reply, strlen)):  # never raises
        graded = task.grade(strlen, answer)
        assert isinstance(graded, bool)
        if answer is not None and any("\ud800" <= char <= "\udfff" for char in answer):
            assert graded is False
    assert task.grade_many([(strlen, reply), (strlen, strlen.answer)]) == [False, True]


def test_every_canonical_solution_passes(task, problems):
    fresh = HumanEvalTask(data_dir=task.data_dir)
    items = [(p, p.answer) for p in problems.values()]
    assert fresh.grade_many(items) == [True] * 164
    # body-only completions are graded with the prompt prepended
    bodies = [(p, "    " + p.metadata["canonical_solution"].strip()) for p in problems.values()]
    assert all(fresh.grade_many(bodies[:40]))


def test_grades_are_cached_per_program(task, problems, monkeypatch):
    fresh = HumanEvalTask(data_dir=task.data_dir)
    calls = []
    real = humaneval.run_many
    monkeypatch.setattr(humaneval, "run_many", lambda codes, **kw: calls.append(len(codes)) or real(codes, **kw))
    strlen = problems["HumanEval/23"]
    wrong = strlen.answer.replace("len(string)", "len(string) + 1")
    assert fresh.grade(strlen, strlen.answer) and not fresh.grade(strlen, wrong)
    assert fresh.grade(strlen, strlen.answer) and not fresh.grade(strlen, wrong)
    assert not fresh.grade(strlen, None) and not fresh.grade(strlen, "  ")
    assert calls == [1, 1]


@pytest.fixture(scope="module")
def distractors(task, problems) -> dict[str, list[str]]:
    return {p.id: task.distractors(p, random.Random(f"humaneval/{p.id}")) for p in problems.values()}


def test_distractors_really_fail(task, problems, distractors):
    """1-3 deterministic mutants per problem; a fresh task (no cache) re-grades them all: every one fails."""
    for problem in problems.values():
        found = distractors[problem.id]
        assert 1 <= len(found) <= 3, problem.id
        assert len(set(found)) == len(found) and problem.answer not in found
        assert all(humaneval.defines(d, problem.metadata["entry_point"]) for d in found)
    again = task.distractors(problems["HumanEval/0"], random.Random("humaneval/HumanEval/0"))
    assert again == distractors["HumanEval/0"]
    fresh = HumanEvalTask(data_dir=task.data_dir)
    items = [(problems[pid], d) for pid, found in distractors.items() for d in found]
    assert fresh.grade_many(items) == [False] * len(items)


def test_render_solution_round_trips(task, problems, distractors):
    rng = random.Random(0)
    for problem in problems.values():
        for answer in (problem.answer, *distractors[problem.id]):
            text = task.render_solution(problem, answer, rng)
            assert "```python" in text and task.extract_answer(text) == answer
            assert task.extract_answer(text, problem) == answer
        assert task.extract_answer(task.render_solution(problem, None, rng)) is None


# ------------------------------------------------------------------------------------ extraction
STRLEN_FULL = 'def strlen(string: str) -> int:\n    """Length."""\n    return len(string)'
FENCE = "```"
CASES: list[tuple[str, str, bool, str]] = [
    # (name, reply, pass the problem to extract_answer, expectation: pass | fail | none | gold)
    ("fenced python", f"{FENCE}python\n{STRLEN_FULL}\n{FENCE}", False, "pass"),
    ("fenced py", f"{FENCE}py\n{STRLEN_FULL}\n{FENCE}", False, "pass"),
    ("fenced no language", f"{FENCE}\n{STRLEN_FULL}\n{FENCE}", False, "pass"),
    ("fenced python3 with prose", f"Here you go:\n\n{FENCE}python3\n{STRLEN_FULL}\n{FENCE}\n\nDone.", False, "pass"),
    ("prose around code", "Sure! The built-in len does it.\n\n" + f"{FENCE}python\n{STRLEN_FULL}\n{FENCE}\n"
     "This runs in O(1) because Python strings store their length.", False, "pass"),
    ("usage block after", f"{FENCE}python\n{STRLEN_FULL}\n{FENCE}\nExample:\n{FENCE}python\nprint(strlen('abc'))\n{FENCE}",
     False, "pass"),
    ("corrected second attempt", f"First try:\n{FENCE}python\ndef strlen(string):\n    return 0\n{FENCE}\n"
     f"Wait, that is wrong. Fixed:\n{FENCE}python\ndef strlen(string):\n    return len(string)\n{FENCE}", False, "pass"),
    ("peer code quoted first", f"Agent 2 wrote:\n{FENCE}python\ndef strlen(s): return -1\n{FENCE}\nMine is right:\n"
     f"{FENCE}python\ndef strlen(string: str) -> int:\n    count = 0\n    for _ in string:\n        count += 1\n"
     f"    return count\n{FENCE}", False, "pass"),
    ("main guard with input()", f"{FENCE}python\n{STRLEN_FULL}\n\nif __name__ == '__main__':\n    s = input()\n"
     f"    print(strlen(s))\n{FENCE}", False, "pass"),
    ("imports and helper", f"{FENCE}python\nfrom functools import reduce\n\ndef _one(_):\n    return 1\n\n"
     f"def strlen(string: str) -> int:\n    return reduce(lambda a, b: a + b, map(_one, string), 0)\n{FENCE}", False, "pass"),
    ("decorator", f"{FENCE}python\nimport functools\n\n@functools.lru_cache(maxsize=None)\n"
     f"def strlen(string: str) -> int:\n    return len(string)\n{FENCE}", False, "pass"),
    ("class helper", f"{FENCE}python\nclass Counter:\n    def __init__(self, s):\n        self.n = len(s)\n\n"
     f"def strlen(string: str) -> int:\n    return Counter(string).n\n{FENCE}", False, "pass"),
    ("crlf and trailing spaces", f"{FENCE}python\r\n{STRLEN_FULL.replace(chr(10), '   ' + chr(13) + chr(10))}\r\n{FENCE}",
     False, "pass"),
    ("unterminated fence", f"{FENCE}python\n{STRLEN_FULL}\n", False, "pass"),
    ("unfenced with prose", f"Here's the implementation:\n\n{STRLEN_FULL}\n\nIt simply calls len.", False, "pass"),
    ("unfenced imports then prose", "import math\n\ndef strlen(string: str) -> int:\n    return len(string)\n\n"
     "Explanation: we rely on len().\n1. It is O(1).", False, "pass"),
    ("indented markdown block", "    def strlen(string):\n        return len(string)\n", False, "pass"),
    ("body fenced, indented", f"{FENCE}python\n    return len(string)\n{FENCE}", True, "gold"),
    ("body fenced, flush left", f"{FENCE}python\nreturn len(string)\n{FENCE}", True, "gold"),
    ("body two-space indent", f"{FENCE}python\n  return len(string)\n{FENCE}", True, "gold"),
    ("body without the problem", f"{FENCE}python\n    return len(string)\n{FENCE}", False, "pass"),
    ("raw completion then junk defs", "    return len(string)\n\n\ndef check(candidate):\n    assert False\n", True, "gold"),
    ("raw tab-indented body", "\treturn len(string)\n", True, "gold"),
    ("body with nested helper", f"{FENCE}python\n    def count(s):\n        return len(s)\n    return count(string)\n{FENCE}",
     True, "pass"),
    ("bare one-line body", "return len(string)", True, "gold"),
    ("wrong logic", f"{FENCE}python\ndef strlen(string: str) -> int:\n    return len(string) - 1\n{FENCE}", False, "fail"),
    ("wrong function name", f"{FENCE}python\ndef length(string):\n    return len(string)\n{FENCE}", True, "fail"),
    ("truncated syntax error", f"{FENCE}python\ndef strlen(string: str) -> int:\n    return len(string\n{FENCE}", False, "fail"),
    ("no code at all", "I'm not sure how to implement this function.", False, "none"),
    ("critic style reply", "Yes\nConfidence: 0.8", False, "none"),
    ("empty reply", "", False, "none"),
    ("output-only fence", f"The result is:\n{FENCE}\n3\n{FENCE}", False, "none"),
    ("non-python fence", f"{FENCE}text\nlength of the string\n{FENCE}", False, "none"),
    ("prose with a number", "The answer is 3 characters for 'abc'.", False, "none"),
]


def test_enough_extraction_cases():
    assert len(CASES) >= 30


@pytest.mark.parametrize("name, reply, with_problem, expected", CASES, ids=[case[0] for case in CASES])
def test_extraction(task, problems, name, reply, with_problem, expected):
    problem = problems["HumanEval/23"]
    answer = task.extract_answer(reply, problem if with_problem else None)
    if expected == "none":
        assert answer is None
        return
    assert answer is not None
    assert answer == normalize_code(answer) or answer == humaneval.textwrap.indent(normalize_code(answer), "    ")
    assert "__main__" not in answer and "Explanation" not in answer and "```" not in answer
    if expected == "gold":
        assert answer == problem.answer
    assert task.grade(problem, answer) is (expected != "fail"), build_program(problem, answer)


def test_same_program_votes_together(task, problems):
    problem = problems["HumanEval/23"]
    variants = [
        f"{FENCE}python\n{STRLEN_FULL}\n{FENCE}",
        f"Sure:\n{FENCE}py\n{STRLEN_FULL}   \n\n{FENCE}\nHope it helps.",
        f"{FENCE}python\r\n{STRLEN_FULL.replace(chr(10), chr(13) + chr(10))}\r\n{FENCE}",
        "\n".join("  " + line for line in STRLEN_FULL.split("\n")),
        f"Here's the implementation:\n\n{STRLEN_FULL}\n\nIt simply calls len.",
    ]
    assert len({task.extract_answer(text) for text in variants}) == 1
    bodies = ["    return len(string)", f"{FENCE}python\nreturn len(string)\n{FENCE}", "\treturn len(string)  "]
    assert {task.extract_answer(text, problem) for text in bodies} == {problem.answer}


def test_prompts(task, problems):
    problem = problems["HumanEval/23"]
    solve = task.solve_messages(problem)
    assert solve[0].role == "system" and problem.question in solve[-1].content and "```python" in solve[-1].content
    refine = task.refine_messages(problem, "my old code", [PeerView("def strlen(s):\n    return 0", "..."),
                                                           PeerView(None, "")])
    assert "def strlen(s):\n    return 0" in refine[-1].content and "(no answer)" in refine[-1].content
    critic = task.critic_messages(problem, f"{FENCE}python\n{STRLEN_FULL}\n{FENCE}")
    assert "'Yes' or 'No'" in critic[-1].content and "Confidence" in critic[-1].content


# ------------------------------------------------------------------------------------ end to end
def test_sim_episodes_end_to_end(data_dir):
    env = deliberation_env.parallel_env(task="humaneval", backend="sim", data_dir=str(data_dir), split="test", num_agents=3,
                                        max_rounds=3, task_kwargs={"num_problems": 3})
    rng = np.random.default_rng(0)
    seen = set()
    for index in range(3):
        observations, infos = env.reset(seed=index, options={"problem_index": index})
        problem = env.deliberation.problem
        seen.add(problem.id)
        steps = 0
        while env.agents:
            for agent, observation in observations.items():
                assert env.observation_space(agent).contains(observation)
            actions = {a: int(rng.choice(np.flatnonzero(observations[a]["action_mask"]))) for a in env.agents}
            observations, rewards, terminations, truncations, infos = env.step(actions)
            steps += 1
            assert set(rewards) == set(infos) == set(terminations) == {"agent_0", "agent_1", "agent_2"}
            for agent, info in infos.items():
                assert isinstance(rewards[agent], float) and math.isfinite(rewards[agent])
                answer = info["answer"]
                assert answer is None or humaneval.defines(answer, problem.metadata["entry_point"])
                assert info["correct"] == (answer is not None and env.task.grade(problem, answer))
                assert info["correct"] == (answer == problem.answer)  # sim answers: gold or a verified mutant
                assert info["consensus_correct"] == env.task.grade(problem, info["consensus"]) if info["consensus"] \
                    else not info["consensus_correct"]
        assert steps == 3 and all(terminations.values()) and not any(truncations.values())
    assert len(seen) == 3
