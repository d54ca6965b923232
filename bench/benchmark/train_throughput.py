"""Environment rounds per second inside the training loop vs the bare environment, same run.

    python bench/benchmark/train_throughput.py --episodes 3000

A round is one ``env.step`` (every agent acts once). Measured in one process, one after the other:

1. bare env: uniformly random legal actions, one env, a plain Python loop;
2. rollout collection only: ``baselines.meta.rollout.collect`` on ``num_envs`` envs in lockstep
   (encoding, batched forward pass, sampling, bookkeeping), with random legal actions and
   with the (untrained) policy network;
3. the full SoftRankPO training loop (``sft_episodes=0``): collection + advantages + updates.

Overhead ratio = bare rounds/s / in-loop rounds/s. Rounds/s depends on the action mix (a REFINE
costs the sim a generation and a critic call), so the REFINE share of each row is printed; the
like-for-like comparison of the machinery is row 1 vs row 2. Saves bench/results/train_throughput.md (the training
loop's own files go to a temporary folder, removed at the end).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

import deliberation_env
from baselines.logger import read_metrics
from baselines.meta.policy import Policy, agent_layout
from baselines.meta.rollout import EpisodeSpec, collect, sampling_key
from baselines.meta.softrankpo import SoftRankPOConfig, train
from baselines.runtime import seed_everything
from bench.common.results import command_line, save_markdown
from deliberation_env.cli import ArgumentParser
from deliberation_env.env import DeliberationEnv


class Counter:
    rounds = 0


class CountingEnv(DeliberationEnv):
    """An env that counts its rounds: ``end_step`` closes a round both in ``env.step`` and in the
    episode runner (``deliberation_env.vector``), which never calls ``env.step``."""

    def end_step(self):
        Counter.rounds += 1
        return super().end_step()


def counting_env(**kwargs):
    return CountingEnv(split="train", **kwargs)


def bare(episodes: int) -> tuple[float, float]:
    """(rounds/s, REFINE share) of a plain loop with uniformly random legal actions."""
    env = deliberation_env.parallel_env(split="train")
    rng = np.random.default_rng(0)
    rounds, refines, start = 0, 0, time.perf_counter()
    for episode in range(episodes):
        obs, _ = env.reset(seed=episode)
        while env.agents:
            actions = {a: int(rng.choice(np.flatnonzero(o["action_mask"]))) for a, o in obs.items()}
            refines += sum(v == 1 for v in actions.values())
            obs, *_ = env.step(actions)
            rounds += 1
    return rounds / (time.perf_counter() - start), refines / (3 * rounds)


def collection_only(episodes: int, num_envs: int, use_policy: bool) -> tuple[float, float]:
    """(rounds/s, REFINE share): collect() with random legal actions (as the bare loop) or the policy."""
    seed_everything(0, 1)
    envs = [counting_env() for _ in range(num_envs)]
    layout = agent_layout(envs[0])
    specs = [EpisodeSpec(s, s // 8) for s in range(episodes)]
    Counter.rounds, start = 0, time.perf_counter()
    ro = collect(envs, layout, Policy(layout) if use_policy else None, specs, sampling_key(0, "bench"))
    return Counter.rounds / (time.perf_counter() - start), float(np.mean(ro.actions == 1))


def training_loop(episodes: int, num_envs: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="train_throughput-") as out:  # the run's files are not kept
        cfg = SoftRankPOConfig(episodes=episodes, sft_episodes=0, num_envs=num_envs, out=out, progress=False,
                               tensorboard=False)
        Counter.rounds, start = 0, time.perf_counter()
        train(cfg, env_fn=counting_env)
        rate = Counter.rounds / (time.perf_counter() - start)
        rows = read_metrics(out)
    return rate, float(np.mean([r["action_1"] for r in rows]))


def main() -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=3000)
    parser.add_argument("--num-envs", type=int, default=32)
    args = parser.parse_args()
    print("command:", command_line())
    rates = {"bare env, random legal actions": bare(args.episodes),
             "collect(), random legal actions (same action mix as bare)": collection_only(args.episodes, args.num_envs, False),
             "collect(), untrained policy network": collection_only(args.episodes, args.num_envs, True),
             "SoftRankPO training loop (collect + advantages + update)": training_loop(args.episodes, args.num_envs)}
    base = rates["bare env, random legal actions"][0]
    lines = ["| measurement | rounds / s | overhead ratio (bare / this) | REFINE share |", "|---|---|---|---|"]
    lines += [f"| {name} | {rate:.0f} | {base / rate:.2f} | {refine:.2f} |" for name, (rate, refine) in rates.items()]
    table = "\n".join(lines)
    header = f"{args.episodes} episodes each, num_envs={args.num_envs}, torch threads 1, seed 0"
    save_markdown("train_throughput", header, table)


if __name__ == "__main__":
    main()
