"""The suite leaderboard: every trainer on every shipped replay set and game, one replay_benchmark run per cell.

    python bench/benchmark/replay_suite.py                                   # every shipped set x CELLS, 3 seeds
    python bench/benchmark/replay_suite.py --sets qwen05-arith-v2 --cells chosen-v3 --seeds 0 1 2 3
    python bench/benchmark/replay_suite.py --report-only                     # the leaderboard of the cells run so far

``CELLS`` are the games a set can be played as: the 3-action game with features v1 and v2, and chosen concede
targets (``concede_to_peer=True``) with features v3. A cell a set was not recorded for is skipped with its reason.
Each cell runs ``bench/benchmark/replay_benchmark.py`` (every trainer, each seed, trained on the train split, played on the
test split; the best protocol chosen on train; hierarchical intervals over training seeds and problems; without its
tree analysis, which bench/studies/headroom.py gives for every set and game) into
``<out>/<set>/<cell>/``; a cell already there is not run again (``--force`` runs it again). The leaderboard,
``<out>.md``, gives per cell each row's difference to the best protocol and checks two targets: a learned row
at least 5 points above the best protocol with its interval above 0, and a pair of trainers whose difference
interval excludes 0.
"""

from __future__ import annotations

import csv
import json
import os

import replay_benchmark
from _replay_rows import ALGOS
from _results import RESULTS

from baselines.benchmark import GAMES
from deliberation_env.cli import ArgumentParser
from deliberation_env.make import replay_env
from deliberation_env.replay import ReplayError, ReplaySet, shipped

CELLS = GAMES
"""The games of the leaderboard's cells (``baselines.benchmark.GAMES``), each run as one replay_benchmark run."""
TARGET = 0.05
"""The margin over the best protocol the suite asks of one learned row (with its interval above 0)."""


def run_cell(name: str, cell: str, args) -> str | None:
    """Runs one cell into its folder (unless there already); returns why it cannot run, or None."""
    options = CELLS[cell]
    dataset = ReplaySet(name)
    try:
        replay_env(dataset, split="train", **options)
    except ReplayError as error:
        return str(error).replace(f" ({dataset.path})", "")  # no folder of this machine in the leaderboard
    out = os.path.join(args.out, os.path.basename(name.rstrip("/")), cell)
    if os.path.isfile(os.path.join(out, "meta.json")) and not args.force:
        return None
    argv = ["--dataset", name, "--features", options["features"], "--seeds", *map(str, args.seeds),
            "--episodes", str(args.episodes), "--resamples", str(args.resamples), "--out", out, "--no-analysis", "--algos", *args.algos]
    for key, value in options.items():
        if key != "features":
            argv += ["--env-option", f"{key}={value}"]
    replay_benchmark.main(argv)
    return None


def read_cell(folder: str) -> dict | None:
    if not os.path.isfile(os.path.join(folder, "meta.json")):
        return None
    with open(os.path.join(folder, "meta.json"), encoding="utf-8") as f:
        meta = json.load(f)
    with open(os.path.join(folder, "table.csv"), encoding="utf-8") as f:
        rows = {row["name"]: {k: (v if k == "name" else float(v)) for k, v in row.items()} for row in csv.DictReader(f)}
    with open(os.path.join(folder, "pairs.csv"), encoding="utf-8") as f:
        pairs = [{k: (v if k in ("first", "second") else float(v)) for k, v in row.items()} for row in csv.DictReader(f)]
    return {"meta": meta, "rows": rows, "pairs": pairs}


