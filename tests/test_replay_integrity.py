"""Replay you can defend (issue 62, items 4 and 5): a card's accuracy is the env's, its problems table holds each
role's prompt, a damaged tree is refused at construction, and every env a replay backend answers was checked."""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import deliberation_env
from deliberation_env.backends.sim import SimBackend
from deliberation_env.core.deliberation import Deliberation
from deliberation_env.make import replay_env
from deliberation_env.record import main as record
from deliberation_env.registry import TASKS
from deliberation_env.replay import ReplayBackend, ReplayError, ReplaySet, env_settings
from deliberation_env.replay.dataset import load_card, shipped, write_card
from deliberation_env.replay.format import read_chunk, write_chunk
from deliberation_env.replay.stats import round0_accuracy
from tests.test_replay import SIM_FLAGS
from tests.test_replay_binding import Hiding


def env_round0(dataset: ReplaySet) -> dict[tuple[str, str], list[int]]:
    """(role or "team", level) -> [right, answers]: round 0 of every recorded problem and stream, played by the env."""
    tally: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    roles = [role["name"] for role in dataset.card.settings.get("roles") or []]
    for split in dataset.card.splits:
        env = replay_env(dataset, split=split)
        for index, problem in enumerate(env.problems):
            level = str(problem.metadata.get("level", "all"))
            for stream in range(dataset.card.streams):
                env.reset(seed=stream, options={"problem_index": index})
                for i, agent in enumerate(env.deliberation.agents):
                    for who in ("team", *roles[i:i + 1]):
                        tally[who, level][0] += agent.correct
                        tally[who, level][1] += 1
    return tally


@pytest.mark.parametrize("name", shipped())
def test_a_shipped_card_s_round0_accuracy_is_the_env_s_per_level_and_role(name):
    dataset = ReplaySet(name)
    card = dataset.card
    figures = card.stats["round0_accuracy"]
    played = env_round0(dataset)
    tallies = {"team": figures["team"], **figures.get("roles", {})}
    assert set(tallies) == {who for who, _ in played}
    for who, tally in tallies.items():
        for level, row in tally["by_level"].items():
            assert [row["correct"], row["answers"]] == played[who, level], (who, level)
        assert tally["answers"] == sum(played[who, level][1] for level in tally["by_level"])
    task = TASKS.make(card.task, **card.task_kwargs)
    assert round0_accuracy(task, card, dataset.records) == figures  # the recorder's function recomputes it
    assert "| all | " + f"{figures['team']['accuracy']:.3f}" in (dataset.path / "README.md").read_text()


def test_the_team_card_grades_the_program_aided_agent_on_its_program_s_output():
    dataset = ReplaySet("qwen05-team-arith")
    card = dataset.card
    task = TASKS.make(card.task, **card.task_kwargs)
    problems = {p.id: p for split, ids in card.splits.items() for p in task.problems(split) if p.id in set(ids)}
    program = [i for i, role in enumerate(card.settings["roles"]) if role["tool"] == "python"]
    texts_right = sum(bool(task.grade(problems[r["problem"]], task.extract_answer(r["text"])))
                      for r in dataset.records.values() if r["kind"] == "solve" and r["agent"] in program)
    answers_right = card.stats["round0_accuracy"]["roles"]["program"]["correct"]
    assert answers_right > 3 * texts_right  # its text rarely states the answer its program prints


def test_the_team_set_s_problems_table_holds_each_role_s_solve_prompt():
    dataset = ReplaySet("qwen05-team-arith")
    card = dataset.card
    task = TASKS.make(card.task, **card.task_kwargs)
    core = Deliberation(task, card.config())
    names = [role["name"] for role in card.settings["roles"]]
    for split in card.splits:
        rows = pq.read_table(dataset.path / "problems" / f"{split}.parquet").to_pylist()
        assert [row["id"] for row in rows] == card.splits[split]
        by_id = {p.id: p for p in task.problems(split)}
        for row in rows[:20]:
            core.start(by_id[row["id"]], 0)
            asked = {names[r.agent]: [{"role": m.role, "content": m.content} for m in r.messages]
                     for r in core.pending_requests()}
            assert {entry["name"]: entry["messages"] for entry in row["solve_messages_by_role"]} == asked
            assert [entry["name"] for entry in row["solve_messages_by_role"]] == names
    assert len({json.dumps(messages) for messages in asked.values()}) == 3  # three prompts, not the default thrice


# ---------------------------------------------------------------------------------------------- a damaged tree
@pytest.fixture(scope="module")
def sim_set(tmp_path_factory) -> Path:
    """A small 1-round sim set: 4 test problems in 2 chunks."""
    out = tmp_path_factory.mktemp("sets") / "sim-small"
    record(["--out", str(out), "--split", "test", "--problems", "0:4", "--chunk", "2", "--rounds", "1", *SIM_FLAGS])
    return out


@pytest.fixture
def copy(sim_set, tmp_path) -> Path:
    return Path(shutil.copytree(sim_set, tmp_path / "copy"))


