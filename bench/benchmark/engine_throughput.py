"""The compiled-tree engine against the PettingZoo replay env, side by side in one run (docs/engine.md).

    python bench/benchmark/engine_throughput.py [--dataset qwen05-arith-v2] [--seconds 5] [--trainers softrankpo grpo]
                                                [--baseline REV]

1. Stepping: agent-steps/s of ``TreeEnv`` playing random legal actions (``sample_actions``), a step then
   ``reset_done()`` (``step(actions, observe=False)``: the observations are built once, by ``reset_done``; masks,
   rewards, reward components and infos every step; resets included); of the PettingZoo replay env of the same game
   (``replay_env``, random legal actions from the masks) after a warm-up as long as the measurement (its first
   episodes excluded: the env's memos fill then); and of PettingZoo's ``rps_v2`` (the same loop). One core each, one
   after the other; a TreeEnv row is the best of ``--windows`` windows, each in a process of its own (the least
   disturbed by other load on a shared machine); the ratios between them.
2. Evaluation: a policy's test accuracy the leaderboard's way (every test problem played once, greedy, through the
   env) against ``expected_scores`` on the tree (greedy, and the exact expectation of the stochastic policy).
3. Training: ``python -m baselines.meta.train --algo A --replay SET --episodes 4000 --no-evaluate`` with
   ``--engine env`` and ``--engine tree``, each in a process of its own after a warm-up run of 64 episodes on the
   same engine there (imports, the replay set, the tree compiled or loaded): the seconds of the measured run.

``--baseline REV`` measures the TreeEnv rows and the training runs of git revision REV as well (extracted into a
temporary folder with ``git archive``), each beside this checkout's: the before and after of a change in one run.

Needs the ``train`` extra; the ``rps_v2`` row needs PettingZoo's classic envs, which import pygame (the ``bench``
extra). Writes ``bench/results/engine_throughput.md`` and compiles the trees it plays into the tree cache
(docs/engine.md); the training runs write into a temporary folder, removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

from baselines.evaluation.evaluate import play_episodes
from baselines.meta.evaluate import PolicyActor
from baselines.meta.policy import Policy, agent_layout
from baselines.meta.tree_rollout import policy_probabilities
from bench.common.results import BENCH, save_markdown
from deliberation_env.cli import ArgumentParser, add_env_arguments
from deliberation_env.engine import compile_tree, expected_scores
from deliberation_env.make import replay_env

ROOT = os.path.dirname(BENCH)
STEPPING = """
import inspect, json, sys, time
import numpy as np
from deliberation_env.engine import TreeEnv, compile_tree
dataset, features, batch, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
env = TreeEnv(compile_tree(dataset, "test", features=features), batch)
once = "observe" in inspect.signature(env.step).parameters  # an engine of before step(observe=) builds them twice
rng = np.random.default_rng(0)
env.reset(seed=0)

def play(seconds):
    steps = episodes = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        live = int((~env.ended).sum())
        env.step(env.sample_actions(rng), **({"observe": False} if once else {}))
        steps += live * env.tree.num_agents
        episodes += int(env.ended.sum())
        env.reset_done()
    elapsed = time.perf_counter() - start
    return steps / elapsed, episodes / elapsed

play(min(1.0, seconds))  # warm-up: the packed arrays built, the caches filled
agent_steps, episodes = play(seconds)
print(json.dumps({"agent_steps": agent_steps, "episodes": episodes}))
"""
"""Random legal play on a TreeEnv of the checkout on PYTHONPATH: argv dataset, features, batch, seconds."""
TRAINING = """
import json, sys, time
from baselines.meta.train import main
algo, dataset, features, engine, episodes, out = sys.argv[1:7]
flags = ["--algo", algo, "--replay", dataset, "--env-option", f"features={features}", "--engine", engine,
         "--no-evaluate"]
