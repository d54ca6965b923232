"""Replay sets: recording the whole tree, replaying it exactly, integrity, misses, resume and the shipped sets."""

from __future__ import annotations

import itertools
import json
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest

import deliberation_env
from deliberation_env.backends.cache import CachedBackend
from deliberation_env.backends.sim import SimBackend
from deliberation_env.core.config import CONCEDE_TARGETS, CONFIDENCE_SOURCES
from deliberation_env.make import replay_env
from deliberation_env.record import main as record
from deliberation_env.registry import TASKS
from deliberation_env.replay import ReplayBackend, ReplayError, ReplaySet, shipped
from deliberation_env.replay.dataset import HUB_PREFIX, read_records
from deliberation_env.replay.recorder import unrecorded

SIM_FLAGS = ["--backend", "sim", "--task-option", "levels=[0,1]", "--max-tokens", "64", "--num-agents", "3"]


def same(a, b, path="") -> None:
    """Deep equality of env outputs (dicts, tuples, arrays, numbers), naming the first difference."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            same(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b), path
    else:
        assert a == b and type(a) is type(b), (path, a, b)


def play_all_joint_actions(replayed, live, problem_ids, seeds, rounds=1) -> int:
    """Every joint action sequence of ``rounds`` rounds on both envs; returns the episodes compared."""
    played = 0
    joints = list(itertools.product(range(3), repeat=replayed.config.num_agents))
    for problem_id, seed in itertools.product(problem_ids, seeds):
        for sequence in itertools.product(joints, repeat=rounds):
            options = {"problem_id": problem_id}
            same(replayed.reset(seed=seed, options=options), live.reset(seed=seed, options=options))
            for joint in sequence:
                actions = {f"agent_{i}": action for i, action in enumerate(joint)}
                same(replayed.step(actions), live.step(actions))
            played += 1
    return played


@pytest.fixture(scope="module")
def sim_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("sets") / "sim-arith"
    for split in ("test", "train"):  # the second split goes into the same set
        record(["--out", str(out), "--split", split, "--problems", "0:4", "--streams", "2", "--rounds", "2", "--chunk",
                "3", "--concede-targets", "rule", *SIM_FLAGS])
    return out


def sim_live(rounds=2, streams=2, **options):
    options.setdefault("confidence", "critic_text")
    return deliberation_env.parallel_env(task="arithmetic", task_kwargs={"levels": [0, 1]}, backend="sim",
                                         split="test", max_rounds=rounds, max_tokens=64, streams=streams,
                                         invalid_action="persist", **options)


def test_replay_equals_the_live_sim_for_every_joint_action_sequence_and_source(sim_set):
    dataset = ReplaySet(sim_set)
    assert dataset.card.splits == {split: [f"arithmetic-{split}-{i}" for i in range(4)] for split in ("test", "train")}
    assert len(list((sim_set / "chunks").glob("test-*.parquet"))) == 2  # chunks of 3 and 1 problems
    for confidence in CONFIDENCE_SOURCES:
        replayed = replay_env(dataset, split="test", confidence=confidence, invalid_action="persist")
        assert replayed.config.streams == 2 and replayed.config.max_rounds == 2
        played = play_all_joint_actions(replayed, sim_live(confidence=confidence), dataset.card.splits["test"][:2],
                                        seeds=(0, 1), rounds=2)
        assert played == 2 * 2 * 27**2
        assert replayed.backends[0].misses == 0


def test_seeds_pick_streams_deterministically(sim_set):
    env = replay_env(sim_set, split="test")
    texts = {}
    for seed in range(6):
        env.reset(seed=seed, options={"problem_index": 0})
        texts[seed] = [agent.text for agent in env.deliberation.agents]
        env.reset(seed=seed, options={"problem_index": 0})
        assert [agent.text for agent in env.deliberation.agents] == texts[seed]
    assert len({tuple(t) for t in texts.values()}) == 2  # two streams, both reached
    problem_id = env.deliberation.problem.id
    assert env.deliberation.seed in {deliberation_env.core.seeds.stream_seed(s, problem_id) for s in (0, 1)}


def test_the_env_plays_only_recorded_problems(sim_set):
    env = replay_env(sim_set, split="test")
    assert [p.id for p in env.problems] == [f"arithmetic-test-{i}" for i in range(4)]
    for seed in range(20):
        env.reset(seed=seed)
        env.step({agent: int(env.np_random.integers(2)) for agent in env.agents})
    assert env.backends[0].misses == 0


@pytest.mark.parametrize(("options", "message"), [
    ({"max_tokens": 32}, "max_tokens=64"),
    ({"max_rounds": 3}, "holds 2 round"),
    ({"num_agents": 2}, "num_agents=3"),
    ({"task_kwargs": {"levels": [0, 1], "prompt": "no_code"}}, "other prompts"),
    ({"task_kwargs": {"levels": [2]}}, "not the recorded one"),
    ({"streams": 3}, "2 stream"),
])
def test_settings_that_would_change_requests_fail_at_construction(sim_set, options, message):
    options = {"task_kwargs": {"levels": [0, 1]}, "max_tokens": 64, "max_rounds": 2, "confidence": "critic", **options}
    with pytest.raises(ReplayError, match=message):
        deliberation_env.parallel_env(task="arithmetic", backend="replay", backend_kwargs={"dataset": str(sim_set)},
                                      **options)


def test_a_card_from_other_code_fails_loudly(sim_set, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(sim_set, copy)
    card = json.loads((copy / "card.json").read_text())
    card["splits"].pop("train")
    (copy / "card.json").write_text(json.dumps(card))
    with pytest.raises(ReplayError, match="no split 'train'"):
        replay_env(copy, split="train")
    card["request_format"] = 0
    (copy / "card.json").write_text(json.dumps(card))
    with pytest.raises(ReplayError, match="request format 0"):
        replay_env(copy, split="test")
    card["format"] = "something-else/9"
    (copy / "card.json").write_text(json.dumps(card))
    with pytest.raises(ReplayError, match="format 'something-else/9'"):
        replay_env(copy, split="test")


def test_a_miss_names_the_problem_round_agent_and_the_command(sim_set):
    dataset = ReplaySet(sim_set)
    env = sim_live(rounds=2)
    env.begin_episode(seed=0, options={"problem_index": 7})  # a test problem the set does not hold
    backend = ReplayBackend(dataset)
    backend.bind(env.task, env.config, "test")
    with pytest.raises(ReplayError) as caught:  # a problem beyond the recording: another game, not a miss
        backend.generate(env.pending_requests())
    text = str(caught.value)
    for part in ("arithmetic-test-7", "round 0", "agent 0", "python -m deliberation_env.record", "fallback="):
        assert part in text


def test_a_fallback_fills_gaps_and_can_write_them_back(sim_set, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(sim_set, copy)
    backend = ReplayBackend(ReplaySet(copy), fallback=SimBackend(), write_back=True)
    env = sim_live(rounds=2)
    backend.bind(env.task, env.config, "test")
    env.begin_episode(seed=0, options={"problem_index": 7})
    wanted = env.pending_requests()
    assert len(wanted) == 3
    filled = backend.generate(wanted)
    assert backend.misses == len(wanted) and [c.text for c in filled] == [c.text for c in SimBackend().generate(wanted)]
    again = ReplayBackend(ReplaySet(copy))  # the gaps were written as a chunk of their own
    again.bind(env.task, env.config, "test")
    assert [c.text for c in again.generate(wanted)] == [c.text for c in filled] and again.misses == 0


class FailingAfter:
    """A real backend that fails on its N-th call (a killed recording)."""

    def __init__(self, calls: int):
        self.inner, self.calls, self.requests = SimBackend(), calls, 0

    def identity(self) -> str:
        return self.inner.identity()

    def generate(self, requests):
        self.calls -= 1
        if self.calls < 0:
            raise KeyboardInterrupt
        self.requests += len(requests)
        return self.inner.generate(requests)


def test_an_interrupted_recording_resumes_and_loses_nothing(sim_set, tmp_path, monkeypatch):
    flags = ["--split", "test", "--problems", "0:4", "--streams", "2", "--rounds", "2", "--chunk", "3", "--concede-targets",
             "rule", *SIM_FLAGS]
    expected = sorted(r["key"] for r in read_records(sim_set) if r["split"] == "test")
    from deliberation_env import cli

    backends = [FailingAfter(5), FailingAfter(10**6)]
    monkeypatch.setattr(cli.BackendSettings, "build", lambda self, check_servers=True: backends[0])
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        record(["--out", str(out), *flags])
    partial = list((out / "chunks").glob("*.partial.jsonl"))
    assert len(partial) == 1 and partial[0].read_text().count("\n") == backends[0].requests > 0
    kept = partial[0].read_text().count("\n")
    backends.pop(0)
    record(["--out", str(out), *flags])
    assert backends[0].requests == len(expected) - kept  # nothing generated twice
    assert not list((out / "chunks").glob("*.partial.jsonl"))
    assert sorted(r["key"] for r in read_records(out)) == expected
    texts = {r["key"]: r["text"] for r in read_records(sim_set)}
    assert all(texts[r["key"]] == r["text"] for r in read_records(out))


def test_rerunning_a_finished_range_skips_it_without_loading_the_model(sim_set, monkeypatch, capsys):
    from deliberation_env import cli

    def no_model(self, check_servers=True):
        raise AssertionError("the model was loaded for a range that is already recorded")

    monkeypatch.setattr(cli.BackendSettings, "build", no_model)
    before = sorted((sim_set / "chunks").iterdir())
    assert record(["--out", str(sim_set), "--split", "test", "--problems", "1:3", "--streams", "2", "--rounds", "2",
                   "--chunk", "3", "--concede-targets", "rule", *SIM_FLAGS]) == 0
    assert "every chosen problem is already recorded" in capsys.readouterr().err
    assert sorted((sim_set / "chunks").iterdir()) == before
    with pytest.raises(AssertionError, match="the model was loaded"):  # a range with new problems does load it
        record(["--out", str(sim_set), "--split", "test", "--problems", "3:5", "--streams", "2", "--rounds", "2",
                "--chunk", "3", "--concede-targets", "rule", *SIM_FLAGS])
    with pytest.raises(SystemExit):  # a finished range asked for under other settings: refused, not skipped
        record(["--out", str(sim_set), "--split", "test", "--problems", "1:3", "--streams", "2", "--rounds", "3",
                "--chunk", "3", "--concede-targets", "rule", *SIM_FLAGS])
    assert "recorded with rounds=2, not 3: record a new set" in capsys.readouterr().err


def test_branch_limit_bounds_later_rounds_and_marks_the_set_partial(tmp_path):
    out = tmp_path / "partial"
    record(["--out", str(out), "--split", "test", "--problems", "0:2", "--rounds", "3", "--branch-limit", "4",
            "--sources", "critic_text", *SIM_FLAGS])
    card = ReplaySet(out).card
    assert card.partial and card.branch_limit == 4
    full = tmp_path / "full"
    record(["--out", str(full), "--split", "test", "--problems", "0:2", "--rounds", "2", "--sources", "critic_text",
            *SIM_FLAGS])
    assert len(ReplaySet(out)) < 27 * 4 * 2 * 30
    rounds = ReplaySet(full).card.stats["requests_per_problem"]
    assert float(rounds["2"]) > float(rounds["1"])  # the tree grows with the rounds


def test_records_are_plain_parquet_readable_without_the_package(sim_set):
    chunk = sorted((sim_set / "chunks").glob("*.parquet"))[0]
    first = pq.read_table(chunk).to_pylist()[0]
    assert {"key", "problem", "stream", "round", "agent", "kind", "text", "tokens", "token_logprobs"} <= set(first)
    card = json.loads((sim_set / "card.json").read_text())
    assert card["streams"] == 2 and card["task"] == "arithmetic"
    assert "Replay set" in (sim_set / "README.md").read_text()


def test_hub_ids_load_from_the_local_hub_cache_offline(sim_set, tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    repo = cache / "datasets--someone--sim-arith"
    revision = "0" * 40
    shutil.copytree(sim_set, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    assert ReplaySet(f"{HUB_PREFIX}someone/sim-arith").card.splits == ReplaySet(sim_set).card.splits
    with pytest.raises(ReplayError, match="not in the local hub cache"):
        ReplaySet(f"{HUB_PREFIX}someone/absent")


def test_unknown_names_list_the_shipped_sets():
    with pytest.raises(ReplayError, match="shipped sets"):
        ReplaySet("no-such-set")


@pytest.mark.parametrize("name", shipped())
def test_every_shipped_set_replays_without_a_miss(name):
    dataset = ReplaySet(name)
    every = dataset.card.concede_targets == "all"
    rules = CONCEDE_TARGETS if every else (dataset.card.settings["concede_target"],)
    named = (False, True) if every else (False,)  # a set with every target also serves CONCEDE to a named peer
    for split, confidence, rule, to_peer in itertools.product(dataset.card.splits, dataset.card.confidence_sources,
                                                              rules, named):
        env = replay_env(dataset, split=split, confidence=confidence, concede_target=rule, concede_to_peer=to_peer)
        rng = np.random.default_rng(0)
        for episode in range(30):
            env.reset(seed=episode)
            while env.agents:
                masks = {a: env.deliberation.action_mask(i) for i, a in enumerate(env.agents)}
                env.step({a: int(rng.choice(np.flatnonzero(m))) for a, m in masks.items()})
        assert env.backends[0].misses == 0, (split, confidence, rule, to_peer)


@pytest.mark.parametrize("name", shipped())
def test_every_joint_action_sequence_of_each_shipped_set_is_recorded(name):
    """The recorder's own walk on the records alone: every path of the card's trees (every joint action sequence,
    concede target, stream and confidence source) on problems spread over every chunk. The whole sets take minutes:
    ``python -m deliberation_env.record --check --out NAME`` walks them all."""
    dataset = ReplaySet(name)
    task = TASKS.make(dataset.card.task, **dataset.card.task_kwargs)
    for split, ids in dataset.card.splits.items():
        spread = set(ids[::max(1, len(ids) // 12)])
        problems = [p for p in task.problems(split) if p.id in spread]
        assert len(problems) == len(spread) >= min(len(ids), 12)
        assert unrecorded(dataset, task, split, problems) == [], (name, split)


def test_the_check_finds_what_a_set_lacks_and_says_so(sim_set, tmp_path, capsys):
    assert record(["--check", "--out", str(sim_set)]) == 0
    assert "test: every request of 4 problems' trees is recorded" in capsys.readouterr().out
    dataset = ReplaySet(sim_set)
    task = TASKS.make("arithmetic", levels=[0, 1])
    problems = [p for p in task.problems("test") if p.id in ("arithmetic-test-1", "arithmetic-test-2")]
    refine = next(r for r in dataset.records.values()
                  if r["round"] == 1 and r["kind"] == "refine" and r["problem"] == "arithmetic-test-2")
    del dataset.records[refine["key"]]
    missing = unrecorded(dataset, task, "test", problems)
    assert {m["problem"] for m in missing} == {"arithmetic-test-2"} and {m["round"] for m in missing} == {1}
    assert unrecorded(dataset, task, "test", problems[:1]) == []
    claims_more = tmp_path / "claims-more"  # a card that claims a stream its chunks do not hold
    shutil.copytree(sim_set, claims_more)
    card = json.loads((claims_more / "card.json").read_text())
    (claims_more / "card.json").write_text(json.dumps({**card, "streams": 3}))
    assert record(["--check", "--out", str(claims_more)]) == 1
    assert "the first of problem arithmetic-test-0 (stream 2, round 0)" in capsys.readouterr().err


def record_smollm2(out, model, *flags: str):
    """Record SmolLM2 through the CLI with ``model`` (one loaded backend for both sides of a test)."""
    from deliberation_env import cli

    original = cli.BackendSettings.build
    try:
        cli.BackendSettings.build = lambda self, check_servers=True: model
        record(["--out", str(out), "--split", "test", "--task-option", "levels=[0,1]", "--env-option",
                "critic_max_tokens=4", "--backend", "transformers", "--model", "smollm2", *flags])
    finally:
        cli.BackendSettings.build = original
    return ReplaySet(out)


@pytest.fixture(scope="module")
def smollm2_float32(converted):
    """SmolLM2 decoding one request at a time in float32, so that batching cannot move a float."""
    from deliberation_env.backends.models import smollm2_gguf_path
    from deliberation_env.backends.transformers import TransformersBackend

    return TransformersBackend(smollm2_gguf_path(), dtype="float32", batch_size=1, converted_cache_dir=converted)


def smollm2_live(model, database, **options):
    """The live env of a SmolLM2 set; its own SQLite cache, since its requests ask for other log-probabilities."""
    return deliberation_env.parallel_env(task="arithmetic", task_kwargs={"levels": [0, 1]},
                                         backend=CachedBackend(model, str(database)), split="test", critic_max_tokens=4,
                                         streams=1, invalid_action="persist", **options)


@pytest.mark.model
def test_replay_equals_the_live_model_smollm2(tmp_path, smollm2_float32):
    """Record a problem of SmolLM2, then every joint action x 2 seeds x every confidence source, replay vs live."""
    dataset = record_smollm2(tmp_path / "smol", smollm2_float32, "--problems", "0:1", "--max-tokens", "16")
    for confidence in CONFIDENCE_SOURCES:
        replayed = replay_env(dataset, split="test", confidence=confidence, invalid_action="persist")
        live = smollm2_live(smollm2_float32, tmp_path / "live.sqlite", max_rounds=1, max_tokens=16,
                            confidence=confidence)
        assert play_all_joint_actions(replayed, live, dataset.card.splits["test"], seeds=(0, 1)) == 2 * 27
        assert replayed.backends[0].misses == 0


@pytest.mark.model
def test_two_round_trees_of_the_live_model_replay_exactly_smollm2(tmp_path, smollm2_float32):
    """A real model's 2-round tree: a problem, every one of a 2-agent team's 9 x 9 joint action sequences.

    Past round 1 every joint action leaves its own state, so round 2 asks for requests that no 1-round tree holds:
    the refinements see the texts each state left, and each concede is re-introspected."""
    dataset = record_smollm2(tmp_path / "smol2", smollm2_float32, "--problems", "0:1", "--agents", "2", "--rounds",
                             "2", "--sources", "critic_text", "--max-tokens", "12")
    sizes = dataset.card.stats["requests_per_problem"]
    print("unique requests per problem, by round:", sizes)
    assert float(sizes["2"]) > 3 * float(sizes["1"])  # the states multiply past round 1
    replayed = replay_env(dataset, split="test", invalid_action="persist")
    assert replayed.config.max_rounds == 2
    live = smollm2_live(smollm2_float32, tmp_path / "live2.sqlite", num_agents=2, max_rounds=2, max_tokens=12,
                        confidence="critic_text")
    assert play_all_joint_actions(replayed, live, dataset.card.splits["test"], seeds=(0,), rounds=2) == 9**2
    assert replayed.backends[0].misses == 0


def test_one_command_trains_and_evaluates_on_a_replay_set(sim_set, tmp_path, capsys):
    from baselines.meta.train import main as train

    train(["--replay", str(sim_set), "--episodes", "256", "--no-progress", "--no-tensorboard", "--out",
           str(tmp_path / "run"), "--eval-seeds", "1"])
    table = (tmp_path / "run" / "eval" / "table.md").read_text()
    assert "| softrankpo |" in table and "| debate |" in table and "| single |" not in table
    assert "4 x 1" in table  # every recorded test problem, once (one seed: more would replay the same episodes)
    assert "The leaderboard's row" in capsys.readouterr().out
