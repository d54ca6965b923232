"""A program-aided role (``tool="python"``): its program runs in the sandbox, its output is its answer, replays."""

from __future__ import annotations

import itertools

import pytest

import deliberation_env
from deliberation_env.backends.base import Completion
from deliberation_env.chat import Message
from deliberation_env.core import features
from deliberation_env.core.roles import make_roles
from deliberation_env.core.seeds import KIND_IDS
from deliberation_env.core.tools import TOOLS, program_of, tool_runner
from deliberation_env.make import replay_env
from deliberation_env.record import main as record
from deliberation_env.registry import BACKENDS

TEAM = ["plain", {"name": "coder", "tool": "python"}, "plain"]
ENV = {"task": "arithmetic", "task_kwargs": {"levels": [0, 1]}, "max_rounds": 1, "confidence": "critic_text"}


class CodeWriter:
    """Solutions whose program prints the right answer while the text states a wrong one (and, by seed, a program
    that fails or none at all); critics say Yes. Deterministic in the request."""

    def generate(self, requests):
        out = []
        for request in requests:
            if request.kind == "critic":
                out.append(Completion("Yes. Confidence: 0.6", 10, 4))
                continue
            question = request.messages[-1].content
            numbers = [int(t) for t in question.replace("?", " ").replace(".", " ").split() if t.isdigit()]
            style = request.seed % 3
            program = {0: f"print({numbers[0]} + 0)", 1: "raise SystemExit(3)", 2: None}[style]
            text = f"Let me compute.\n```python\n{program}\n```\n" if program else "I add them up.\n"
            out.append(Completion(text + "The answer is 999999", 20, 12))
        return out

    def identity(self) -> str:
        return "code-writer"


def test_the_last_code_block_is_the_program():
    assert program_of("a\n```python\nx = 1\n```\nb\n```\nprint(2)\n```\n") == "print(2)\n"
    assert program_of("no code here") is None and program_of("```python\n\n```") is None
    assert make_roles(TEAM, 3)[1].tool == "python"
    with pytest.raises(ValueError, match=r"tool must be one of \('python', 'python_check'"):
        make_roles(["a", {"name": "b", "tool": "bash"}, "a"], 3)


def test_both_python_tools_share_the_run_kind_and_differ_in_whether_the_output_answers():
    python, check = TOOLS["python"], TOOLS["python_check"]
    assert (python.kind, check.kind, python.answers, check.answers) == ("run", "run", True, False)
    assert tool_runner("run") is python and KIND_IDS["run"] == 4  # the seed number of the recorded sets' runs
    assert python.request("no code") is None
    assert python.request("```python\nprint(2)\n```") == (Message("user", "print(2)\n"),)


@pytest.mark.sandbox
def test_the_program_s_output_becomes_the_answer_and_the_text_s_answer_stays_otherwise():
    env = deliberation_env.parallel_env(**ENV, backend=CodeWriter(), roles=TEAM, features="v3")
    seen = set()
    for seed in range(12):
        env.reset(seed=seed)
        core = env.deliberation
        problem = core.problem
        for i, agent in enumerate(core.agents):
            program = program_of(agent.text)
            ran = i == 1 and program is not None and "print" in program
            seen.add((i, ran))
            assert agent.tool_ran == ran
            assert agent.answer == (program.split("(")[1].split(" +")[0] if ran else "999999")
            assert agent.tool_agrees is False
            assert agent.correct == core.grade(agent.answer)
            row = env.state().reshape(3, -1)[i]
            assert row[features.TOOL_OFFSET:].tolist() == [float(ran), 0.0]
        assert problem is core.problem
    assert {(1, True), (1, False), (0, False)} <= seen  # a run that printed, and ones that failed or had no code



def test_a_program_aided_agent_s_signals_and_confidence_read_the_answer_its_program_printed():
    """Issue 62, item 6: the program's output is the answer the agent gives, so ``answer_prob`` and
    ``answer_repeats`` (and the ``answer_logprobs`` confidence) are of it, not of the answer its text states."""
    from math import exp

    from deliberation_env.core.deliberation import Deliberation, DeliberationConfig
    from deliberation_env.registry import TASKS

    task = TASKS.make("arithmetic", levels=[0, 1])
    config = DeliberationConfig(num_agents=3, max_rounds=1, confidence="answer_logprobs", features="v3",
                                roles=make_roles(TEAM, 3))
    core = Deliberation(task, config)
    core.start(task.problems("test")[0], 0)
    # the program prints 12 (tokens "1", "2" at -0.1 each); the text states 7 twice ("7" at -2.0)
    pieces = [("```python\nprint(", -0.5), ("1", -0.1), ("2", -0.1), (")\n```\nThe answer is ", -0.5),
              ("7", -2.0), (", so ", -0.5), ("7", -2.0), (".", -0.5)]
    solution = Completion("".join(t for t, _ in pieces), 30, len(pieces), token_logprobs=tuple(pieces))
    core.receive([solution] * 3)
    assert [r.kind for r in core.pending_requests()] == ["run"]
    core.receive([Completion("12\n", 0, 0)])
    plain, coder = core.agents[0], core.agents[1]
    assert (plain.answer, coder.answer) == ("7", "12")
    assert plain.signals.answer_repeats == 2 and plain.signals.answer_logprob == pytest.approx(-2.0)
    assert coder.signals.answer_repeats == 1 and coder.signals.answer_logprob == pytest.approx(-0.2)
    assert coder.confidence == pytest.approx(exp(-0.2)) and plain.confidence == pytest.approx(exp(-2.0))
    columns = features.feature_names("v3")
    row = core.feature_matrix()[1]
    assert row[columns.index("answer_prob")] == pytest.approx(exp(-0.2))
    assert row[columns.index("answer_repeats")] == pytest.approx(1 / features.REPEATS_SCALE)
    assert features.FEATURE_FORMAT == 2

