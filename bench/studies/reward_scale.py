"""Reward-scale sensitivity: SoftRankPO, GRPO and PPO trained with rewards x 0.1, 1 and 10.

    python bench/studies/reward_scale.py --seeds 0 1 2 --episodes 3000 --problems 200

Every run starts from scratch (no SFT stage, so the RL update alone decides the outcome), with
the same seed and budget per algorithm; only ``--reward-scale`` differs. GRPO is run with its
default std normalisation and without it (``grpo-nostd``). Reported: test accuracy of the
greedy policy per scale (mean over seeds) and the spread max - min across the three scales.
Saves bench/results/reward_scale.{md,png}.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

from bench.common.results import RESULTS, command_line, save_markdown
from deliberation_env.cli import ArgumentParser

SCALES = (0.1, 1.0, 10.0)
VARIANTS = {
    "softrankpo": ("softrankpo", {"sft_episodes": 0}),
    "grpo": ("grpo", {}),
    "grpo-nostd": ("grpo", {"std_normalize": False}),
    "ppo": ("ppo", {}),
}


def run_one(job: tuple[str, float, int, int, int, str]) -> tuple[str, float, int, float, float]:
    import deliberation_env
    from baselines.evaluation.evaluate import play
    from baselines.meta import train
    from baselines.meta.evaluate import PolicyActor

    variant, scale, seed, episodes, problems, runs = job
    algo, overrides = VARIANTS[variant]
    cfg = train.config_class(algo)(seed=seed, episodes=episodes, reward_scale=scale, progress=False, tensorboard=False,
                                   out=os.path.join(runs, f"{variant}-x{scale}-seed{seed}"), **overrides)
    policy = train.run(algo, cfg)
    result = play(deliberation_env.parallel_env(split="test"), PolicyActor(policy), problems, seed)
    return variant, scale, seed, result["accuracy"], result["tokens"]


def main() -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--episodes", type=int, default=3000)
    parser.add_argument("--problems", type=int, default=200)
    parser.add_argument("--runs", default="runs/bench_reward_scale")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    print("command:", command_line())
    start = time.time()
    jobs = [(v, s, seed, args.episodes, args.problems, args.runs) for v in VARIANTS for s in SCALES for seed in args.seeds]
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(run_one, jobs))
    acc = {(v, s): np.mean([r[3] for r in results if r[0] == v and r[1] == s]) for v in VARIANTS for s in SCALES}
    lines = ["| algorithm | x0.1 | x1 | x10 | spread (max - min) |", "|---|---|---|---|---|"]
    for v in VARIANTS:
        values = [acc[v, s] for s in SCALES]
        lines.append(f"| {v} | " + " | ".join(f"{x:.3f}" for x in values) + f" | {max(values) - min(values):.3f} |")
    table = "\n".join(lines)
    header = (f"Test accuracy (greedy, {args.problems} test problems, seeds {args.seeds}, {args.episodes} training "
              f"episodes from scratch)")
    save_markdown("reward_scale", header, table)
    print(f"(total {time.time() - start:.0f}s)")
    from baselines.evaluation.evaluate import headless_pyplot

    plt = headless_pyplot()

    fig, ax = plt.subplots(figsize=(6, 4))
    for v in VARIANTS:
        ax.plot(SCALES, [acc[v, s] for s in SCALES], marker="o", label=v)
    ax.set_xscale("log")
    ax.set_xlabel("reward scale")
    ax.set_ylabel("test accuracy")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "reward_scale.png"), dpi=110)


if __name__ == "__main__":
    main()
