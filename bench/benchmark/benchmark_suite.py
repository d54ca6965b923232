"""The leaderboard under the benchmark's protocol (docs/benchmark.md), resumable, one run at a time.

    python bench/benchmark/benchmark_suite.py --cells qwen05-arith-v2:v2 --trainers softrankpo grpo      # runs what is missing
    python bench/benchmark/benchmark_suite.py --report-only                                               # the tables so far

Per cell: the fixed protocols on validation and test (the best one chosen on validation); per trainer, an equal
budget of tuning, the same small grid over each trainer's learning rate (``GRID``: 3 values x 2 tuning seeds, each
run trained on ``fit`` for ``--episodes`` episodes and scored on validation), the value with the best mean validation
accuracy chosen; then ``--seeds`` runs with it (seeds 0..S-1) scored on test once (and on validation). Every run
writes its per-problem scores (``baselines.benchmark.Scores``) under ``<out>/<cell>/<trainer>/``; a run whose file is
there is not run again. The report: per cell and trainer, the chosen value, accuracy (mean and IQM over the
seeds), the difference to the best protocol with an interval over seeds and problems at a Bonferroni-corrected level
for the family of learned-vs-protocol comparisons in the table, each seed's accuracy; per pair of trainers, the
difference with its corrected interval and the probability of improvement (rliable's: P(a run of one > a run of the
other)).
"""

from __future__ import annotations

import argparse
import glob
import itertools
import os
import time

import numpy as np
from _results import RESULTS, command_line
from _suite import TRAINERS, choices, read, train_and_score

from baselines.benchmark import interquartile_mean, parse_cell, protocol_scores
from deliberation_env.analysis.metrics import hierarchical_bootstrap
from deliberation_env.cli import ArgumentParser

GRID = {"lr": (1e-3, 3e-3, 1e-2)}
"""Each trainer's tuning grid: the same values of its Adam learning rate (the default is 3e-3)."""
TUNING_SEEDS = (100, 101)
OUT = os.path.join(RESULTS, "benchmark_suite")


def configs() -> list[dict[str, float]]:
    return [dict(zip(GRID, values)) for values in itertools.product(*GRID.values())]


def tag(config: dict[str, float]) -> str:
    return "-".join(f"{k}{v:g}" for k, v in config.items())


def run_cell(cell, args) -> None:
    folder = os.path.join(args.out, cell.name.replace(":", "-"))
    for split in ("validation", "test"):
        if not glob.glob(os.path.join(folder, "protocols", f"*-{split}.csv")):
            for name, scores in protocol_scores(cell, split).items():
                scores.save(os.path.join(folder, "protocols", f"{name}-{split}.csv"))
    for algo in args.trainers:
        started = time.perf_counter()
        mine = os.path.join(folder, algo)
        tuned = {tag(c): [train_and_score(cell, algo, c, seed, args.episodes, ("validation",), mine,
                                          f"tune-{tag(c)}-seed{seed}")["validation"].accuracy.mean()
                          for seed in TUNING_SEEDS] for c in configs()}
        chosen = max(configs(), key=lambda c: np.mean(tuned[tag(c)]))
        for seed in range(args.seeds):
            train_and_score(cell, algo, chosen, seed, args.episodes, ("validation", "test"), mine,
                            f"final-{tag(chosen)}-seed{seed}")
        print(f"{cell.name} {algo}: chose {tag(chosen)} ({time.perf_counter() - started:.0f} s)", flush=True)