quick = ["--sft-episodes", "32", "--sft-epochs", "1"] if algo == "softrankpo" else []
main([*flags, *quick, "--episodes", "64", "--out", out + "-warmup"])
start = time.perf_counter()
main([*flags, "--episodes", episodes, "--out", out])
print(json.dumps({"seconds": time.perf_counter() - start}))
"""
"""A warm-up run, then the timed training run, on the checkout on PYTHONPATH: argv algo, dataset, features, engine,
episodes, out."""


def in_process(code: str, root: str, *args: object) -> dict:
    """Run ``code`` in a fresh Python on ``root``'s packages; its last line of output, as JSON."""
    result = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": root}, cwd=root)
    if result.returncode != 0:
        raise SystemExit(f"engine_throughput.py: a measurement on {root} failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def stepping(args, tree, roots: dict[str, str]) -> list[str]:
    from pettingzoo.classic import rps_v2

    from bench.benchmark.env_throughput import rounds_per_second  # imports rps_v2, hence pygame: checked in main

    rows = []
    for batch in args.batches:
        best: dict[str, dict] = {}
        for _ in range(args.windows):  # the revisions alternate, so that other load falls on both alike
            for label, root in roots.items():
                measured = in_process(STEPPING, root, args.dataset, args.features, batch, args.seconds / args.windows)
                if label not in best or measured["agent_steps"] > best[label]["agent_steps"]:
                    best[label] = measured
        rows += [(f"TreeEnv{label}, {batch:,} episodes per call", best[label]["agent_steps"], best[label]["episodes"])
                 for label in roots]
    env = replay_env(args.dataset, "test", features=args.features)
    rounds_per_second(env, args.seconds, seed=10**6)  # warm-up: the first episodes are left out
    rounds, _ = rounds_per_second(env, args.seconds)
    rows.append(("PettingZoo replay env (`replay_env`), after a warm-up", rounds * tree.num_agents,
                 rounds / tree.max_rounds))
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


def training(args, roots: dict[str, str], out: str) -> list[str]:
    lines = ["| trainer | code | --engine env (s) | --engine tree (s) | x faster |", "|---|---|---|---|---|"]
    for algo in args.trainers:
        seconds: dict[tuple[str, str], float] = {}
        for engine in ("env", "tree"):
            for label, root in roots.items():  # the revisions alternate, so that other load falls on both alike
                run = os.path.join(out, f"{algo}-{engine}{label.replace(' ', '-')}")
                measured = in_process(TRAINING, root, algo, args.dataset, args.features, engine, args.episodes, run)
                seconds[label, engine] = measured["seconds"]
        for label in roots:
            env, tree = seconds[label, "env"], seconds[label, "tree"]
            lines.append(f"| {algo} | {label.strip(' ()') or 'this checkout'} | {env:.1f} | {tree:.1f} | "
                         f"{env / tree:.1f} |")
    return lines


def checkout(revision: str, folder: str) -> str:
    """``git archive`` of ``revision`` of this repository, unpacked into ``folder``."""
    archive = subprocess.run(["git", "-C", ROOT, "archive", revision], capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"engine_throughput.py: error: --baseline {revision}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", folder], input=archive.stdout, check=True)
    return folder


def main() -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="qwen05-arith-v2")
    add_env_arguments(parser, ("features",), defaults={"features": "v2"})
    parser.add_argument("--seconds", type=float, default=5.0, help="time per stepping measurement")
    parser.add_argument("--windows", type=int, default=3,
                        help="a TreeEnv row is the best of this many windows of --seconds / windows, each in a process "
                             "of its own (with --baseline the revisions alternate)")
    parser.add_argument("--batches", type=int, nargs="+", default=[4096, 65536])
    parser.add_argument("--trainers", nargs="*", default=["softrankpo", "grpo"])
    parser.add_argument("--episodes", type=int, default=4000, help="episodes of each training run")
    parser.add_argument("--baseline", metavar="REV", help="also measure git revision REV's engine and trainers")
    args = parser.parse_args()
    if args.windows < 1:
        parser.error(f"--windows must be >= 1, got {args.windows}")
    try:
        from pettingzoo.classic import rps_v2  # noqa: F401 - imports pygame
    except ImportError as error:
        parser.error(f"the rps_v2 row needs PettingZoo's classic envs, which import pygame ({error}): "
                     "pip install -e '.[bench]'")
    torch.set_num_threads(1)  # one core per measurement (the trainers' default, --threads 1)
    with tempfile.TemporaryDirectory(prefix="engine_throughput-") as scratch:
        roots = {"": ROOT}
        if args.baseline:
            roots[f" ({args.baseline})"] = checkout(args.baseline, tempfile.mkdtemp(dir=scratch))
        start = time.perf_counter()
        tree = compile_tree(args.dataset, "test", features=args.features)
        compiled = time.perf_counter() - start
        sections = [f"Set `{args.dataset}`, test split, the {args.features} observation: {len(tree.problem_ids)} "
                    f"problems, {tree.num_nodes:,} nodes, {tree.num_joint} joint actions; its tree loaded or compiled "
                    f"in {compiled:.1f} s. CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores "
                    f"(load average {os.getloadavg()[0]:.1f} at the start); each measurement on one core, one after "
                    "the other.", "", "Stepping (random legal actions):", "", *stepping(args, tree, roots), "",
                    "Evaluation of a policy on the whole test split:", "", *evaluation(args, tree)]
        if args.trainers:
            sections += ["", f"Training, {args.episodes} episodes (SoftRankPO's SFT stage included), after a warm-up "
                         "run in the same process:", "", *training(args, roots, scratch)]
        sections += ["", f"Load average at the end: {os.getloadavg()[0]:.1f}."]
    save_markdown("engine_throughput", "The compiled-tree engine against the PettingZoo env, one run",
                  "\n".join(sections))


if __name__ == "__main__":
    main()
