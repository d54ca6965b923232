"""The leaderboard under the benchmark's protocol (docs/benchmark.md): its cells, resumable, one run at a time.

    python bench/benchmark/benchmark_suite.py                                                    # LEADERBOARD_CELLS
    python bench/benchmark/benchmark_suite.py --cells qwen05-arith-v2:v2 --trainers softrankpo grpo   # runs what is missing
    python bench/benchmark/benchmark_suite.py --report-only                                      # the tables so far

Per cell (``LEADERBOARD_CELLS`` by default: the two-round games of both sets and their one-round twins; any shipped
cell with ``--cells``; a game a set was not recorded for is skipped with its reason): the fixed protocols on validation and test (the best one chosen on
validation); per trainer, an equal budget of tuning, the same small grid over each trainer's learning rate (``GRID``:
3 values x 2 tuning seeds, each run trained on ``fit`` for ``--episodes`` episodes and scored on validation), the
value with the best mean validation accuracy chosen; then ``--seeds`` runs with it (seeds 0..S-1) scored on test once
(and on validation). Every run writes its per-problem scores (``baselines.benchmark.Scores``) under
``<out>/<cell>/<trainer>/``; a run whose file is there is not run again.

The report (``<out>.md``): every cell at a glance; the row to headline, chosen on validation (the cell and trainer
whose mean validation accuracy is furthest above the cell's best protocol on validation); per cell and trainer, the
chosen value, accuracy (mean and IQM over the seeds), the difference to the best protocol with an interval over seeds
and problems at a Bonferroni-corrected level for the family of learned-vs-protocol comparisons in the report, each
seed's accuracy; per pair of trainers, the difference with its corrected interval and the probability of improvement
(rliable's: P(a run of one > a run of the other)); and the two targets (a learned row ``TARGET`` above the best
protocol with its interval above 0; a pair of trainers told apart).
"""

from __future__ import annotations

import argparse
import glob
import itertools
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

from baselines.benchmark import (
    GAMES,
    PROTOCOL_ROWS,
    Scores,
    interquartile_mean,
    loaded,
    package_version,
    parse_cell,
    protocol_scores,
)
from baselines.meta.trainers import leaderboard_rows
from bench.benchmark.tracks import budget_lines, transfer_lines
from bench.common.results import RESULTS, command_line
from bench.common.suite import (
    EPISODES,
    EXTERNAL,
    check_digests,
    choices,
    folder_name,
    headline,
    margins,
    read,
    stability,
    train_and_score,
)
from deliberation_env.analysis.metrics import hierarchical_bootstrap
from deliberation_env.cli import ArgumentParser

GRID = {"lr": (1e-3, 3e-3, 1e-2)}
"""Each trainer's tuning grid: the same values of its Adam learning rate (the default is 3e-3)."""
TUNING_SEEDS = (100, 101)
TARGET = 0.08
"""The margin over the best protocol asked of one learned row (with its interval above 0) in a sequential cell."""
OUT = os.path.join(RESULTS, "leaderboard")
"""Where runs and report go (the leaderboard of the stratified validation split; ``benchmark_suite/`` and
``benchmark_suite.md`` hold the earlier one, of the previous split)."""
RUNS = os.path.join("runs", "leaderboard")
LEADERBOARD_CELLS = ("qwen05-arith-v2:chosen-v3-r2", "qwen05-team-arith:chosen-v3-r2", "qwen05-arith-v2:chosen-v3",
                     "qwen05-team-arith:chosen-v3")
"""The cells the leaderboard runs by default, sequential games first."""


def configs() -> list[dict[str, float]]:
    return [dict(zip(GRID, values)) for values in itertools.product(*GRID.values())]


def tag(config: dict[str, float]) -> str:
    return "-".join(f"{k}{v:g}" for k, v in config.items())


def run_cell(cell, args) -> None:
    folder = os.path.join(args.out, folder_name(cell))
    for split in ("validation", "test"):
        if not glob.glob(os.path.join(folder, "protocols", f"*-{split}.csv")):
            for name, scores in protocol_scores(cell, split).items():
                scores.save(os.path.join(folder, "protocols", f"{name}-{split}.csv"))
    for algo in args.trainers:
        started = time.perf_counter()
        mine = os.path.join(folder, algo)
        tuned = {tag(c): [train_and_score(cell, algo, c, seed, args.episodes, ("validation",), mine,
                                          f"tune-{tag(c)}-seed{seed}", RUNS)["validation"].accuracy.mean()
                          for seed in TUNING_SEEDS] for c in configs()}
        chosen = max(configs(), key=lambda c: np.mean(tuned[tag(c)]))
        for seed in range(args.seeds):
            train_and_score(cell, algo, chosen, seed, args.episodes, ("validation", "test"), mine,
                            f"final-{tag(chosen)}-seed{seed}", RUNS)
        print(f"{cell.name} {algo}: chose {tag(chosen)} ({time.perf_counter() - started:.0f} s)", flush=True)


