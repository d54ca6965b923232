"""The compiled-tree engine against the PettingZoo replay env, side by side in one run (docs/engine.md).

    python bench/benchmark/engine_throughput.py [--dataset qwen05-arith-v2] [--seconds 5] [--trainers softrankpo grpo]

1. Stepping: agent-steps/s of ``TreeEnv`` (random legal actions from ``sample_actions``; observations, masks,
   rewards, reward components and infos built every step; resets included), of the PettingZoo replay env of the same
   game (``replay_env``, random legal actions from the masks) and of PettingZoo's ``rps_v2`` (the same loop), one
   core each, one after the other; the ratios between them.
2. Evaluation: a policy's test accuracy the leaderboard's way (every test problem played once, greedy, through the
   env) against ``expected_scores`` on the tree (greedy, and the exact expectation of the stochastic policy).
3. Training: ``python -m baselines.meta.train --algo A --replay SET --episodes 4000 --no-evaluate`` with
   ``--engine env`` and ``--engine tree`` (the tree compiled before the timing; its compile time shown apart).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from pettingzoo.classic import rps_v2

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

from baselines.evaluation.evaluate import play_episodes
from baselines.meta.evaluate import PolicyActor
from baselines.meta.policy import Policy, agent_layout
from baselines.meta.train import main as train
from baselines.meta.tree_rollout import policy_probabilities
from bench.benchmark.env_throughput import rounds_per_second
from bench.common.results import save_markdown
from deliberation_env.cli import ArgumentParser, add_env_arguments
from deliberation_env.engine import TreeEnv, compile_tree, expected_scores
from deliberation_env.make import replay_env


def tree_steps_per_second(tree, batch: int, seconds: float) -> tuple[float, float]:
    """(agent-steps/s, episodes/s) of random legal play on ``batch`` episodes at a time."""
    env = TreeEnv(tree, batch)
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    steps = episodes = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        live = int((~env.ended).sum())
        env.step(env.sample_actions(rng))
        steps += live * tree.num_agents
        episodes += int(env.ended.sum())
        env.reset_done()
    elapsed = time.perf_counter() - start
    return steps / elapsed, episodes / elapsed


def stepping(args, tree) -> list[str]:
    rows = []
    for batch in args.batches:
        agent_steps, episodes = tree_steps_per_second(tree, batch, args.seconds)
        rows.append((f"TreeEnv, {batch:,} episodes per call", agent_steps, episodes))
    env = replay_env(args.dataset, "test", features=args.features)
    rounds, _ = rounds_per_second(env, args.seconds)
    rows.append(("PettingZoo replay env (`replay_env`)", rounds * tree.num_agents, rounds / tree.max_rounds))
    rps_rounds, _ = rounds_per_second(rps_v2.parallel_env(), args.seconds)
    rows.append(("PettingZoo `rps_v2` (2 agents, 1 cycle per step)", rps_rounds * 2, None))
    reference, floor = rows[-2][1], rows[-1][1]
    lines = ["| env | agent-steps/s | episodes/s | x replay env | x rps_v2 |", "|---|---|---|---|---|"]
    for name, agent_steps, episodes in rows:
        lines.append(f"| {name} | {agent_steps:,.0f} | {'-' if episodes is None else f'{episodes:,.0f}'} | "
                     f"{agent_steps / reference:,.1f} | {agent_steps / floor:,.1f} |")
    return lines


def evaluation(args, tree) -> list[str]:
    env = replay_env(args.dataset, "test", features=args.features)
    layout = agent_layout(env)
    torch.manual_seed(0)
    policy = Policy(layout).eval()
    start = time.perf_counter()
    records = play_episodes([env], [PolicyActor(policy)], [(0, p) for p in range(len(env.problems))],
                            index_option="problem_index")
    played_seconds = time.perf_counter() - start
    played = float(np.mean([r["correct"] for r in records]))
    start = time.perf_counter()
    greedy = expected_scores(tree, policy_probabilities(policy, layout, greedy=True))
    greedy_seconds = time.perf_counter() - start
    start = time.perf_counter()
    stochastic = expected_scores(tree, policy_probabilities(policy, layout, greedy=False))
    stochastic_seconds = time.perf_counter() - start
    return ["| how | accuracy | seconds | x faster |", "|---|---|---|---|",
            f"| played through the env, greedy, every test problem once | {played:.4f} | {played_seconds:.2f} | 1 |",
            f"| exact on the tree, greedy | {greedy['accuracy'].mean():.4f} | {greedy_seconds:.3f} | "
            f"{played_seconds / greedy_seconds:,.0f} |",
            f"| exact on the tree, the stochastic policy's expectation | {stochastic['accuracy'].mean():.4f} | "
            f"{stochastic_seconds:.3f} | {played_seconds / stochastic_seconds:,.0f} |"]


def training(args) -> list[str]:
    start = time.perf_counter()
    compile_tree(args.dataset, "train", features=args.features)
    compiled = time.perf_counter() - start
    lines = ["| trainer | --engine env (s) | --engine tree (s) | x faster |", "|---|---|---|---|"]
    for algo in args.trainers:
        seconds = {}
        for engine in ("env", "tree"):
            start = time.perf_counter()
            train(["--algo", algo, "--replay", args.dataset, "--env-option", f"features={args.features}", "--engine",
                   engine, "--episodes", "4000", "--no-evaluate", "--out", os.path.join(args.out, f"{algo}-{engine}")])
            seconds[engine] = time.perf_counter() - start
        lines.append(f"| {algo} | {seconds['env']:.1f} | {seconds['tree']:.1f} | {seconds['env'] / seconds['tree']:.1f} |")
    lines.append(f"\nThe train split's tree (compiled once, then cached): {compiled:.1f} s, included in no row above.")
    return lines


def main() -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="qwen05-arith-v2")
    add_env_arguments(parser, ("features",), defaults={"features": "v2"})
    parser.add_argument("--seconds", type=float, default=5.0, help="time per stepping measurement")
    parser.add_argument("--batches", type=int, nargs="+", default=[4096, 65536])
    parser.add_argument("--trainers", nargs="*", default=["softrankpo", "grpo"])
    parser.add_argument("--out", default=os.path.join("runs", "engine_throughput"))
    args = parser.parse_args()
    torch.set_num_threads(1)  # one core per measurement (the trainers' default, --threads 1)
    start = time.perf_counter()
    tree = compile_tree(args.dataset, "test", features=args.features)
    compiled = time.perf_counter() - start
    sections = [f"Set `{args.dataset}`, test split, the {args.features} observation: {len(tree.problem_ids)} problems, "
                f"{tree.num_nodes:,} nodes, {tree.num_joint} joint actions; its tree loaded or compiled in "
                f"{compiled:.1f} s. CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; each "
                "measurement on one core, one after the other.", "", "Stepping (random legal actions):", "",
                *stepping(args, tree), "", "Evaluation of a policy on the whole test split:", "", *evaluation(args, tree)]
    if args.trainers:
        sections += ["", "Training, 4000 episodes (SoftRankPO's SFT stage included):", "", *training(args)]
    save_markdown("engine_throughput", "The compiled-tree engine against the PettingZoo env, one run",
                  "\n".join(sections))


if __name__ == "__main__":
    main()
