"""Meta-action distribution before (SFT) and after RL (SoftRankPO), per deliberation round.

    python bench/studies/action_shift.py --seed 0 --problems 200

Trains SFT -> SoftRankPO with the defaults of ``python -m baselines.meta.train`` (or reuses
``--run DIR`` holding sft/policy.pt and policy.pt), plays both greedily on test problems
0..P-1 (evaluation seeds 0 and 1) and reports PERSIST / REFINE / CONCEDE shares overall and
per round, next to the oracle's. Saves bench/results/action_shift.{md,png}.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

import deliberation_env
from baselines.evaluation.evaluate import episode_seed, headless_pyplot, play_episodes
from baselines.meta.evaluate import PolicyActor
from baselines.meta.policy import load_policy
from baselines.meta.softrankpo import SoftRankPOConfig, train
from bench.common.results import RESULTS, command_line, save_markdown
from deliberation_env import Action
from deliberation_env.cli import ArgumentParser
from deliberation_env.protocols import make_protocol

NAMES = tuple(action.name for action in Action)


def action_shares(actor, problems: int, seeds: list[int]) -> tuple[np.ndarray, float]:
    """(rounds x 3 shares, accuracy) over the test problems."""
    env = deliberation_env.parallel_env(split="test")
    episodes = [(episode_seed(seed, index), index) for seed in seeds for index in range(problems)]
    records = play_episodes([env], [actor], episodes)
    counts: dict[int, Counter] = {}
    for record in records:
        for t, chosen in enumerate(record["rounds"]):
            counts.setdefault(t, Counter()).update(chosen)
    shares = np.array([[counts[t][a] / sum(counts[t].values()) for a in range(3)] for t in sorted(counts)])
    return shares, sum(bool(r["correct"]) for r in records) / len(records)


def main() -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--problems", type=int, default=200)
    parser.add_argument("--run", default=None, help="existing SoftRankPO run directory (skips training)")
    args = parser.parse_args()
    print("command:", command_line())
    run = args.run or f"runs/bench_action_shift/seed{args.seed}"
    if args.run is None:
        train(SoftRankPOConfig(seed=args.seed, out=run, progress=False, tensorboard=False))
    actors = {"SFT": PolicyActor(load_policy(os.path.join(run, "sft", "policy.pt"))),
              "SoftRankPO": PolicyActor(load_policy(os.path.join(run, "policy.pt"))), "oracle": make_protocol("oracle")}
    lines = ["| policy | accuracy | round | PERSIST | REFINE | CONCEDE |", "|---|---|---|---|---|---|"]
    overall = {}
    for name, actor in actors.items():
        shares, accuracy = action_shares(actor, args.problems, [0, 1])
        overall[name] = shares.mean(0)
        lines.append(f"| {name} | {accuracy:.3f} | all | " + " | ".join(f"{x:.2f}" for x in shares.mean(0)) + " |")
        for t, row in enumerate(shares):
            lines.append(f"| {name} |  | {t + 1} | " + " | ".join(f"{x:.2f}" for x in row) + " |")
    table = "\n".join(lines)
    header = f"Greedy meta-actions on {args.problems} test problems x eval seeds 0 1 (training seed {args.seed})"
    save_markdown("action_shift", header, table)
    plt = headless_pyplot()

    fig, ax = plt.subplots(figsize=(6, 3.8))
    width = 0.8 / len(overall)
    for k, (name, shares) in enumerate(overall.items()):
        ax.bar(np.arange(3) + k * width, shares, width, label=name)
    ax.set_xticks(np.arange(3) + width * (len(overall) - 1) / 2, NAMES)
    ax.set_ylabel("share of meta-actions")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "action_shift.png"), dpi=110)


if __name__ == "__main__":
    main()
