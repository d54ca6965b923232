"""Feature sets and tools are blocks: registered from outside the package through the public API, they play on the
sim backend, record and replay; the docs' tables of feature sets, tools and a role's fields are written from the
declarations (``scripts/docs_tables.py``)."""

from __future__ import annotations

import fnmatch
import importlib
import itertools
import re
from pathlib import Path

import numpy as np
import pytest

import deliberation_env
from deliberation_env.backends.base import Completion, Request
from deliberation_env.chat import Message
from deliberation_env.core import features
from deliberation_env.core.features import FeatureSet, register_feature_set
from deliberation_env.core.seeds import KIND_IDS
from deliberation_env.core.tools import Tool, register_tool, request_kinds
from deliberation_env.grouping import generate_by_backend
from deliberation_env.make import replay_env
from deliberation_env.record import main as record
from deliberation_env.replay import ReplaySet
from deliberation_env.replay.backend import ReplayBackend
from tests.test_replay import SIM_FLAGS, sim_live

ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------ a toy feature set
def fill_answer_shape(team, rows: np.ndarray) -> None:
    """Two columns: the answer's length / 10 (capped), and its completion's tokens / 100 (capped), which only a set
    that needs log-probabilities sees (the core keeps the completion signals for it)."""
    for i, agent in enumerate(team.agents):
        rows[i, 0] = min(len(agent.answer or "") / 10, 1.0)
        rows[i, 1] = min(agent.signals.completion_tokens / 100, 1.0)


SHAPE = register_feature_set(FeatureSet("answer_shape", ("answer_length", "answer_tokens"), fill_answer_shape,
                                        extends="v1", logprobs=True, summary="the answer's length and tokens"),
                             overwrite=True)


def test_a_feature_set_registered_from_outside_extends_v1_with_its_own_columns():
    assert features.feature_names("answer_shape") == (*features.FEATURES, "answer_length", "answer_tokens")
    plain = deliberation_env.parallel_env(task="arithmetic", backend="sim")
    shaped = deliberation_env.parallel_env(task="arithmetic", backend="sim", features="answer_shape")
    assert shaped.observation_space("agent_0")["self"].shape == (features.NUM_FEATURES + 2,)
    seen = set()
    for seed in range(6):
        expected, _ = plain.reset(seed=seed)
        observed, _ = shaped.reset(seed=seed)
        while True:
            answers = [agent.answer for agent in shaped.deliberation.agents]
            tokens = [agent.signals.completion_tokens for agent in shaped.deliberation.agents]
            assert all(t > 0 for t in tokens)  # the set asked for the completions' signals
            for i, name in enumerate(shaped.possible_agents):
                own = observed[name]["self"]
                np.testing.assert_array_equal(own[:features.NUM_FEATURES], expected[name]["self"])
                assert own[-2] == np.float32(min(len(answers[i] or "") / 10, 1.0))
                assert own[-1] == np.float32(min(tokens[i] / 100, 1.0))
                peers = shaped.deliberation.peer_indices(i)
                np.testing.assert_array_equal(observed[name]["peers"], shaped.state().reshape(3, -1)[peers])
                seen.add(float(own[-2]))
            if not shaped.agents:
                break
            actions = {name: (seed + k) % 3 for k, name in enumerate(shaped.agents)}
            expected = plain.step(actions)[0]
            observed = shaped.step(actions)[0]
    assert len(seen) > 1  # answers of several lengths were seen


def test_a_feature_set_s_needs_decide_what_the_core_asks():
    logprobs = {}
    for name in ("v1", "answer_shape", "v2"):
        env = deliberation_env.parallel_env(task="arithmetic", backend="sim", features=name)
        env.deliberation.start(env.problems[0], 0)
        logprobs[name] = {r.token_logprobs for r in env.deliberation.pending_requests()}
    assert logprobs == {"v1": {False}, "answer_shape": {True}, "v2": {True}}
    with pytest.raises(ValueError, match="features must be one of .*'answer_shape'.*got 'v9'"):
        deliberation_env.parallel_env(task="arithmetic", backend="sim", features="v9")


def test_a_bad_feature_set_declaration_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="already registered"):
        register_feature_set(FeatureSet("v2", ("x",), fill_answer_shape))
    with pytest.raises(ValueError, match="repeats columns of 'v1': \\['round'\\]"):
        register_feature_set(FeatureSet("again", ("round",), fill_answer_shape, extends="v1"))
    with pytest.raises(ValueError, match="features must be one of"):
        register_feature_set(FeatureSet("orphan", ("x",), fill_answer_shape, extends="nope"))
    with pytest.raises(ValueError, match="columns must be distinct"):
        FeatureSet("twice", ("x", "x"), fill_answer_shape)
    with pytest.raises(TypeError, match="fill must be a callable"):
        FeatureSet("nofill", ("x",), None)  # type: ignore[arg-type]
    assert "again" not in features.FEATURE_SETS and "orphan" not in features.FEATURE_SETS


