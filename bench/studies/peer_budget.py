"""Does BenchMARL's MAPPO score above ours because it trains on three times the episodes?

    python bench/studies/peer_budget.py                          # the cells BenchMARL ran on; trains, resumable
    python bench/studies/peer_budget.py --report-only

The leaderboard trains our trainers for 4,000 episodes a run; BenchMARL's rows (bench/benchmark/peers_benchmarl.py)
for 12,000 frames, and a frame of a one-round set is one episode, so they see three times the episodes. This study
trains our trainer again at BenchMARL's budget (the learning rate the suite chose on validation, ``fit``, the
suite's seeds), scores each run exactly on validation and test, and sets three arms side by side per cell: ours at the
suite's budget (the leaderboard's runs), ours at BenchMARL's, BenchMARL's (the leaderboard's external runs). The
differences are hierarchical bootstraps over the runs and, paired, the problems (95%; a study, not the leaderboard's
family). Runs are kept under ``bench/results/peer_budget/<cell>/<trainer>-<episodes>/``; a run whose file is there is
not run again. Nothing here chooses a leaderboard row.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

from baselines.benchmark import Scores, parse_cell
from baselines.meta.trainers import leaderboard_rows
from bench.common.results import RESULTS, command_line
from bench.common.suite import EXTERNAL, external_frames, final_tests, folder_name, read, train_and_score
from deliberation_env.analysis.metrics import hierarchical_bootstrap
from deliberation_env.cli import ArgumentParser

SPLITS = ("validation", "test")


def peer_frames(args, cell) -> int:
    """The frames each of the peer's leaderboard runs trained for (they must agree)."""
    folder = os.path.join(args.suite, folder_name(cell), EXTERNAL + args.peer)
    frames = external_frames(folder)
    if not frames:
        raise SystemExit(f"no BenchMARL {args.peer} runs in {folder}: run `python bench/benchmark/peers_benchmarl.py "
                         f"--cell {cell.name} --algorithms {args.peer}` first")
    if len(frames) != 1:
        raise SystemExit(f"{folder}: the peer's runs trained for {frames} frames; one budget expected")
    return frames[0]


def train(args, cell) -> None:
    found = read(os.path.join(args.suite, folder_name(cell)))["trainers"].get(args.trainer)
    if found is None:
        raise SystemExit(f"no leaderboard runs of {args.trainer} on {cell.name}: run `python "
                         f"bench/benchmark/benchmark_suite.py --cells {cell.name} --trainers {args.trainer}` first")
    lr = float(found["chosen"].removeprefix("lr"))
    episodes = peer_frames(args, cell)  # one-round sets: a frame is an episode
    folder = os.path.join(args.out, folder_name(cell), f"{args.trainer}-{episodes}")
    for seed in args.seeds:
        scores = train_and_score(cell, args.trainer, {"lr": lr}, seed, episodes, SPLITS, folder,
                                 f"final-lr{lr:g}-seed{seed}", runs=args.runs)
        print(f"{cell.name} {args.trainer} {episodes} episodes seed {seed}: "
              + ", ".join(f"{split} {scores[split].accuracy.mean():.3f}" for split in SPLITS), flush=True)


def runs(folder: str, split: str) -> np.ndarray:
    """A folder's finished final runs on ``split``, per-problem accuracy (runs x problems), by seed; empty when none."""
    paths = [path.replace("-test.csv", f"-{split}.csv") for path in final_tests(folder)]
    return np.stack([Scores.load(p).accuracy for p in paths]) if paths else np.empty((0, 0))


def arms(args, cell) -> dict[str, dict[str, np.ndarray]]:
    """Per arm that has runs, per split, its runs' per-problem accuracy (runs x problems): ours at the suite's
    budget, ours at the peer's, the peer's."""
    episodes, suite = peer_frames(args, cell), os.path.join(args.suite, folder_name(cell))
    folders = {f"{args.trainer} ({args.suite_episodes:,} episodes)": os.path.join(suite, args.trainer),
               f"{args.trainer} ({episodes:,} episodes)": os.path.join(args.out, folder_name(cell),
                                                                         f"{args.trainer}-{episodes}"),
               f"BenchMARL {args.peer} ({episodes:,} frames)": os.path.join(suite, EXTERNAL + args.peer)}
    found = {name: {split: runs(folder, split) for split in SPLITS} for name, folder in folders.items()}
    return {name: arm for name, arm in found.items() if arm["test"].size}


def report(args, cells) -> str:
    lines = ["# Our trainer at a peer's budget", "", f"`{command_line()}`", "",
             f"Ours ({args.trainer}, the learning rate the leaderboard chose on validation) at the leaderboard's "
             f"{args.suite_episodes:,} episodes and at BenchMARL's budget (its {args.peer}'s frames; a frame is one "
             f"episode of a one-round set), beside BenchMARL's {args.peer} (its default configs), trained on `fit`, "
             "scored exactly. Differences in points, 95% hierarchical bootstrap over runs and, paired, problems.", ""]
    for cell in cells:
        found = arms(args, cell)
        names = list(found)
        lines += [f"## {cell.name}", "", "| arm | runs | validation | test |", "|---|---|---|---|"]
        for name, arm in found.items():
            lines.append(f"| {name} | {len(arm['test'])} | {arm['validation'].mean():.3f} | {arm['test'].mean():.3f} |")
        lines += ["", "| difference | validation | test |", "|---|---|---|"]
        for first, second in ((2, 0), (2, 1), (1, 0)):
            if max(first, second) < len(names):
                diffs = [hierarchical_bootstrap([found[names[first]][s], found[names[second]][s]], [1.0, -1.0])
                         for s in SPLITS]
                lines.append(f"| {names[first]} - {names[second]} | " + " | ".join(
                    f"{100 * e:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]" for e, lo, hi in diffs) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", nargs="+", default=["qwen05-arith-v2:v2", "qwen05-arith-v2:chosen-v3",
                                                       "qwen05-team-arith:chosen-v3"], help="cells BenchMARL ran on")
    parser.add_argument("--trainer", default="mappo", choices=list(leaderboard_rows()), help="ours, as the leaderboard runs it")
    parser.add_argument("--peer", default="mappo", help="BenchMARL's algorithm whose budget ours gets")
    parser.add_argument("--seeds", nargs="+", type=int, default=list(range(10)))
    parser.add_argument("--suite", default=os.path.join(RESULTS, "benchmark_suite"), help="the leaderboard's folder")
    parser.add_argument("--suite-episodes", type=int, default=4000, help="the leaderboard's episodes a run")
    parser.add_argument("--out", default=os.path.join(RESULTS, "peer_budget"), help="these runs' scores; <out>.md")
    parser.add_argument("--runs", default=os.path.join("runs", "peer_budget"), help="these runs' policies")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    try:
        cells = [parse_cell(name) for name in args.cells]
    except ValueError as error:
        parser.error(str(error))
    if not args.report_only:
        for cell in cells:
            train(args, cell)
    text = report(args, cells)
    print(text)
    with open(args.out.rstrip(os.sep) + ".md", "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":
    main()