# ----------------------------------------------------------------------------- the report
def summaries(cells: list[tuple], level: float, pair_level: float) -> list[dict]:
    """Per cell found: its best protocol (on validation) and, per trainer in headline order, the test difference to
    it with its interval at ``level``, and its validation margin over that protocol; per pair of trainers, their
    difference with its interval at ``pair_level``."""
    out = []
    for cell, found in cells:
        best, ordered = choices(found)
        test = found["protocols"]["test"]
        reference = test[best].accuracy
        hindsight = max(PROTOCOL_ROWS, key=lambda n: test[n].accuracy.mean())  # never chosen: reported beside
        rows, margin = {}, margins(found)
        for algo, trainer in ordered:
            runs = np.stack([r.accuracy for r in trainer["runs"]])
            rows[algo] = {"runs": runs, "trainer": trainer, "margin": margin[algo],
                          "interval": hierarchical_bootstrap([runs, reference], [1.0, -1.0], level=level),
                          "hindsight": hierarchical_bootstrap([runs, test[hindsight].accuracy], [1.0, -1.0], level=level)}
        pairs = [(first, second, hierarchical_bootstrap([rows[first]["runs"], rows[second]["runs"]], [1.0, -1.0],
                                                        level=pair_level))
                 for first, second in itertools.combinations(rows, 2)]
        out.append({"cell": cell, "found": found, "best": best, "rows": rows, "pairs": pairs,
                    "hindsight": hindsight if test[hindsight].accuracy.mean() > reference.mean() else None})
    return out


def points(diff: float, low: float, high: float, bold: bool = True) -> str:
    diff, low, high = (round(100 * x, 1) + 0.0 for x in (diff, low, high))  # + 0.0: no "-0.0"
    text = f"{diff:+.1f} [{low:+.1f}, {high:+.1f}]"
    return f"**{text}**" if bold and (low > 0 or high < 0) else text


