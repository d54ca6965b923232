"""bench/benchmark/benchmark_suite.py: the leaderboard's runs on a recorded set: tuned on validation (never on test),
final seeds read on test, resumable run by run, a game the set was not recorded for listed with its reason, and a
report whose tables and targets read the runs' files."""

from __future__ import annotations

import glob
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from baselines.benchmark import Cell, Scores
from deliberation_env.record import main as record
from tests.test_replay import SIM_FLAGS

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    root = tmp_path_factory.mktemp("suite-sets")
    for split, problems in (("train", "0:16"), ("test", "0:8")):
        record(["--out", str(root / "all"), "--split", split, "--problems", problems, "--chunk", "16", *SIM_FLAGS])
    record(["--out", str(root / "rule"), "--split", "train", "--problems", "0:2", "--concede-targets", "rule",
            *SIM_FLAGS])
    return root


def test_the_suite_tunes_on_validation_reads_test_once_resumes_and_reports(sets, tmp_path):
    from bench.benchmark import benchmark_suite as suite
    out = tmp_path / "suite"
    flags = ["--cells", f"{sets / 'all'}:v2", f"{sets / 'rule'}:chosen-v3", "--trainers", "sft", "grpo", "--seeds", "2",
             "--episodes", "20", "--out", str(out)]
    suite.main(flags)
    cell = out / "all-v2"
    for algo in ("sft", "grpo"):
        tuned = {}
        for path in glob.glob(str(cell / algo / "tune-*-validation.csv")):
            tuned.setdefault(os.path.basename(path).split("-")[1], []).append(path)
        assert sorted(tuned) == sorted(suite.tag(c) for c in suite.configs())
        assert all(len(paths) == len(suite.TUNING_SEEDS) for paths in tuned.values())
        assert not glob.glob(str(cell / algo / "tune-*-test.csv")), "tuning runs are never scored on test"
        finals = sorted(glob.glob(str(cell / algo / "final-*-test.csv")))
        assert len(finals) == 2 and all(os.path.isfile(p.replace("-test.csv", "-validation.csv")) for p in finals)
        means = {value: np.mean([Scores.load(p).accuracy.mean() for p in paths]) for value, paths in tuned.items()}
        chosen = os.path.basename(finals[0]).split("-")[1]
        assert means[chosen] == max(means.values())  # the value chosen is the best on validation
    board = (tmp_path / "suite.md").read_text()
    assert "level 97.50% for the 2 learned-vs-protocol comparisons" in board  # Bonferroni over the 2 rows
    glance = board.split("Every cell at a glance")[1].split("##")[0]
    assert "| cell | best protocol (test) | grpo | sft |" in glance  # a row per cell, a column per trainer
    assert glance.replace(f"{sets}/", "").count("| all:v2 |") == 1
    assert "**The row to headline**" in board and "## Targets" in board
    assert "Not run:" in board and "rule:chosen-v3" in board.split("Not run:")[1]
    assert "no 'chosen-v3' game" in board.split("Not run:")[1]
    made = {path: os.stat(path).st_mtime_ns for path in glob.glob(str(cell / "*" / "*.csv"))}
    suite.main(flags)  # resumed: every run is there, none runs again
    assert {path: os.stat(path).st_mtime_ns for path in made} == made

    # An external row (peers_benchmarl.py's files: final-default-seed<k>, untuned) is read and reported beside ours.
    external = cell / f"{suite.EXTERNAL}peer"
    external.mkdir()
    for path in glob.glob(str(cell / "sft" / "final-*.csv")):
        scores = Scores.load(path)
        scores.label = external.name
        scores.save(external / os.path.basename(path).replace(os.path.basename(path).split("-")[1], "default"))
        stem = os.path.basename(path).split("-seed")[1].split("-")[0]
        (external / f"final-default-seed{stem}.json").write_text(json.dumps({"frames": 12000}))
    suite.main([*flags, "--report-only"])
    board = (tmp_path / "suite.md").read_text()
    # its budget beside ours: a peer that trains on more episodes says so
    assert "12,000 frames a run (a frame is one episode of a one-round set; ours: 20 episodes)" in board
    assert "level 98.33% for the 3 learned-vs-protocol comparisons" in board
    assert f"| cell | best protocol (test) | grpo | sft | {external.name} |" in board
    table = board.split("| trainer | lr (chosen on validation)")[1].split("\n\n")[0].splitlines()[2:]
    row = {line.split(" | ")[0].removeprefix("| "): line.split(" | ") for line in table}
    assert row[external.name][1] == "default" and row["sft"][1] != "default"
    assert row[external.name][3:7] == row["sft"][3:7]  # the same runs: the same accuracies and difference
    tuning = board.split("Tuning (mean validation accuracy")[1].split("Pairs")[0]
    assert external.name not in tuning and "| sft |" in tuning

    # A row with fewer final seeds than asked (a sweep under way) waits outside the tables and their levels.
    (external / "final-default-seed1-test.csv").unlink()
    suite.main([*flags, "--report-only"])
    board = (tmp_path / "suite.md").read_text()
    assert "level 97.50% for the 2 learned-vs-protocol comparisons" in board
    assert f"{external.name}: 1 of 2 seeds" in board.split("Rows still running")[1]