# ------------------------------------------------------------------ a toy tool
_STEP = re.compile(r"(\d+(?:\s*[-+*]\s*\d+)+)\s*=")


class Recompute(Tool):
    """Recomputes the last step of a solution (the expression left of its last '='): the sim's texts slip there."""

    name = kind = "recompute"
    answers = True

    def __init__(self):
        self.calls = 0

    def request(self, text: str) -> tuple[Message, ...] | None:
        steps = _STEP.findall(text)
        return (Message("user", steps[-1]),) if steps else None

    def run(self, requests):
        self.calls += 1
        return [Completion(f"{recompute(r.messages[-1].content)}", 0, 0) for r in requests]


def recompute(expression: str) -> str:
    value = features.evaluate(expression)
    assert value is not None
    return str(int(value))


RECOMPUTE = register_tool(Recompute(), overwrite=True)
TEAM = ["plain", {"name": "checker", "tool": "recompute"}, "plain"]


def test_a_tool_registered_from_outside_answers_its_agent_on_the_sim_backend():
    assert "recompute" in request_kinds() and KIND_IDS["recompute"] > 4  # a stable number of its own
    env = deliberation_env.parallel_env(task="arithmetic", backend="sim", roles=TEAM, features="v3")
    calls, outcomes = RECOMPUTE.calls, set()
    for seed in range(10):
        env.reset(seed=seed)
        for _ in range(2):
            core = env.deliberation
            for i, agent in enumerate(core.agents):
                steps = _STEP.findall(agent.text)
                if i != 1 or not steps:
                    assert not agent.tool_ran
                    continue
                stated = features.evaluate(steps[-1]) is not None and agent.text.rstrip(".").split()[-1]
                assert agent.tool_ran and agent.answer == recompute(steps[-1])
                assert agent.tool_agrees == (stated == agent.answer)
                row = env.state().reshape(3, -1)[i]
                assert row[features.TOOL_OFFSET:].tolist() == [1.0, float(agent.tool_agrees)]
                outcomes.add(agent.tool_agrees)
            if not env.agents:
                break
            env.step({name: 1 for name in env.agents})  # REFINE: the tool runs again on the new text
    assert RECOMPUTE.calls > calls and outcomes == {True, False}  # it fixed some slips and confirmed other texts


def test_the_grouper_sends_a_tool_s_requests_to_the_tool_unless_the_backend_answers_them():
    class Model:
        def __init__(self):
            self.kinds = []

        def generate(self, requests):
            self.kinds += [r.kind for r in requests]
            return [Completion("model", 1, 1) for _ in requests]

    class Recorded(Model):
        answers_tools = True

    model, recorded = Model(), Recorded()
    requests = [Request((Message("user", "2 + 3"),), kind, 0, 0, 64, 0.7) for kind in ("solve", "recompute", "critic")]
    assert [c.text for c in generate_by_backend(requests, [model] * 3)] == ["model", "5", "model"]
    assert [c.text for c in generate_by_backend(requests, [recorded] * 3)] == ["model"] * 3
    assert (model.kinds, recorded.kinds) == (["solve", "critic"], ["solve", "recompute", "critic"])
    assert ReplayBackend.answers_tools


@pytest.fixture(scope="module")
def tool_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("sets") / "recompute-team"
    record(["--out", str(out), "--split", "test", "--problems", "0:3", "--streams", "1", "--max-rounds", "1",
            *SIM_FLAGS, "--env-option", f"roles={TEAM!r}"])
    return out


def test_a_toy_tool_and_a_toy_feature_set_record_and_replay_equal_to_live_without_running_the_tool(tool_set,
                                                                                                    monkeypatch):
    kinds = {record["kind"] for record in ReplaySet(tool_set).records.values()}
    assert kinds == {"solve", "critic", "refine", "recompute"}
    live = sim_live(rounds=1, streams=1, roles=TEAM, features="answer_shape")
    replayed = replay_env(str(tool_set), split="test", invalid_action="persist", features="answer_shape")
    expected = {}
    for problem in replayed.problems:
        for joint in itertools.product(range(3), repeat=3):
            observations, _ = live.reset(seed=0, options={"problem_id": problem.id})
            expected[problem.id, joint] = (observations, live.step(dict(zip(live.agents, joint))))
    monkeypatch.setattr(RECOMPUTE, "run", lambda requests: pytest.fail("replay ran the tool"))
    for (problem_id, joint), (observations, step) in expected.items():
        first, _ = replayed.reset(seed=0, options={"problem_id": problem_id})
        after = replayed.step(dict(zip(replayed.agents, joint)))
        for name in observations:
            np.testing.assert_array_equal(first[name]["self"], observations[name]["self"])
            np.testing.assert_array_equal(after[0][name]["self"], step[0][name]["self"])
        assert after[4] == step[4]
    assert replayed.backends[0].misses == 0


