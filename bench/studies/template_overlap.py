"""Does a test problem whose template a train problem shares inflate the leaderboard's gains?

    python bench/studies/template_overlap.py --cell qwen05-arith-v2:v2

An arithmetic problem's template is its level, start and steps (operations and amounts): two problems with one
template differ only in the name and the item, and have one answer. Some test problems share a template with a
recorded train problem (the policy was trained on that problem's recorded deliberation, not on the test one's:
fresh samples of the model). Splits the test problems by that, and gives each trainer's gain over the best
protocol on either side (the suite's committed per-problem outcomes; hierarchical bootstrap over seeds and,
paired, problems) and the difference between the sides. Writes bench/results/template_overlap.md.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

from baselines.benchmark import loaded, parse_cell
from bench.common.results import RESULTS, command_line, write_report
from bench.common.suite import choices, read
from deliberation_env.analysis.metrics import hierarchical_bootstrap
from deliberation_env.cli import ArgumentParser
from deliberation_env.options import make_task

SUITE = os.path.join(RESULTS, "benchmark_suite")


def template(problem) -> tuple:
    meta = problem.metadata
    return meta["level"], meta["start"], tuple(tuple(step) for step in meta["steps"])


def group_difference(runs: np.ndarray, protocol: np.ndarray, shared: np.ndarray, resamples: int = 4000
                     ) -> tuple[float, float, float]:
    """(gain on shared-template problems) - (gain on the others), seeds and each group's problems resampled."""
    rng = np.random.default_rng(0)
    gains = runs - protocol
    a, b = gains[:, shared], gains[:, ~shared]
    draws = np.empty(resamples)
    for k in range(resamples):
        seeds = rng.integers(0, len(gains), len(gains))
        draws[k] = (a[seeds][:, rng.integers(0, a.shape[1], a.shape[1])].mean()
                    - b[seeds][:, rng.integers(0, b.shape[1], b.shape[1])].mean())
    return float(a.mean() - b.mean()), float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))


def main(argv=None) -> None:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cell", default="qwen05-arith-v2:v2")
    args = parser.parse_args(argv)
    cell = parse_cell(args.cell)
    card = loaded(cell.dataset).card
    task = make_task(card.task, None, card.task_kwargs)
    by_id = {p.id: p for split in ("train", "test") for p in task.problems(split)}
    train_templates = {template(by_id[i]) for i in card.splits["train"]}
    found = read(os.path.join(SUITE, cell.name.replace(":", "-")))
    best, ordered = choices(found)
    reference = found["protocols"]["test"][best]
    shared = np.array([template(by_id[i]) in train_templates for i in reference.problem_ids])
    lines = [f"# Template overlap: {cell.name}", "", f"`{command_line()}`", "",
             f"{int(shared.sum())} of {len(shared)} test problems ({shared.mean():.0%}) share a template (level, start, "
             f"steps) with one of the {len(card.splits['train'])} recorded train problems. Gain over {best} (the best "
             "protocol on validation) in points, 95% intervals (hierarchical bootstrap over the 10 seeds and, paired, "
             "the problems); the last column resamples each side's problems on their own.", "",
             f"| trainer | {best} shared / other | gain, shared | gain, other | shared - other |",
             "|---|---|---|---|---|"]
    protocol = reference.accuracy
    for algo, trainer in ordered:
        runs = np.stack([r.accuracy for r in trainer["runs"]])
        cells = [hierarchical_bootstrap([runs[:, mask], protocol[mask]], [1.0, -1.0]) for mask in (shared, ~shared)]
        diff = group_difference(runs, protocol, shared)
        lines.append(f"| {algo} | {protocol[shared].mean():.3f} / {protocol[~shared].mean():.3f} | "
                     + " | ".join(f"{100 * e:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]" for e, lo, hi in (*cells, diff))
                     + " |")
    text = "\n".join(lines) + "\n"
    write_report("template_overlap", text)


if __name__ == "__main__":
    main()