def test_a_cell_of_an_unknown_game_is_one_line_on_stderr(capsys):
    with pytest.raises(SystemExit):
        from bench.benchmark import benchmark_suite
        benchmark_suite.main(["--cells", "qwen05-arith-v2:v9", "--report-only"])
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_the_quick_look_scores_its_rows_the_leaderboards_way(sets, tmp_path):
    """replay_benchmark.py: its rows are baselines.benchmark's (the protocol to beat chosen on validation, the runs'
    exact test scores), and its tree analysis follows them."""
    from baselines.benchmark import best_protocol, protocol_scores
    from bench.benchmark import replay_benchmark as quick
    cell, out = f"{sets / 'all'}:v2", tmp_path / "quick"
    quick.main(["--cell", cell, "--algos", "sft", "--seeds", "0", "1", "--episodes", "20", "--resamples", "10",
                "--out", str(out)])
    meta = (out / "meta.json").read_text()
    best = best_protocol(cell)
    assert f'"best_protocol": "{best}"' in meta
    table = {line.split(",")[0]: line.split(",") for line in (out / "table.csv").read_text().splitlines()[1:]}
    runs = [Scores.load(out / "scores" / "sft" / f"seed{seed}-test.csv") for seed in (0, 1)]
    assert float(table["sft"][1]) == pytest.approx(np.mean([r.accuracy.mean() for r in runs]), abs=1e-4)
    reference = protocol_scores(cell, "test", (best,))[best].accuracy.mean()
    assert float(table[best][1]) == pytest.approx(reference, abs=1e-4) and float(table[best][2]) == 0
    report = (out / "report.md").read_text()
    assert f"The protocol to beat, {best}, is the best fixed protocol on the validation split" in report
    assert "What the recorded tree says" in report and "**Learnable headroom**" in report


def test_a_protocol_better_on_test_than_validations_choice_is_reported_beside_never_chosen():
    """Validation picks the protocol to beat; where another scores higher on test, the report gives the rows against it
    too (in hindsight), and the leaderboard's comparison stays against validation's choice."""
    from baselines.benchmark import PROTOCOL_ROWS
    from bench.benchmark import benchmark_suite as suite
    ids = [f"p{i}" for i in range(40)]
    rng = np.random.default_rng(0)

    def scores(label, split, accuracy):
        return Scores(label, "set:v2", split, ids, np.asarray(accuracy, float), np.full(len(ids), 100.0))

    validation = {n: scores(n, "validation", rng.random(40) < (0.7 if n == "self_consistency" else 0.5))
                  for n in PROTOCOL_ROWS}
    test = {n: scores(n, "test", rng.random(40) < {"debate": 0.8, "self_consistency": 0.4}.get(n, 0.3))
            for n in PROTOCOL_ROWS}
    runs = [scores("sft", "test", rng.random(40) < 0.6) for _ in range(3)]
    found = {"protocols": {"validation": validation, "test": test},
             "trainers": {"sft": {"runs": runs, "grid": {}, "chosen": "lr0.001", "validation": 0.75, "frames": []}}}
    cell = Cell("set", "v2")
    [summary] = suite.summaries([(cell, found)], 0.95, 0.95)
    assert summary["best"] == "self_consistency" and summary["hindsight"] == "debate"
    reference = test["self_consistency"].accuracy.mean()
    assert summary["rows"]["sft"]["interval"][0] == pytest.approx(np.mean([r.accuracy.mean() for r in runs]) - reference)
    text = "\n".join(suite.cell_lines(summary, 0.95, 0.95, 4000))
    assert "On test, debate (" in text and "in hindsight" in text


