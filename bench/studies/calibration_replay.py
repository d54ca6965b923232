"""Does the calibrated sim rank the protocols like the real model? With and without correlated agents.

    python bench/studies/calibration_replay.py [--replay qwen05-arith-v2] [--seeds 8 16 32]

Runs ``python -m deliberation_env.analysis.calibrate --replay`` (fit on the set's train split, compare on
its test split) for each number of episode seeds per problem and each variant of the fit: everything
fitted; ``problem_spread`` held at 0; and ``problem_spread`` at 0 with no level offsets (the sim's
model before the correlated-agents knobs). Writes ``results/calibration_replay.md``: the Spearman
correlation of the protocols' accuracies, real vs sim, with its bootstrap interval over test problems.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

from bench.common.results import save_markdown
from deliberation_env.analysis.compare import replay_comparison
from deliberation_env.cli import ArgumentParser
from deliberation_env.make import parallel_env

VARIANTS = {
    "fitted (spread and level offsets)": {},
    "problem_spread = 0": {"problem_spread": 0.0},
    "problem_spread = 0, no level offsets (before)": {"problem_spread": 0.0, "level_offsets": []},
}


def main() -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replay", default="qwen05-arith-v2", help="replay set name or folder")
    parser.add_argument("--seeds", type=int, nargs="+", default=[8, 16, 32], help="episode seeds per problem")
    args = parser.parse_args()
    rows, result = [], {}
    with tempfile.TemporaryDirectory() as scratch:
        for name, fixed in VARIANTS.items():
            for seeds in args.seeds:
                out = os.path.join(scratch, f"{len(rows)}")
                replay_comparison(args.replay, out, seeds=seeds, fixed=fixed, make_env=parallel_env)
                with open(os.path.join(out, "report.json"), encoding="utf-8") as file:
                    result = json.load(file)
                low, high = result["spearman_bootstrap_95"]
                accuracies = ", ".join(f"{p['accuracy_sim']:.2f}" for p in result["protocols"].values())
                spread = result["config"]["problem_spread"]
                rows.append(f"| {name} | {result['train_problems']} / {result['test_problems']} | {seeds} | "
                            f"{result['spearman']:.2f} ({low:.2f} to {high:.2f}) | {spread} | {accuracies} |")
                print(rows[-1], flush=True)
    real = ", ".join(f"{p['accuracy_real']:.2f}" for p in result["protocols"].values())
    header = (f"Calibrated sim vs replay set {args.replay}: Spearman of the protocols' accuracies "
              f"({', '.join(result['protocols'])}; real: {real}), fitted on {result['train_problems']} train "
              f"problems, compared on {result['test_problems']} test problems")
    table = "\n".join(["| fit | train / test problems | seeds per problem | Spearman (95% bootstrap over problems) | "
                       "problem_spread | sim accuracies |", "|---|---|---|---|---|---|", *rows])
    save_markdown("calibration_replay", header, table)


if __name__ == "__main__":
    main()
