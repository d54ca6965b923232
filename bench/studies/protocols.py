"""Accuracy and tokens of the fixed protocols (docs/method.md, section 6) on the sim backend.

    python bench/studies/protocols.py --problems 300 --seeds 0 1 2

Every protocol plays the same problems (test split indices 0..P-1) with the same episode
seeds; prints a Markdown table of final-consensus accuracy, tokens per problem and the
action distribution (mean and std across seeds).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

import deliberation_env
from baselines.evaluation import evaluate
from deliberation_env.cli import ArgumentParser
from deliberation_env.protocols import PROTOCOLS, make_protocol, protocol_agents


def play(protocol_name: str, problems: int, seed: int, **env_kwargs) -> dict[str, float]:
    num_agents = protocol_agents(protocol_name, env_kwargs.pop("num_agents", None))  # None: the env's default
    env = deliberation_env.parallel_env(num_agents=num_agents, split="test", **env_kwargs)
    metrics = evaluate.play(env, make_protocol(protocol_name), problems, seed)
    return {key: metrics[key] for key in ("accuracy", "tokens", "p_persist", "p_refine", "p_concede")}


def main() -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=300)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--task", default="arithmetic")
    args = parser.parse_args()
    print("| protocol | accuracy | tokens / problem | PERSIST | REFINE | CONCEDE |")
    print("|---|---|---|---|---|---|")
    for name in PROTOCOLS:
        runs = [play(name, args.problems, seed, task=args.task) for seed in args.seeds]
        mean = {k: np.mean([r[k] for r in runs]) for k in runs[0]}
        std = {k: np.std([r[k] for r in runs]) for k in runs[0]}
        print(f"| {name} | {mean['accuracy']:.3f} ± {std['accuracy']:.3f} | {mean['tokens']:.0f} | "
              f"{mean['p_persist']:.2f} | {mean['p_refine']:.2f} | {mean['p_concede']:.2f} |")


if __name__ == "__main__":
    main()
