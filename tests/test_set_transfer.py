"""bench/studies/set_transfer.py: a policy trained on one replay set plays another's test split; the in-domain rows are the
benchmark's own training and play (``bench/common/replay_rows.py``), and sets whose layouts differ are refused with the difference."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from baselines.meta.evaluate import PolicyActor
from deliberation_env.record import main as record
from deliberation_env.replay import ReplaySet
from tests.test_replay import SIM_FLAGS
from tests.test_roles import TEAM


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    root = tmp_path_factory.mktemp("sets")
    for name, extra in (("homogeneous", []), ("team", ["--env-option", f"roles={TEAM!r}"])):
        for split in ("train", "test"):
            record(["--out", str(root / name), "--split", split, "--problems", "0:6", "--chunk", "6", *SIM_FLAGS,
                    *extra])
    return root


def test_each_policy_plays_every_set_and_the_in_domain_row_is_the_benchmarks(sets, tmp_path,
                                                                            monkeypatch):
    from bench.common import replay_rows as benchmark
    from bench.studies import set_transfer as transfer
    trained, played = {}, []  # policy -> (set, seed) it trained on; (target set, that pair) per play

    def train_policy(dataset, algo, seed, args, run_dir=None):
        policy = benchmark.train_policy(dataset, algo, seed, args, run_dir)
        trained[id(policy)] = (dataset.path.name, seed)
        return policy

    def play_rows(dataset, actor_for, seeds, options=None, split="test"):
        played.append((dataset.path.name, trained[id(actor_for(0).policy)]))
        return benchmark.play_rows(dataset, actor_for, seeds, options, split)

    monkeypatch.setattr(transfer, "train_policy", train_policy)
    monkeypatch.setattr(transfer, "play_rows", play_rows)
    out = tmp_path / "transfer"
    transfer.main(["--sets", str(sets / "homogeneous"), str(sets / "team"), "--algos", "sft", "--seeds", "0", "1",
                   "--episodes", "20", "--out", str(out)])
    names = ("homogeneous", "team")
    assert sorted(played) == sorted((t, (s, seed)) for t in names for s in names for seed in (0, 1))
    with open(f"{out}.csv") as handle:
        rows = {(r["target"], r["source"]): r for r in csv.DictReader(handle)}
    assert set(rows) == {(t, s) for t in names for s in names}
    assert np.isnan(float(rows["team", "team"]["drop"])) and not np.isnan(float(rows["team", "homogeneous"]["drop"]))
    for target, source in rows:  # drop = in-domain - transferred, on the same problems
        if target != source:
            drop = float(rows[target, target]["accuracy"]) - float(rows[target, source]["accuracy"])
            assert float(rows[target, source]["drop"]) == pytest.approx(drop, abs=1e-3)
    settings = type("Args", (), {"episodes": 20, "features": "v3", "out": str(tmp_path / "bench"),
                                 "env_options": {"concede_to_peer": True}})()
    team = ReplaySet(sets / "team")
    alone = []
    for seed in (0, 1):
        policy = benchmark.train_policy(team, "sft", seed, settings)
        alone.append(benchmark.play_rows(team, lambda s, p=policy: PolicyActor(p), [0], benchmark.options(settings))
                     ["correct"].mean())
    assert float(rows["team", "team"]["accuracy"]) == pytest.approx(np.mean(alone), abs=1e-3)
    assert "| team | sft | homogeneous |" in (tmp_path / "transfer.md").read_text()


def test_sets_of_different_layouts_are_refused_with_the_difference(sets, tmp_path):
    pair = tmp_path / "pair"
    flags = [f if f != "3" else "2" for f in SIM_FLAGS]  # --agents 2
    record(["--out", str(pair), "--split", "test", "--problems", "0:2", "--chunk", "2", *flags])
    from bench.studies import set_transfer as transfer
    with pytest.raises(SystemExit, match="differ in layout"):
        transfer.main(["--sets", str(sets / "homogeneous"), str(pair), "--algos", "sft", "--seeds", "0",
                       "--episodes", "5", "--out", str(tmp_path / "x")])