def leaderboard(args, skipped: list[str]) -> str:
    found_cells = [(cell, found) for name in args.sets for cell in args.cells
                   if (found := read_cell(os.path.join(args.out, os.path.basename(name.rstrip("/")), cell)))]
    minutes = sum(found["meta"].get("seconds", 0.0) for _, found in found_cells) / 60
    lines = ["# Suite leaderboard", "",
             f"`python bench/benchmark/replay_suite.py --sets {' '.join(args.sets)} --cells {' '.join(args.cells)} --seeds "
             f"{' '.join(map(str, args.seeds))} --episodes {args.episodes}` ({len(found_cells)} cells, "
             f"{minutes:.1f} min of runs in all; a resumed run skips the cells already there)", "",
             "Each learned row: accuracy on the test split, and its difference to the best protocol (chosen on the "
             "train split) with a hierarchical 95% interval resampling training seeds and, paired, problems. "
             f"Targets: a learned row at least {TARGET:+.2f} above the best protocol with its interval above 0; "
             "a pair of trainers whose difference interval excludes 0.", ""]
    lines += overview(found_cells)
    targets = {"margin": [], "pair": []}
    for cell, found in found_cells:
        meta, rows = found["meta"], found["rows"]
        best = meta["best_protocol"]
        learned = sorted((r for n, r in rows.items() if n in meta["algos"]), key=lambda r: -r["accuracy"])
        lines += [f"## {meta['dataset']}, {cell} ({meta['test_problems']} test problems, seeds {meta['seeds']})",
                  "", f"Best protocol (on train): {best}, {rows[best]['accuracy']:.3f} on test; oracle "
                  f"{rows['oracle']['accuracy']:.3f}.", "",
                  "| trainer | accuracy | vs best protocol [95%] | tokens / problem |", "|---|---|---|---|"]
        for row in learned:
            lines.append(f"| {row['name']} | {row['accuracy']:.3f} | {row['diff']:+.3f} [{row['diff_low']:+.3f}, "
                         f"{row['diff_high']:+.3f}] | {row['tokens']:,.0f} |")
            if row["diff"] >= TARGET and row["diff_low"] > 0:
                targets["margin"].append(f"{meta['dataset']} {cell}: {row['name']} {row['diff']:+.3f}")
        separated = [p for p in found["pairs"] if p["diff_low"] > 0 or p["diff_high"] < 0]
        for p in separated:
            targets["pair"].append(f"{meta['dataset']} {cell}: {p['first']} - {p['second']} {p['diff']:+.3f} "
                                   f"[{p['diff_low']:+.3f}, {p['diff_high']:+.3f}]")
        lines.append("")
    lines += ["## Targets", "",
              f"- A learned row {TARGET:+.2f} or more above the best protocol, interval above 0: "
              + ("; ".join(targets["margin"]) if targets["margin"] else "not reached in any cell"),
              "- A pair of trainers told apart (interval excludes 0): "
              + ("; ".join(targets["pair"]) if targets["pair"] else "none in any cell")]
    if skipped:
        lines += ["", "Not run:", *[f"- {line}" for line in skipped]]
    return "\n".join(lines) + "\n"


def overview(found_cells: list[tuple[str, dict]]) -> list[str]:
    """One table of every cell: each trainer's difference to the cell's best protocol, in points, with its interval
    (bold where the interval is above 0), and the best protocol and oracle of each cell."""
    if not found_cells:
        return []
    algos = list(dict.fromkeys(a for _, found in found_cells for a in found["meta"]["algos"]))
    heads = [f"{found['meta']['dataset']}, {cell}" for cell, found in found_cells]
    lines = ["Every cell at a glance: each trainer's difference to the cell's best protocol in points, 95% interval "
             "(**bold**: above 0).", "", "| | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
    for algo in algos:
        cells = []
        for _, found in found_cells:
            row = found["rows"].get(algo)
            text = "-" if row is None else (f"{100 * row['diff']:+.1f} [{100 * row['diff_low']:+.1f}, "
                                             f"{100 * row['diff_high']:+.1f}]")
            cells.append(f"**{text}**" if row is not None and row["diff_low"] > 0 else text)
        lines.append(f"| {algo} | " + " | ".join(cells) + " |")
    best = [f"{f['meta']['best_protocol']} {f['rows'][f['meta']['best_protocol']]['accuracy']:.3f}"
            for _, f in found_cells]
    lines += ["| best protocol (on train), test accuracy | " + " | ".join(best) + " |",
              "| oracle | " + " | ".join(f"{f['rows']['oracle']['accuracy']:.3f}" for _, f in found_cells) + " |", ""]
    return lines


def main(argv=None) -> None:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", nargs="+", default=shipped(), help="replay sets: shipped names or folders")
    parser.add_argument("--cells", nargs="+", default=list(CELLS), choices=list(CELLS))
    parser.add_argument("--algos", nargs="+", default=list(ALGOS), choices=list(ALGOS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--episodes", type=int, default=4000)
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples of the AUROC intervals")
    parser.add_argument("--out", default=os.path.join(RESULTS, "replay_suite"))
    parser.add_argument("--force", action="store_true", help="run cells again that are already there")
    parser.add_argument("--report-only", action="store_true", help="write the leaderboard of the cells there")
    args = parser.parse_args(argv)
    skipped = []
    if not args.report_only:
        for name in args.sets:
            for cell in args.cells:
                why = run_cell(name, cell, args)
                if why:
                    skipped.append(f"{name}, {cell}: {why}")
    text = leaderboard(args, skipped)
    with open(f"{args.out}.md", "w", encoding="utf-8") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
