"""Numbers you can cite (issue: set identity): a set digest that names what was played, the shipped sets pinned,
content checked at bind, the problems table checked against the task, and a game that differs from the recording
refused at its reset even behind a wrapper that hides the replay backend."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import deliberation_env
from baselines.benchmark import GAMES
from deliberation_env.make import DepartureWarning, replay_env
from deliberation_env.record import main as record
from deliberation_env.replay import PINNED, ReplayBackend, ReplayError, ReplayMiss, ReplaySet, env_settings, shipped
from deliberation_env.replay.card import SETS_DIR, card_digest, load_card, write_card
from deliberation_env.replay.format import entry_of, read_chunk, sha256_file, write_chunk
from tests.test_replay import SIM_FLAGS
from tests.test_replay_binding import Hiding


@pytest.fixture(scope="module")
def sim_set(tmp_path_factory) -> Path:
    """A small 1-round sim set: 4 test problems in 2 chunks, 2 streams."""
    out = tmp_path_factory.mktemp("sets") / "sim-small"
    record(["--out", str(out), "--split", "test", "--problems", "0:4", "--chunk", "2", "--streams", "2", "--rounds",
            "1", "--concede-targets", "rule", *SIM_FLAGS])
    return out


@pytest.fixture
def copy(sim_set, tmp_path) -> Path:
    return Path(shutil.copytree(sim_set, tmp_path / "copy"))


def reseal(folder: Path, name: str, records: list[dict]) -> None:
    """Rewrite a chunk and put its new checksum in the card, as one who edits a set by hand would."""
    card = load_card(folder)
    card.files[name] = write_chunk(folder / name, records)
    write_card(folder, card)


# ---------------------------------------------------------------------------------------------- the digest
def test_the_digest_is_the_card_s_canonical_sha256_and_names_the_set(sim_set):
    dataset = ReplaySet(sim_set)
    text = (sim_set / "card.json").read_text()
    assert dataset.digest == card_digest(text) == card_digest(json.dumps(json.loads(text), indent=4))
    assert len(dataset.digest) == 16 and dataset.identity == f"sim-small#{dataset.digest}"
    assert dataset.digest in repr(dataset) and dataset.digest in repr(ReplayBackend(dataset))


@pytest.mark.parametrize("name", shipped())
def test_every_shipped_set_carries_its_pinned_digest(name):
    assert load_card(name).name == name
    assert card_digest((SETS_DIR / name / "card.json").read_text()) == PINNED[name]


def test_a_forged_card_of_a_shipped_set_is_refused_naming_both_digests(tmp_path):
    """Two problems swapped with their records re-keyed and the card resealed: every checksum fits, the pin does not."""
    forged = Path(shutil.copytree(SETS_DIR / "qwen05-arith-v2", tmp_path / "qwen05-arith-v2"))
    card = load_card(forged)
    card.splits["test"][:2] = card.splits["test"][1::-1]
    (forged / "card.json").write_text(card.to_json())  # a card rewritten, nothing else
    found = card_digest((forged / "card.json").read_text())
    for build in (lambda: ReplaySet(forged), lambda: replay_env(forged, split="test"), lambda: load_card(forged)):
        with pytest.raises(ReplayError, match=rf"has digest {found}, but the set of that name shipped .* has digest "
                                              rf"{PINNED['qwen05-arith-v2']}"):
            build()


def test_a_pin_refuses_another_set_and_accepts_its_own(sim_set, copy):
    digest = ReplaySet(sim_set).digest
    assert ReplaySet(f"{sim_set}#{digest}").digest == digest
    assert replay_env(str(sim_set), split="test", digest=digest).backends[0].set.digest == digest
    name = "chunks/test-00000-00001.parquet"
    records = read_chunk(copy / name)
    records[0] = {**records[0], "text": records[0]["text"] + " 7"}  # one answer changed, the card resealed
    reseal(copy, name, records)
    with pytest.raises(ReplayError, match=rf"has digest [0-9a-f]{{16}}, not the pinned {digest}"):
        ReplaySet(f"{copy}#{digest}")
    with pytest.raises(ReplayError, match=f"not the pinned {digest}"):
        replay_env(copy, split="test", digest=digest)


# ---------------------------------------------------------------------------------------------- content
def test_a_record_replaced_by_a_junk_one_is_refused_at_the_first_bind(copy):
    """The count per problem stays; the content does not (a record removed and a junk one added, resealed)."""
    name = "chunks/test-00002-00003.parquet"
    records = read_chunk(copy / name)
    dropped = next(r for r in records if r["kind"] == "refine")
    junk = {**dropped, "key": "0" * 32, "text": "junk"}
    reseal(copy, name, [r for r in records if r is not dropped] + [junk])
    with pytest.raises(ReplayError, match=rf"the records of problem '{dropped['problem']}' differ from those {name} held"):
        replay_env(copy, split="test")


def test_a_solve_text_replaced_is_refused_at_the_first_bind(copy):
    name = "chunks/test-00000-00001.parquet"
    records = read_chunk(copy / name)
    solve = next(r for r in records if r["kind"] == "solve")
    reseal(copy, name, [{**r, "text": "The answer is 12345"} if r is solve else r for r in records])
    with pytest.raises(ReplayError, match=rf"the records of problem '{solve['problem']}' differ"):
        replay_env(copy, split="test")


def test_a_gold_answer_changed_in_the_problems_table_is_refused(copy):
    path = copy / "problems" / "test.parquet"
    table = pq.read_table(path).to_pylist()
    table[1]["answer"] = str(int(table[1]["answer"]) + 1)
    pq.write_table(pa.Table.from_pylist(table, schema=pq.read_schema(path)), path)
    card = load_card(copy)
    card.files["problems/test.parquet"] = entry_of(path)
    write_card(copy, card)
    assert sha256_file(path) == load_card(copy).files["problems/test.parquet"]["sha256"]
    with pytest.raises(ReplayError, match=rf"problems/test.parquet has gold answer '{table[1]['answer']}', the task "):
        replay_env(copy, split="test")


# ---------------------------------------------------------------------------------------------- hidden games
def hidden(backend, split="test", **options):
    """An env that plays through a wrapper hiding the replay backend, after a checked env bound it."""
    settings = env_settings(backend.set.card)
    deliberation_env.parallel_env(backend=backend, split="test", **settings)
    return deliberation_env.parallel_env(backend=Hiding(backend), split=split,
                                         **{**settings, "streams": backend.set.card.streams, **options})


@pytest.mark.parametrize(("options", "reset", "message"), [
    ({}, {"problem_index": 7}, "holds no problem 'arithmetic-test-7'"),
    ({"task_kwargs": {"levels": [2]}}, {"problem_index": 0}, "solve prompt of problem 'arithmetic-test-0'"),
    ({"num_agents": 4}, {"problem_index": 0}, "num_agents=3; a request of agent 3"),
    ({"streams": 3}, {"problem_index": 0}, "holds 2 stream"),
    ({"roles": ["a", {"name": "b", "prompt": "no_code", "temperature": 0.7}, "a"]}, {"problem_index": 0},
     "solve prompt of problem 'arithmetic-test-0' \\(stream \\d, agent 1\\)"),
])
def test_a_hidden_env_of_another_game_is_refused_at_its_reset(sim_set, options, reset, message):
    backend = ReplayBackend(sim_set)
    env = hidden(backend, **options)
    with pytest.raises(ReplayError, match=message):  # streams=3: the first seed whose episode plays stream 2
        for seed in range(12):
            env.reset(seed=seed, options=reset)


def test_a_hidden_smaller_team_is_refused_at_its_first_step(sim_set):
    """A team of 2 makes only recorded requests in round 0; its first refine names the game, not a miss."""
    backend = ReplayBackend(sim_set)
    env = hidden(backend, num_agents=2)
    env.reset(seed=0, options={"problem_index": 0})
    with pytest.raises(ReplayError, match="tree up to round 1, but not this refine request .* team of another size"):
        env.step({agent: 1 for agent in env.agents})


def test_a_checked_env_s_miss_is_still_a_replay_miss(copy):
    """A record lost after the check (here: dropped from memory) is a miss that names its place, not a game."""
    dataset = ReplaySet(copy)
    env = replay_env(dataset, split="test")
    env.reset(seed=0, options={"problem_index": 0})
    for key in [k for k, r in dataset.records.items() if r["round"] == 1]:
        del dataset.records[key]
    dataset._found.clear()
    card = dataset.card
    card.partial = True  # a partial set's later rounds may lack a branch
    with pytest.raises(ReplayMiss, match="arithmetic-test-0"):
        env.step({agent: 1 for agent in env.agents})


def test_replay_env_warns_of_a_departure_from_the_recording_and_not_of_a_cell_s_game():
    with pytest.warns(DepartureWarning, match=r"qwen05-arith-v2#89b24af15d44ca1e played with departures from its "
                                              r"recording: confidence='critic' \(recorded 'critic_text'\)"):
        replay_env("qwen05-arith-v2", split="test", confidence="critic")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for game in GAMES.values():  # every cell's game, the sequential ones too
            replay_env("qwen05-arith-v2", split="test", **game)
