"""The leaderboard's two tracks beside its main table: sample efficiency and transfer (docs/benchmark.md).

    python bench/benchmark/tracks.py budgets --cells qwen05-team-arith:chosen-v3-r2          # ours at each budget
    python bench/benchmark/tracks.py transfer                                                  # scoring only
    python bench/benchmark/benchmark_suite.py --report-only                                    # both in the report

**Sample efficiency.** Each trainer trained on ``fit`` for each budget of ``BUDGETS`` episodes, ``--seeds`` runs
(seeds 0..S-1), with the learning rate the leaderboard chose for it on that cell's validation split (the tuning is the
4,000-episode one: a budget does not tune again); each run scored exactly on validation and test. BenchMARL's rows
come from ``bench/benchmark/peers_benchmarl.py --frames F --stem budget-<episodes>`` (a frame is one step: F =
episodes x rounds). The report gives each trainer's test accuracy at each budget and the area under that curve (the
trapezoids over log(budget), as an accuracy), intervals over seeds and paired problems, and the pairs of
trainers whose area differs at the family's Bonferroni level. Runs write ``<out>/<cell>/<trainer>/budget-<episodes>-
seed<k>-<split>.csv``; a run whose file is there is not run again.

**Transfer.** Every final run of the leaderboard (its checkpoint under ``runs/leaderboard``) scored, exactly, on
another cell whose observation and actions have the same shape: the other set's same game (``qwen05-arith-v2`` and
``qwen05-team-arith`` swap), and a one-round game's policy on its two-round twin (``chosen-v3`` on ``chosen-v3-r2``:
round 2 masks REFINE, which the env plays as PERSIST). Written to ``<out>/<cell>/<trainer>/transfer-<seed>-from-
<source cell folder>-test.csv``. The report gives each transfer's accuracy against the target cell's own trainer and
protocol (intervals over seeds and paired problems, 95%). ``--retrain S`` trains seeds 0..S-1 of a final run again
where its checkpoint is gone (another machine, a clean clone) and prints whether the retrained run gave the committed
test outcomes.
"""

from __future__ import annotations

import argparse
import glob
import itertools
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

from baselines.benchmark import Scores, parse_cell, policy_scores
from baselines.meta.trainers import leaderboard_rows
from bench.common.results import RESULTS
from bench.common.suite import EPISODES, EXTERNAL, folder_name, read, train_and_score
from deliberation_env.analysis.metrics import hierarchical_bootstrap
from deliberation_env.cli import ArgumentParser

BUDGETS = (500, 2000, 8000)
"""The sample-efficiency track's budgets (episodes); the leaderboard's own 4,000-episode runs join them."""
OUT = os.path.join(RESULTS, "leaderboard")
RUNS = os.path.join("runs", "leaderboard")
SWAP = {"qwen05-arith-v2": "qwen05-team-arith", "qwen05-team-arith": "qwen05-arith-v2"}


def chosen_config(folder: str, algo: str) -> dict[str, float]:
    """The learning rate the leaderboard chose for ``algo`` in a cell's folder (from its final runs' names)."""
    finals = glob.glob(os.path.join(folder, algo, "final-lr*-seed0-test.csv"))
    if not finals:
        raise SystemExit(f"tracks.py: {folder}/{algo} has no final run yet: run bench/benchmark/benchmark_suite.py "
                         f"--cells ... --trainers {algo} first (the track uses the learning rate it chose)")
    return {"lr": float(os.path.basename(finals[0]).split("-")[1].removeprefix("lr"))}


def run_budgets(cells, trainers, seeds: int, out: str) -> None:
    for cell, algo in itertools.product(cells, trainers):
        folder = os.path.join(out, folder_name(cell))
        config = chosen_config(folder, algo)
        for budget, seed in itertools.product(BUDGETS, range(seeds)):
            train_and_score(cell, algo, config, seed, budget, ("validation", "test"), os.path.join(folder, algo),
                            f"budget-{budget}-seed{seed}", runs=RUNS)
        print(f"{cell.name} {algo}: budgets {BUDGETS} x {seeds} seeds done", flush=True)


def targets(cell) -> list:
    """The cells a policy of ``cell`` transfers to (same observation and action shapes)."""
    found = []
    if cell.dataset in SWAP:
        found.append(parse_cell(f"{SWAP[cell.dataset]}:{cell.game}"))
    if not cell.game.endswith("-r2"):
        found.append(parse_cell(f"{cell.name}-r2"))
    return found