def test_the_row_to_headline_is_chosen_on_validation_across_cells():
    """The headline is the largest validation margin over the cell's own protocol (chosen on validation): not the
    best test score, nor the highest validation accuracy in a cell whose protocol is as high."""
    from baselines.benchmark import PROTOCOL_ROWS
    from bench.common import suite
    ids = [f"p{i}" for i in range(10)]

    def found(protocol_validation: float, trainers: dict[str, tuple[float, float]]) -> dict:
        def scores(label, split, value):
            return Scores(label, "set:v2", split, ids, np.full(len(ids), value), np.full(len(ids), 100.0))
        return {"protocols": {split: {n: scores(n, split, protocol_validation if n == "debate" else 0.1)
                                      for n in PROTOCOL_ROWS} for split in ("validation", "test")},
                "trainers": {algo: {"runs": [scores(algo, "test", test)], "grid": {}, "chosen": "lr0.001",
                                    "validation": validation} for algo, (validation, test) in trainers.items()}}

    high = found(0.80, {"ppo": (0.85, 0.99)})  # the best test score and validation accuracy, a 5-point margin
    low = found(0.40, {"sft": (0.50, 0.45), "mappo": (0.52, 0.41)})  # margins of 10 and 12 points
    assert suite.headline([("high", high), ("low", low)]) == ("low", "mappo")
    assert suite.choices(low)[0] == "debate"


def test_the_peer_budget_study_trains_ours_for_the_peers_frames(sets, tmp_path, monkeypatch):
    """bench/studies/peer_budget.py: its middle arm is our trainer again with the peer's frames as episodes (the
    suite's learning rate and seeds), so the arms differ by their budget alone; the report sets the three side by
    side."""
    from baselines.meta.policy import load_checkpoint

    monkeypatch.chdir(tmp_path)  # the trained policies go under runs/ here
    from bench.benchmark import benchmark_suite as suite
    from bench.studies import peer_budget as study
    name, out = f"{sets / 'all'}:v2", tmp_path / "suite"
    suite.main(["--cells", name, "--trainers", "mappo", "--seeds", "2", "--episodes", "20", "--out", str(out)])
    cell = out / "all-v2"
    peer = cell / f"{suite.EXTERNAL}mappo"
    peer.mkdir()
    for path in glob.glob(str(cell / "mappo" / "final-*.csv")):  # the peer's files, as peers_benchmarl.py writes them
        Scores.load(path).save(peer / os.path.basename(path).replace(os.path.basename(path).split("-")[1], "default"))
    for seed in (0, 1):
        (peer / f"final-default-seed{seed}.json").write_text(json.dumps({"frames": 60}))
    study.main(["--cells", name, "--seeds", "0", "1", "--suite", str(out), "--suite-episodes", "20",
                "--out", str(tmp_path / "budget"), "--runs", "again"])
    lr = os.path.basename(glob.glob(str(cell / "mappo" / "final-*-seed0-test.csv"))[0]).split("-")[1]
    for seed in (0, 1):
        ours = load_checkpoint(glob.glob(f"runs/leaderboard/all-v2/mappo/final-{lr}-seed{seed}/policy.pt")[0])
        again = load_checkpoint(glob.glob(f"again/all-v2/mappo/final-{lr}-seed{seed}/policy.pt")[0])
        assert (ours["config"]["episodes"], again["config"]["episodes"]) == (20, 60)
        assert {k: v for k, v in ours["config"].items() if k not in ("episodes", "out")} == \
            {k: v for k, v in again["config"].items() if k not in ("episodes", "out")}
        assert os.path.isfile(tmp_path / "budget" / "all-v2" / "mappo-60" / f"final-{lr}-seed{seed}-validation.csv")
    board = (tmp_path / "budget.md").read_text()
    for arm in ("| mappo (20 episodes) | 2 |", "| mappo (60 episodes) | 2 |", "| BenchMARL mappo (60 frames) | 2 |"):
        assert arm in board
    assert "| BenchMARL mappo (60 frames) - mappo (60 episodes) |" in board