# ------------------------------------------------------------------ the docs' tables come from the declarations
def test_the_docs_tables_are_written_from_the_declarations():
    """docs/reference.md's tables of feature sets, tools and a role's fields are ``scripts/docs_tables.py``'s output
    (run it after changing a declaration), and no docstring keeps a copy of the feature-set table."""
    from scripts import docs_tables

    text = (ROOT / "docs/reference.md").read_text(encoding="utf-8")
    assert docs_tables.stale(text) == [], "run python scripts/docs_tables.py"
    assert {"feature_sets", "tools", "role_fields"} <= {m.group(2) for m in docs_tables.SECTION.finditer(text)}
    edited = text.replace("| ``v3``   | 29 |", "| ``v3``   | 30 |")
    assert docs_tables.stale(edited) == ["feature_sets"] and docs_tables.regenerate(edited) == text
    table = features.feature_set_table(features.BUILT_IN_FEATURE_SETS)
    for module in ("deliberation_env.core.features", "deliberation_env.env"):
        assert table.splitlines()[2] not in (importlib.import_module(module).__doc__ or ""), module
    assert max(features.FEATURE_SETS[n].version for n in features.BUILT_IN_FEATURE_SETS) == features.FEATURE_FORMAT


def column_rows(text: str) -> list[tuple[str, str]]:
    """(index, names) of every row of the tables whose first column is "index" (a column's place in the row)."""
    found, inside = [], False
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")] if line.strip().startswith("|") else []
        if not cells:
            inside = False
        elif cells[0] == "index":
            inside = True
        elif inside and re.fullmatch(r"\d+(-\d+)?", cells[0]):
            found.append((cells[0], cells[1].replace("`", "")))
    return found


@pytest.mark.parametrize("where", ["core/features.py", "docs/reference.md"])
def test_every_column_table_names_the_declared_columns(where):
    text = features.__doc__ if where == "core/features.py" else (ROOT / where).read_text(encoding="utf-8")
    columns = features.feature_names("v3")
    rows = column_rows(text or "")
    covered = set()
    for index, names in rows:
        first, _, last = index.partition("-")
        span = columns[int(first): int(last or first) + 1]
        listed = [name.strip() for name in names.split(",")]
        assert len(listed) in (1, len(span)), f"{where}: columns {index} list {listed}"
        patterns = listed * len(span) if len(listed) == 1 else listed
        assert all(fnmatch.fnmatchcase(c, p) for c, p in zip(span, patterns)), f"{where}: {index} is {span}, not {names}"
        covered.update(range(int(first), int(last or first) + 1))
    assert covered == set(range(len(columns))), f"{where}: columns without a row: {set(range(len(columns))) - covered}"


# ------------------------------------------------------------------ no module branches on a block's name
def test_no_module_branches_on_a_feature_set_s_or_a_tool_s_name():
    """What the core does for a feature set or a tool comes from its declaration: no comparison with the name of a
    built-in set, tool or tool kind outside the modules that declare them (``core/features.py``, ``core/tools.py``)."""
    import ast

    from deliberation_env.core.tools import TOOLS

    names = {*features.BUILT_IN_FEATURE_SETS, "python", "python_check", "run"}
    declaring = {"deliberation_env/core/features.py", "deliberation_env/core/tools.py"}
    offenders = []
    for package in ("deliberation_env", "baselines"):
        for path in sorted((ROOT / package).rglob("*.py")):
            where = path.relative_to(ROOT).as_posix()
            if where in declaring or "sets" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Compare):
                    constants = [c for c in ast.walk(node) if isinstance(c, ast.Constant) and c.value in names]
                    offenders += [f"{where}:{c.lineno}: {c.value!r}" for c in constants]
    assert not offenders, "branches on a block's name (read its declaration instead): " + ", ".join(offenders)
    assert {tool.kind for tool in TOOLS.values()} >= {"run"}  # the names scanned for are the real ones