def retrain_final(cell, algo: str, seed: int, out: str) -> None:
    """Train a final run of the leaderboard again (its learning rate, seed and budget) for its checkpoint, when
    ``runs/leaderboard`` no longer holds it; say whether it reproduced the committed run's test outcomes (bit for bit
    on the leaderboard's machine and kernel path, not across CPUs: docs/benchmark.md, Machines)."""
    folder = os.path.join(out, folder_name(cell))
    committed = glob.glob(os.path.join(folder, algo, f"final-lr*-seed{seed}-test.csv"))
    if not committed:
        return  # a run the leaderboard does not hold (a trainer or seed it did not run on this cell)
    stem = os.path.basename(committed[0]).removesuffix("-test.csv")
    if os.path.isfile(os.path.join(RUNS, folder_name(cell), algo, stem, "policy.pt")):
        return
    scratch = os.path.join(RUNS, "retrained", folder_name(cell), algo)
    again = train_and_score(cell, algo, chosen_config(folder, algo), seed, EPISODES, ("test",), scratch, stem,
                            runs=RUNS)["test"].accuracy
    before = Scores.load(committed[0]).accuracy
    same = "the committed run's test outcomes" if np.array_equal(again, before) else (
        f"test {again.mean():.3f} against the committed {before.mean():.3f} (another machine or kernel path)")
    print(f"{cell.name} {algo} seed {seed}: retrained, {same}", flush=True)


def run_transfer(cells, out: str, retrain: int = 0) -> None:
    for cell in cells:
        for algo in leaderboard_rows():
            for k in range(retrain):
                retrain_final(cell, algo, k, out)
            checkpoints = sorted(glob.glob(os.path.join(RUNS, folder_name(cell), algo, "final-*", "policy.pt")))
            for path, target in itertools.product(checkpoints, targets(cell)):
                seed = path.split("seed")[-1].split(os.sep)[0]
                stem = os.path.join(out, folder_name(target), algo, f"transfer-{seed}-from-{folder_name(cell)}")
                if not os.path.isfile(stem + "-test.csv"):
                    policy_scores(path, target, "test", label=algo).save(stem + "-test.csv")
        print(f"{cell.name}: transfers scored", flush=True)


# ----------------------------------------------------------------------------- the report's sections
def budget_runs(folder: str, algo: str) -> dict[int, np.ndarray]:
    """Per budget, (seeds, problems) test accuracies of a trainer's track runs (the leaderboard's final runs as
    4,000 episodes, or an external row's frames as episodes)."""
    found: dict[int, list[np.ndarray]] = {}
    for path in glob.glob(os.path.join(folder, algo, "budget-*-test.csv")):
        budget = int(os.path.basename(path).split("-")[1])
        found.setdefault(budget, []).append(Scores.load(path).accuracy)
    return {budget: np.stack(runs) for budget, runs in sorted(found.items())}


def log_area_weights(budgets: list[int]) -> np.ndarray:
    """Trapezoid weights of the area under an accuracy curve over log(budget), normalised to the log range: the area
    is an accuracy, the curve's mean on a log axis whatever the spacing of the budgets."""
    x = np.log(np.asarray(budgets, dtype=float))
    if len(x) < 2:
        return np.ones(len(x))
    gaps = np.diff(x)
    return (np.concatenate([gaps, [0.0]]) + np.concatenate([[0.0], gaps])) / 2 / (x[-1] - x[0])