@pytest.fixture(scope="module")
def tool_set(tmp_path_factory):
    BACKENDS.register("code-writer", CodeWriter, overwrite=True)  # --backend takes any registered name
    out = tmp_path_factory.mktemp("sets") / "code-team"
    record(["--out", str(out), "--split", "test", "--problems", "0:4", "--streams", "1", "--rounds", "1",
            "--backend", "code-writer", "--task-option", "levels=[0,1]", "--agents", "3",
            "--env-option", f"roles={TEAM!r}"])
    return out


@pytest.mark.sandbox
def test_a_recorded_program_aided_team_replays_equal_to_live_without_running_code(tool_set, monkeypatch):
    live = deliberation_env.parallel_env(**ENV, backend=CodeWriter(), roles=TEAM, streams=1, invalid_action="persist",
                                         split="test")
    replayed = replay_env(str(tool_set), split="test", invalid_action="persist")
    expected = {}
    for problem in replayed.problems:
        for joint in itertools.product(range(3), repeat=3):
            options = {"problem_id": problem.id}
            live.reset(seed=0, options=options)
            expected[problem.id, joint] = live.step({f"agent_{i}": a for i, a in enumerate(joint)})[4]
    import deliberation_env.sandbox.runner as runner

    monkeypatch.setattr(runner, "run_python", lambda *a, **k: pytest.fail("replay ran a program"))
    for (problem_id, joint), infos in expected.items():
        replayed.reset(seed=0, options={"problem_id": problem_id})
        assert replayed.step({f"agent_{i}": a for i, a in enumerate(joint)})[4] == infos
    assert replayed.backends[0].misses == 0
    kinds = {record["kind"] for record in replayed.backends[0].set.records.values()}
    assert "run" in kinds


class Checked(CodeWriter):
    """Solutions stating 7 whose program prints 7 (even seeds) or 8 (odd seeds)."""

    def generate(self, requests):
        return [Completion("Yes. Confidence: 0.6", 10, 4) if r.kind == "critic" else
                Completion(f"```python\nprint({7 + r.seed % 2})\n```\nThe answer is 7", 20, 12) for r in requests]


@pytest.mark.sandbox
def test_a_checking_tool_runs_the_program_but_the_text_s_answer_stands():
    team = ["plain", {"name": "checker", "tool": "python_check"}, {"name": "coder", "tool": "python"}]
    env = deliberation_env.parallel_env(**ENV, backend=Checked(), roles=team, features="v3")
    seen = set()
    for seed in range(8):
        env.reset(seed=seed)
        plain, checker, coder = env.deliberation.agents
        agrees = checker.tool_agrees
        seen.add(agrees)
        assert checker.tool_ran and checker.answer == "7" and plain.answer == "7"
        assert not plain.tool_ran and not plain.tool_agrees
        assert coder.tool_ran and coder.answer in ("7", "8") and coder.tool_agrees == (coder.answer == "7")
        row = env.state().reshape(3, -1)[1]
        assert row[features.TOOL_OFFSET:].tolist() == [1.0, float(agrees)]
    assert seen == {True, False}  # the program printed the stated answer on some seeds, another one on others


@pytest.mark.sandbox
def test_the_check_tool_bench_counts_what_the_programs_of_a_recorded_set_print(tmp_path, monkeypatch):
    BACKENDS.register("checked", Checked, overwrite=True)
    out = tmp_path / "checked"
    record(["--out", str(out), "--split", "test", "--problems", "0:4", "--streams", "1", "--rounds", "1",
            "--backend", "checked", "--task-option", "levels=[0,1]", "--agents", "3"])
    from bench.studies import check_tool as script
    _, found = script.solutions(script.ReplaySet(out), "test")
    sevens = sum("print(7)" in s["program"] for s in found)
    assert len(found) == 12 and 0 < sevens < 12  # both kinds of program were recorded
    monkeypatch.setattr(script, "save_markdown", lambda stem, header, table: (tmp_path / "report.md").write_text(table))
    script.main(["--dataset", str(out), "--splits", "test"])
    report = (tmp_path / "report.md").read_text()
    assert "| with a code block | 12 (100%) |" in report
    assert f"| ... that agrees with the text's answer | {sevens} |" in report
    assert "| whose program printed an answer | 12 |" in report
