"""SoftRankPO (SFT stage + RL, the defaults of ``python -m baselines.meta.train``) vs every fixed protocol.

    python bench/studies/learned_vs_protocols.py --seeds 0 1 2 --problems 200

For each seed s: train SFT -> SoftRankPO with ``--seed s`` and, as a control without oracle
labels, SoftRankPO from scratch (``sft_episodes=0``, same RL budget) (two runs in parallel);
then evaluate the SFT policy, both SoftRankPO policies and every fixed protocol on test
problems 0..P-1 with evaluation seed s. Means over all episodes, 95% per-problem bootstrap intervals. Saves
bench/results/learned_vs_protocols.{md,csv}, accuracy_vs_tokens PNG and learning curves.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

from baselines.evaluation.evaluate import (
    play_records,
    plot_accuracy_vs_tokens,
    plot_learning_curves,
    save_table,
    summarize,
)
from baselines.meta.evaluate import PolicyActor
from baselines.meta.softrankpo import SoftRankPOConfig, train
from bench.common.results import RESULTS, command_line
from deliberation_env.cli import ArgumentParser
from deliberation_env.protocols import PROTOCOLS, make_protocol, plays_team, protocol_agents


def train_seed(args: tuple[int, str, int, bool]) -> str:
    seed, runs, episodes, scratch = args
    out = os.path.join(runs, f"softrankpo{'-scratch' if scratch else ''}-seed{seed}")
    train(SoftRankPOConfig(seed=seed, out=out, episodes=episodes, progress=False, tensorboard=False,
                           sft_episodes=0 if scratch else SoftRankPOConfig.sft_episodes))
    return out


def main() -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--problems", type=int, default=200)
    parser.add_argument("--episodes", type=int, default=SoftRankPOConfig.episodes, help="RL episodes per seed")
    parser.add_argument("--runs", default="runs/bench_learned")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    print("command:", command_line())
    import deliberation_env
    from baselines.meta.policy import load_policy

    start = time.time()
    with ProcessPoolExecutor(args.workers) as pool:
        jobs = [(s, args.runs, args.episodes, scratch) for scratch in (False, True) for s in args.seeds]
        done = list(pool.map(train_seed, jobs))
    outs, scratch_outs = done[: len(args.seeds)], done[len(args.seeds) :]
    print(f"trained {len(done)} runs in {time.time() - start:.0f}s")
    env = deliberation_env.parallel_env(split="test")
    rows = []
    learned = {"sft": [os.path.join(o, "sft", "policy.pt") for o in outs],
               "softrankpo": [os.path.join(o, "policy.pt") for o in outs],
               "softrankpo (no SFT)": [os.path.join(o, "policy.pt") for o in scratch_outs]}
    for name, paths in learned.items():
        runs = [play_records(env, PolicyActor(load_policy(p)), args.problems, s) for s, p in zip(args.seeds, paths)]
        rows.append(summarize(name, runs))
    for proto in PROTOCOLS:
        proto_env = env if plays_team(proto, env.config.num_agents) else deliberation_env.parallel_env(
            split="test", num_agents=protocol_agents(proto))
        rows.append(summarize(proto, [play_records(proto_env, make_protocol(proto), args.problems, s) for s in args.seeds]))
    table = save_table(rows, RESULTS, "learned_vs_protocols")
    print(f"\nTest split, {args.problems} problems, seeds {args.seeds} (train seed = eval seed for learned rows):")
    print(table)
    plot_accuracy_vs_tokens(rows, os.path.join(RESULTS, "learned_vs_protocols.png"), "SoftRankPO vs fixed protocols (sim)")
    curves = {f"seed{s}": out for s, out in zip(args.seeds, outs)}
    curves.update({f"no SFT, seed{s}": out for s, out in zip(args.seeds, scratch_outs)})
    plot_learning_curves(curves, os.path.join(RESULTS, "learned_vs_protocols_curves.png"))
    best = max((r for r in rows if r["name"] in PROTOCOLS and r["name"] != "oracle"), key=lambda r: r["accuracy"])
    debate = next(r for r in rows if r["name"] == "debate")
    for row in rows[1:3]:
        print(f"{row['name']}: {row['accuracy']:.3f} vs best fixed protocol ({best['name']}) {best['accuracy']:.3f}; "
              f"tokens {row['tokens']:.0f} vs debate {debate['tokens']:.0f}")
    print(f"total {time.time() - start:.0f}s")


if __name__ == "__main__":
    main()