def report(args, skipped: list[str] = ()) -> str:
    cells, incomplete = [], []
    for cell in args.cells:
        found = read(os.path.join(args.out, folder_name(cell)))
        check_digests(cell, found)
        for algo, trainer in list(found["trainers"].items()):
            if len(trainer["runs"]) < args.seeds:  # a sweep under way: its row waits for all its seeds
                incomplete.append(f"{cell.name} {algo}: {len(trainer['runs'])} of {args.seeds} seeds")
                del found["trainers"][algo]
        if found["trainers"]:
            cells.append((cell, found))
    comparisons = sum(len(found["trainers"]) for _, found in cells)
    level = 1 - 0.05 / max(1, comparisons)
    pairs = sum(len(found["trainers"]) * (len(found["trainers"]) - 1) // 2 for _, found in cells)
    pair_level = 1 - 0.05 / max(1, pairs)
    found_cells = summaries(cells, level, pair_level)
    lines = ["# Leaderboard under the benchmark protocol", "", f"`{command_line()}`", "",
             f"Trained on `fit` ({args.episodes} episodes a run), every choice made on `validation`, read on `test` "
             f"once. Intervals: hierarchical bootstrap over the seeds and, paired, the problems, at the "
             f"Bonferroni-corrected level {100 * level:.2f}% for the {comparisons} learned-vs-protocol comparisons "
             f"below (simultaneous 95%); the {pairs} pairs of trainers, at {100 * pair_level:.2f}% (their own family's).", "",
             "Sets (name#digest, docs/benchmark.md#citing-a-row): "
             + ", ".join(f"`{loaded(name).identity}`" for name in sorted({cell.dataset for cell, _ in cells}))
             + f"; deliberation-env {package_version()}.", ""]
    lines += overview(found_cells, level)
    if found_cells:
        chosen, algo = headline(cells)
        cell = next(c for c in found_cells if c["cell"] is chosen)
        row, reference = cell["rows"][algo], cell["found"]["protocols"]["test"][cell["best"]].accuracy
        alone = hierarchical_bootstrap([row["runs"], reference], [1.0, -1.0], level=0.95)
        lines += [f"**The row to headline**, chosen on validation (the largest mean validation accuracy over the "
                  f"cell's best protocol on validation, {100 * row['margin']:+.1f} points): **{algo} on "
                  f"{cell['cell'].name}**, on test {points(*alone, bold=False)} points [95%: one comparison, chosen "
                  f"without test] ({points(*row['interval'], bold=False)} at the table's {100 * level:.2f}%).", ""]
    for summary in found_cells:
        lines += cell_lines(summary, level, pair_level, args.episodes)
    tracks = budget_lines(args.out, [cell for cell, _ in cells]) + transfer_lines(args.out, [cell for cell, _ in cells])
    if tracks:
        lines += ["## Tracks", "", *tracks]
    lines += target_lines(found_cells, level)
    if skipped:
        lines += ["", "Not run:", *[f"- {line}" for line in skipped]]
    if incomplete:
        lines += ["", "Rows still running (left out of every table and level above):", *[f"- {line}" for line in incomplete]]
    return "\n".join(lines)


def overview(found_cells: list[dict], level: float) -> list[str]:
    """One table: a row per cell, its best protocol's test accuracy and each trainer's difference to it."""
    if not found_cells:
        return []
    found = {a for c in found_cells for a in c["rows"]}
    algos = [a for a in leaderboard_rows() if a in found] + sorted(found - set(leaderboard_rows()))
    lines = [f"Every cell at a glance: each trainer's test difference to the cell's best protocol, points "
             f"[{100 * level:.2f}%] (**bold**: above 0).", "",
             "| cell | best protocol (test) | " + " | ".join(algos) + " |", "|---|---|" + "---|" * len(algos)]
    for c in found_cells:
        entries = [points(*c["rows"][a]["interval"]) if a in c["rows"] else "-" for a in algos]
        test = c["found"]["protocols"]["test"][c["best"]].accuracy.mean()
        lines.append(f"| {c['cell'].name} | {c['best']} {test:.3f} | " + " | ".join(entries) + " |")
    return [*lines, ""]


def cell_lines(summary: dict, level: float, pair_level: float, episodes: int) -> list[str]:
    """A cell's section: its protocols, the trainers' rows (ours trained for ``episodes`` a run), their tuning and
    their pairs."""
    cell, found, best = summary["cell"], summary["found"], summary["best"]
    validation, test = found["protocols"]["validation"], found["protocols"]["test"]
    rows = summary["rows"]
    shares = stability({name: validation[name].accuracy for name in PROTOCOL_ROWS})
    lines = [f"## {cell.name}", "", f"Best protocol on validation: **{best}** ({validation[best].accuracy.mean():.3f} "
             f"validation, {test[best].accuracy.mean():.3f} test), chosen in {100 * shares[best]:.0f}% of bootstrap "
             "resamples of the validation problems. Protocols on validation / test (the gap between the splits): "
             + ", ".join(f"{n} {validation[n].accuracy.mean():.3f} / {s.accuracy.mean():.3f}"
                         for n, s in sorted(test.items()) if n in validation) + ".", "", *judge_lines(cell, test[best]),
             f"Rows in order of mean validation accuracy (the cell's row to headline first: **{next(iter(rows))}**).",
             "", "| trainer | lr (chosen on validation) | seeds | validation accuracy | test accuracy | IQM | vs best "
             f"protocol, points [{100 * level:.2f}%] | tokens | per seed |", "|---|---|---|---|---|---|---|---|---|"]
    for algo, row in rows.items():
        per_seed, trainer = row["runs"].mean(1), row["trainer"]
        lines.append(f"| {algo} | {trainer['chosen'].removeprefix('lr')} | {len(per_seed)} | "
                     f"{trainer['validation']:.3f} | {per_seed.mean():.3f} | {interquartile_mean(per_seed):.3f} | "
                     f"{points(*row['interval'])} | {np.mean([r.tokens.mean() for r in trainer['runs']]):,.0f} | "
                     + ", ".join(f"{v:.3f}" for v in per_seed) + " |")
    hindsight = summary["hindsight"]
    if hindsight:
        lines += ["", f"On test, {hindsight} ({test[hindsight].accuracy.mean():.3f}) scores above the protocol "
                  f"validation chose. Against it (in hindsight, so not the leaderboard's comparison; points "
                  f"[{100 * level:.2f}%]): " + "; ".join(f"{algo} {points(*row['hindsight'])}" for algo, row in rows.items())
                  + "."]
    externals = [algo for algo in rows if algo.startswith(EXTERNAL)]
    if externals:
        frames = sorted({n for algo in externals for n in rows[algo]["trainer"]["frames"]})
        budget = (f", {' or '.join(f'{n:,}' for n in frames)} frames a run (a frame is one episode of a one-round set;"
                  f" ours: {episodes:,} episodes)") if frames else ""
        lines += ["", f"`{EXTERNAL}*`: BenchMARL's algorithms with its own default configs, untuned "
                  f"(`bench/benchmark/peers_benchmarl.py`, docs/peers.md){budget}."]
    lines += ["", "Tuning (mean validation accuracy over the tuning seeds, per learning rate; how often the chosen value "
              "would be chosen again on a bootstrap resample of the validation problems):", "",
              "| trainer | " + " | ".join(tag(c) for c in configs()) + " | chosen again |",
              "|---|" + "---|" * (len(configs()) + 1)]
    for algo, row in rows.items():
        grid, trainer = row["trainer"]["grid"], row["trainer"]
        if not grid:
            continue
        again = stability({tag(c): trainer["grid_runs"][tag(c)] for c in configs() if tag(c) in trainer["grid_runs"]})
        lines.append(f"| {algo} | " + " | ".join(f"{np.mean(grid.get(tag(c), [np.nan])):.3f}" for c in configs())
                     + f" | {100 * again.get(trainer['chosen'], 0.0):.0f}% |")
    if summary["pairs"]:
        lines += ["", f"Pairs (row - column): difference in points [{100 * pair_level:.2f}%], and the probability "
                  "that a run of the first beats a run of the second (ties half).", "",
                  "| first | second | difference | P(first > second) |", "|---|---|---|---|"]
        for first, second, interval in summary["pairs"]:
            improved = improvement(rows[first]["runs"].mean(1), rows[second]["runs"].mean(1))
            lines.append(f"| {first} | {second} | {points(*interval)} | {improved:.2f} |")
    return [*lines, ""]


def judge_lines(cell, protocol) -> list[str]:
    """The judge baseline's line in a cell's section (bench/studies/judge.py; the same outcome in every game of a set),
    against the cell's protocol on the same test problems; [] before the judge has run on the whole split."""
    path = os.path.join(RESULTS, "judge", f"{os.path.basename(cell.dataset)}-test.csv")
    if not os.path.isfile(path):
        return []
    judge = Scores.load(path)
    if sorted(judge.problem_ids) != sorted(protocol.problem_ids):
        return [f"Judge baseline: {len(judge.problem_ids)} of {len(protocol.problem_ids)} test problems judged so far.",
                ""]
    order = {pid: k for k, pid in enumerate(judge.problem_ids)}
    accuracy = judge.accuracy[[order[pid] for pid in protocol.problem_ids]]
    diff, low, high = hierarchical_bootstrap([accuracy, protocol.accuracy], [1.0, -1.0], level=0.95)
    return [f"Judge baseline (the recording model keeps one of the three round-0 solutions; bench/studies/judge.py): "
            f"test {accuracy.mean():.3f}, {judge.tokens.mean():,.0f} tokens a problem; vs {protocol.label}: "
            f"{points(diff, low, high, bold=False)} points [95%, paired problems].", ""]


def target_lines(found_cells: list[dict], level: float) -> list[str]:
    margin = [f"{c['cell'].name} {algo} {points(*row['interval'], bold=False)}"
              + (f" (against {c['hindsight']}, the best protocol on test in hindsight: "
                 f"{points(*row['hindsight'], bold=False)})" if c["hindsight"] else "")
              for c in found_cells for algo, row in c["rows"].items()
              if row["interval"][0] >= TARGET and row["interval"][1] > 0]
    apart = [f"{c['cell'].name} {first} - {second} {points(*interval, bold=False)}" for c in found_cells
             for first, second, interval in c["pairs"] if interval[1] > 0 or interval[2] < 0]
    return ["## Targets", "",
            f"- A learned row {100 * TARGET:.0f} points or more above the best protocol, its {100 * level:.2f}% "
            "interval above 0: " + ("; ".join(margin) if margin else "not reached in any cell"),
            "- A pair of trainers told apart (its corrected interval excludes 0): "
            + ("; ".join(apart) if apart else "none in any cell"), ""]


def improvement(first: np.ndarray, second: np.ndarray) -> float:
    """P(X > Y) + P(X = Y) / 2 over the runs' accuracies X of one trainer and Y of another (rliable's
    probability of improvement, on one task)."""
    greater = (first[:, None] > second[None, :]).mean()
    equal = (first[:, None] == second[None, :]).mean()
    return float(greater + equal / 2)


def main(argv=None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", nargs="+",
                        help="cells '<set>:<game>' (a set: a shipped name or a folder); default: every shipped cell")
    parser.add_argument("--trainers", nargs="*", default=list(leaderboard_rows()), choices=list(leaderboard_rows()))
    parser.add_argument("--seeds", type=int, default=10, help="final runs per trainer (seeds 0..S-1)")
    parser.add_argument("--episodes", type=int, default=EPISODES)
    parser.add_argument("--out", default=OUT)
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    cells, skipped = [], []
    for name in args.cells or LEADERBOARD_CELLS:
        try:
            cells.append(parse_cell(name))
        except ValueError as error:
            if name.rpartition(":")[2] not in GAMES:
                parser.error(str(error))
            skipped.append(f"{name}: {error}")  # a game the set was not recorded for
    args.cells = cells
    if not args.report_only:
        for cell in cells:
            run_cell(cell, args)
    text = report(args, skipped)
    path = args.out.rstrip("/") + ".md"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print(text)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