def budget_lines(out: str, cells) -> list[str]:
    """The sample-efficiency section: per cell with track runs, each row's accuracy per budget and its area; pairs
    of areas told apart at the Bonferroni level for every cell's pairs together (the report's rule for a family)."""
    tracks = []
    for cell in cells:
        folder = os.path.join(out, folder_name(cell))
        found = read(folder)
        rows = {}
        externals = sorted(os.path.basename(p) for p in glob.glob(os.path.join(folder, EXTERNAL + "*")))
        for algo in [*leaderboard_rows(), *externals]:
            runs = budget_runs(folder, algo)
            if runs and algo in leaderboard_rows() and algo in found["trainers"]:  # the leaderboard's runs: seeds 0..S-1
                seeds = min(len(r) for r in runs.values())
                runs[EPISODES] = np.stack([r.accuracy for r in found["trainers"][algo]["runs"][:seeds]])
            if len(runs) > 1:
                rows[algo] = dict(sorted(runs.items()))
        if rows:
            budgets = sorted({b for runs in rows.values() for b in runs})
            tracks.append((cell, budgets, {a: r for a, r in rows.items() if sorted(r) == budgets}))
    family = sum(len(complete) * (len(complete) - 1) // 2 for _, _, complete in tracks)
    level = 1 - 0.05 / max(1, family)
    lines: list[str] = []
    for cell, budgets, complete in tracks:
        lines += [f"### Sample efficiency: {cell.name}", "",
                  f"Test accuracy after each budget (episodes), mean over seeds [95% over seeds and problems], and the "
                  f"area under that curve on a log axis (trapezoids over log(budget), as an accuracy); the learning rate "
                  f"is the one chosen at {EPISODES:,} episodes. Pairs whose areas differ at {100 * level:.2f}% (Bonferroni "
                  f"over the {family} pairs of every cell's track):", "",
                  "| trainer | seeds | " + " | ".join(f"{b:,}" for b in budgets) + " | area |",
                  "|---|---|" + "---|" * (len(budgets) + 1)]
        weights = log_area_weights(budgets)
        areas = {}
        for algo, runs in complete.items():
            seeds = min(len(r) for r in runs.values())
            area = np.tensordot(weights, np.stack([runs[b][:seeds] for b in budgets]), axes=1)
            areas[algo] = area
            cells_text = [_interval(runs[b]) for b in budgets]
            lines.append(f"| {algo} | {seeds} | " + " | ".join(cells_text) + f" | {_interval(area)} |")
        apart = []
        for first, second in itertools.combinations(areas, 2):
            diff, low, high = hierarchical_bootstrap([areas[first], areas[second]], [1.0, -1.0], level=level)
            if low > 0 or high < 0:
                apart.append(f"{first} - {second} {100 * diff:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]")
        lines += ["", "Told apart: " + ("; ".join(apart) if apart else "none") + ".", ""]
    return lines


def transfer_lines(out: str, cells) -> list[str]:
    """The transfer section: each transfer's test accuracy against the target cell's own trainer."""
    rows = []
    for target in cells:
        folder = os.path.join(out, folder_name(target))
        own = read(folder)["trainers"]
        for algo in leaderboard_rows():
            for path_source in sorted({p.split("-from-")[1].removesuffix("-test.csv") for p in
                                       glob.glob(os.path.join(folder, algo, "transfer-*-test.csv"))}):
                runs = np.stack([Scores.load(p).accuracy for p in
                                 sorted(glob.glob(os.path.join(folder, algo, f"transfer-*-from-{path_source}-test.csv")))])
                entry = f"| {path_source} | {target.name} | {algo} | {len(runs)} | {_interval(runs)} |"
                if algo in own:
                    mine = np.stack([r.accuracy for r in own[algo]["runs"]])
                    entry += f" {mine.mean():.3f} | {_interval(runs, mine, points=True)} |"
                else:
                    entry += " - | - |"
                rows.append(entry)
    if not rows:
        return []
    return ["### Transfer", "", "Final runs of one cell scored on another of the same shapes (test accuracy, 95% over "
            "seeds and problems); the target's own trainer, trained on it, beside (all its final runs). Checkpoints "
            "trained again where they were missing (`tracks.py transfer --retrain`) are the leaderboard's runs bit for "
            "bit only on its machine and kernel path.", "",
            "| trained on | scored on | trainer | seeds | accuracy | target's own | transfer - own, points |",
            "|---|---|---|---|---|---|---|", *rows, ""]


def _interval(runs: np.ndarray, minus: np.ndarray | None = None, points: bool = False) -> str:
    cells, weights = ([runs], [1.0]) if minus is None else ([runs, minus], [1.0, -1.0])
    mean, low, high = hierarchical_bootstrap(cells, weights, level=0.95)
    if points:
        return f"{100 * mean:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"
    return f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def main(argv=None) -> None:
    parser = ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    budgets = commands.add_parser("budgets", help="train every trainer at each budget of BUDGETS")
    budgets.add_argument("--cells", nargs="+", required=True)
    budgets.add_argument("--trainers", nargs="*", default=list(leaderboard_rows()), choices=list(leaderboard_rows()))
    budgets.add_argument("--seeds", type=int, default=5)
    transfer = commands.add_parser("transfer", help="score every final run on the cells it transfers to")
    transfer.add_argument("--cells", nargs="+", default=None, help="source cells (default: the leaderboard's)")
    transfer.add_argument("--retrain", type=int, default=0, metavar="S",
                          help="train seeds 0..S-1 of each final run again where its checkpoint is missing")
    for sub in (budgets, transfer):
        sub.add_argument("--out", default=OUT)
    args = parser.parse_args(argv)
    from bench.benchmark.benchmark_suite import LEADERBOARD_CELLS

    cells = [parse_cell(c) for c in (args.cells or LEADERBOARD_CELLS)]
    if args.command == "budgets":
        run_budgets(cells, args.trainers, args.seeds, args.out)
    else:
        run_transfer(cells, args.out, args.retrain)


if __name__ == "__main__":
    main()