def test_the_readme_leaderboard_is_the_committed_reports():
    """Every entry of the README's leaderboard table is the committed report's (bench/results/leaderboard.md) for
    its cell and trainer, and the level it names is the report's: a re-rendered report leaves no stale README."""
    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text(encoding="utf-8")
    report = (root / "bench" / "results" / "leaderboard.md").read_text(encoding="utf-8")

    def table(text: str, header: str) -> tuple[list[str], list[list[str]]]:
        lines = text.split(header, 1)[1].split("\n\n", 1)[0].splitlines()
        split = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in [header + lines[0], *lines[2:]]]
        return split[0], split[1:]

    columns, rows = table(readme, "| cell | protocol (test) |")
    theirs, found = table(report, "| cell | best protocol (test) |")
    names = {"team:": "qwen05-team-arith:", "arith-v2:": "qwen05-arith-v2:", "arith:": "qwen05-arith:"}
    reported = {row[0]: dict(zip(theirs, row)) for row in found}
    assert len(rows) == len(reported)
    for row in rows:
        cell = next(full + row[0][len(short):] for short, full in names.items() if row[0].startswith(short))
        for column, entry in zip(columns[2:], row[2:]):
            trainer = column.replace("BenchMARL ", "benchmarl-")
            assert reported[cell].get(trainer, "-") == entry, (cell, trainer)
        assert reported[cell]["best protocol (test)"].endswith(row[1])
    level = report.split("Bonferroni-corrected level ", 1)[1].split("%", 1)[0]
    comparisons = report.split("% for the ", 1)[1].split(" ", 1)[0]
    assert f"all {comparisons} comparisons ({level}%" in readme


def test_the_tracks_train_at_each_budget_retrain_missing_runs_and_transfer(sets, tmp_path, monkeypatch, capsys):
    """bench/benchmark/tracks.py on the suite's runs: budgets trained with the chosen learning rate and reported with
    their log-axis area; a final run whose checkpoint is gone is trained again, reproduces the committed outcomes on
    this machine, and its policy is scored on the cell's two-round twin."""
    from bench.benchmark import benchmark_suite as suite
    from bench.benchmark import tracks
    monkeypatch.chdir(tmp_path)  # runs/leaderboard is relative to the working directory
    monkeypatch.setattr(tracks, "BUDGETS", (10,))
    monkeypatch.setattr(tracks, "EPISODES", 20)
    out, cell = tmp_path / "board", f"{sets / 'all'}:v2"
    suite.main(["--cells", cell, "--trainers", "sft", "--seeds", "2", "--episodes", "20", "--out", str(out)])
    tracks.main(["budgets", "--cells", cell, "--trainers", "sft", "--seeds", "2", "--out", str(out)])
    chosen = os.path.basename(glob.glob(str(out / "all-v2" / "sft" / "final-*-seed0-test.csv"))[0]).split("-")[1]
    assert sorted(os.path.basename(p) for p in glob.glob(str(out / "all-v2" / "sft" / "budget-*-test.csv"))) == [
        "budget-10-seed0-test.csv", "budget-10-seed1-test.csv"]
    lines = "\n".join(tracks.budget_lines(str(out), [suite.parse_cell(cell)]))
    assert "| trainer | seeds | 10 | 20 | area |" in lines and "| sft | 2 |" in lines
    assert chosen.startswith("lr")

    checkpoints = tmp_path / "runs" / "leaderboard" / "all-v2" / "sft"
    assert (checkpoints / f"final-{chosen}-seed0" / "policy.pt").is_file()
    shutil.rmtree(checkpoints / f"final-{chosen}-seed0")
    capsys.readouterr()
    tracks.main(["transfer", "--cells", cell, "--retrain", "2", "--out", str(out)])
    printed = capsys.readouterr().out
    assert "sft seed 0: retrained, the committed run's test outcomes" in printed
    assert "seed 1: retrained" not in printed  # its checkpoint is there: not trained again
    transferred = sorted(glob.glob(str(out / "all-v2-r2" / "sft" / "transfer-*-from-all-v2-test.csv")))
    assert len(transferred) == 2
    assert Scores.load(transferred[0]).split == "test"


def test_the_log_area_is_the_curves_mean_on_a_log_axis():
    from bench.benchmark.tracks import log_area_weights
    weights = log_area_weights([500, 2000, 4000, 8000])
    assert weights.sum() == pytest.approx(1.0)
    x = np.log([500, 2000, 4000, 8000])
    assert weights @ (3 * x + 1) == pytest.approx(3 * (x[0] + x[-1]) / 2 + 1)  # a line's area: its midpoint value
    assert list(log_area_weights([1000])) == [1.0]