def test_a_recorded_card_indexes_each_chunk_s_problems_and_records(sim_set):
    card = load_card(sim_set)
    assert sorted(card.index) == ["chunks/test-00000-00001.parquet", "chunks/test-00002-00003.parquet"]
    for name, counts in card.index.items():
        assert sum(counts.values()) == card.files[name]["records"]
        assert list(counts) == sorted({r["problem"] for r in read_chunk(sim_set / name)})


def test_a_record_removed_and_the_card_resealed_is_refused_at_construction_naming_its_problem(copy):
    card = load_card(copy)
    name = "chunks/test-00002-00003.parquet"
    records = read_chunk(copy / name)
    dropped = next(r for r in records if r["round"] == 1)  # not a solve: the solve-prompt check does not see it
    card.files[name] = write_chunk(copy / name, [r for r in records if r is not dropped])  # resealed: checksums fit
    write_card(copy, card)
    with pytest.raises(ReplayError, match=rf"problem '{dropped['problem']}' holds \d+ records, {name} held"):
        replay_env(copy, split="test")
    # the other chunk's problems still build as a split of their own would; the whole set is refused
    assert ReplaySet(copy).card.files[name]["records"] == len(records) - 1


def test_a_chunk_removed_with_its_card_entry_names_the_missing_file(copy):
    card = load_card(copy)
    name = "chunks/test-00000-00001.parquet"
    (copy / name).unlink()
    del card.files[name]
    write_card(copy, card)
    with pytest.raises(ReplayError, match=rf"{name} is missing \(card.json's index lists it with the records of 2 "):
        replay_env(copy, split="test")


def test_the_index_check_runs_once_per_set_and_is_fast_on_a_shipped_set():
    import time

    dataset = ReplaySet("qwen05-team-arith")
    settings = env_settings(dataset.card)
    started = time.perf_counter()
    deliberation_env.parallel_env(backend=ReplayBackend(dataset), split="train", **settings)
    first = time.perf_counter() - started
    assert sum(sum(c.values()) for c in dataset.card.index.values()) == len(dataset)
    assert first < 10.0  # the per-problem counts, not a walk of the tree (about a minute per split)


# ---------------------------------------------------------------------------------------------- per-env binding
def test_an_env_hidden_behind_a_wrapper_is_refused_even_after_another_env_bound_the_backend(sim_set):
    card = ReplaySet(sim_set).card
    backend = ReplayBackend(sim_set)
    checked = deliberation_env.parallel_env(backend=backend, **env_settings(card), split="test")
    checked.reset(seed=0)
    hidden = deliberation_env.parallel_env(backend=Hiding(backend), **{**env_settings(card), "max_tokens": 128}, split="test")
    with pytest.raises(ReplayError, match=r"max_tokens=128, .* never checked against the set .*max_tokens=64"):
        hidden.reset(seed=0)
    assert backend.misses == 0


def test_a_fallback_does_not_fill_the_requests_of_an_unchecked_env(sim_set, tmp_path):
    card = ReplaySet(sim_set).card
    live = SimBackend()
    assert live.identity() == card.model
    backend = ReplayBackend(Path(shutil.copytree(sim_set, tmp_path / "copy")), fallback=live, write_back=True)
    deliberation_env.parallel_env(backend=backend, **env_settings(card), split="test")
    hidden = deliberation_env.parallel_env(backend=Hiding(backend), **{**env_settings(card), "max_tokens": 128}, split="test")
    with pytest.raises(ReplayError, match="never checked"):
        hidden.reset(seed=0)
    assert backend.misses == 0 and not [n for n in load_card(tmp_path / "copy").files if "fallback" in n]


def test_a_request_beyond_the_recording_is_refused_as_another_game(sim_set):
    """A problem the set does not hold, under the checked settings: a ReplayError naming it and how to record it
    (a checked env's plain miss: tests/test_replay_identity.py)."""
    card = ReplaySet(sim_set).card
    backend = ReplayBackend(sim_set)
    env = deliberation_env.parallel_env(backend=backend, **env_settings(card), split="test")
    env.reset(seed=0)
    core = Deliberation(env.task, env.config)
    core.start(env.task.problems("test")[9], 0)  # a problem the set does not hold, under the checked settings
    with pytest.raises(ReplayError, match="holds no problem 'arithmetic-test-9'.*deliberation_env.record"):
        backend.generate(core.pending_requests())


@pytest.mark.parametrize("name", shipped())
def test_a_shipped_card_states_whether_its_engine_reproduces_completions(name):
    dataset = ReplaySet(name)
    stated = dataset.card.reproducibility
    assert stated["reproduces"] in (True, False, None) and stated["summary"] and stated["measured"]
    # measured for every shipped set's engine by bench/studies/recording_determinism.py (llama.cpp's server, and
    # with --engine transformers the format-1 set's): neither gives the recorded completion back
    assert stated["reproduces"] is False and "recording_determinism" in stated["measured"]
    assert ("--engine transformers" in stated["measured"]) == dataset.card.model.startswith("transformers:")
    readme = (dataset.path / "README.md").read_text()
    assert "## Reproducibility" in readme and stated["summary"] in readme