# ----------------------------------------------------------------------------- the report
def report(args) -> str:
    cells = [(parse_cell(name), read(os.path.join(args.out, name.replace(":", "-")))) for name in args.cells]
    cells = [(cell, found) for cell, found in cells if found["trainers"]]
    comparisons = sum(len(found["trainers"]) for _, found in cells)
    level = 1 - 0.05 / max(1, comparisons)
    lines = ["# Leaderboard under the benchmark protocol", "", f"`{command_line()}`", "",
             f"Trained on `fit` ({args.episodes} episodes a run), every choice made on `validation`, read on `test` "
             f"once. Intervals: hierarchical bootstrap over the seeds and, paired, the problems, at the "
             f"Bonferroni-corrected level {100 * level:.2f}% for the {comparisons} learned-vs-protocol comparisons "
             "below (simultaneous 95%); pairs of trainers use the level corrected for their own family.", ""]
    for cell, found in cells:
        validation, test = found["protocols"]["validation"], found["protocols"]["test"]
        best, rows = choices(found)
        reference = test[best].accuracy
        lines += [f"## {cell.name}", "", f"Best protocol on validation: **{best}** ({validation[best].accuracy.mean():.3f} "
                  f"validation, {reference.mean():.3f} test). Protocols on test: " + ", ".join(
                      f"{n} {s.accuracy.mean():.3f}" for n, s in sorted(test.items())) + ".", "",
                  "| trainer | lr (chosen on validation) | seeds | validation accuracy | test accuracy | IQM | vs best "
                  f"protocol, points [{100 * level:.2f}%] | tokens | per seed |", "|---|---|---|---|---|---|---|---|---|"]
        lines[-2:-2] = [f"The row to headline, chosen on validation (the best trainer's mean validation accuracy over "
                        f"its seeds): **{rows[0][0]}**. Rows are in that order.", ""]
        for algo, trainer in rows:
            runs = np.stack([r.accuracy for r in trainer["runs"]])
            diff, low, high = hierarchical_bootstrap([runs, reference], [1.0, -1.0], level=level)
            per_seed = runs.mean(1)
            cellv = f"{100 * diff:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"
            lines.append(f"| {algo} | {trainer['chosen'].removeprefix('lr')} | {len(per_seed)} | "
                         f"{trainer['validation']:.3f} | {per_seed.mean():.3f} | "
                         f"{interquartile_mean(per_seed):.3f} | {f'**{cellv}**' if low > 0 else cellv} | "
                         f"{np.mean([r.tokens.mean() for r in trainer['runs']]):,.0f} | "
                         + ", ".join(f"{v:.3f}" for v in per_seed) + " |")
        lines += ["", "Tuning (mean validation accuracy over the tuning seeds, per learning rate):", "",
                  "| trainer | " + " | ".join(tag(c) for c in configs()) + " |", "|---|" + "---|" * len(configs())]
        for algo, trainer in rows:
            lines.append(f"| {algo} | " + " | ".join(
                f"{np.mean(trainer['grid'].get(tag(c), [np.nan])):.3f}" for c in configs()) + " |")
        names = [algo for algo, _ in rows]
        pairs = list(itertools.combinations(names, 2))
        if pairs:
            pair_level = 1 - 0.05 / len(pairs)
            lines += ["", f"Pairs (row - column): difference in points [{100 * pair_level:.2f}%], and the probability "
                      "that a run of the first beats a run of the second (ties half).", "",
                      "| first | second | difference | P(first > second) |", "|---|---|---|---|"]
            for first, second in pairs:
                a = np.stack([r.accuracy for r in found["trainers"][first]["runs"]])
                b = np.stack([r.accuracy for r in found["trainers"][second]["runs"]])
                diff, low, high = hierarchical_bootstrap([a, b], [1.0, -1.0], level=pair_level)
                cellv = f"{100 * diff:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"
                lines.append(f"| {first} | {second} | {f'**{cellv}**' if low > 0 or high < 0 else cellv} | "
                             f"{improvement(a.mean(1), b.mean(1)):.2f} |")
        lines.append("")
    return "\n".join(lines)


def improvement(first: np.ndarray, second: np.ndarray) -> float:
    """P(X > Y) + P(X = Y) / 2 over the runs' accuracies X of one trainer and Y of another (rliable's
    probability of improvement, on one task)."""
    greater = (first[:, None] > second[None, :]).mean()
    equal = (first[:, None] == second[None, :]).mean()
    return float(greater + equal / 2)


def main() -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", nargs="+", default=["qwen05-arith-v2:v2"])
    parser.add_argument("--trainers", nargs="*", default=list(TRAINERS), choices=list(TRAINERS))
    parser.add_argument("--seeds", type=int, default=10, help="final runs per trainer (seeds 0..S-1)")
    parser.add_argument("--episodes", type=int, default=4000)
    parser.add_argument("--out", default=OUT)
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    if not args.report_only:
        for name in args.cells:
            run_cell(parse_cell(name), args)
    text = report(args)
    path = args.out.rstrip("/") + ".md"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print(text)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
