"""Transfer between replay sets: train a meta-policy with one team, play it with another (MPDF's open question: can
a policy learnt on a homogeneous team coordinate a heterogeneous one, and the reverse?).

    python bench/studies/set_transfer.py --sets qwen05-arith-v2 qwen05-team-arith            # SoftRankPO, 3 seeds
    python bench/studies/set_transfer.py --sets A B --algos softrankpo grpo --seeds 0 1 2 --episodes 4000

The sets must give the same observation and action spaces under the game played (default: features v3 with chosen
concede targets, which a homogeneous and a heterogeneous team of 3 share; the role columns tell the teams apart); a
pair whose layouts differ is refused with the difference. Each trainer trains on every set's train split with every
seed (``bench/benchmark/replay_benchmark.py``'s settings), and each policy plays every set's test split. Per target set and
trainer the report gives the policy trained on the target (in-domain) and on each other set (transferred), each
run's accuracy, the drop (in-domain - transferred) with a hierarchical 95% interval (training seeds and, paired,
problems), and the difference to the target's best fixed protocol (chosen on its train split). Writes <out>.md and
<out>.csv.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

from baselines.benchmark import PROTOCOL_ROWS
from baselines.meta.evaluate import PolicyActor
from baselines.meta.trainers import leaderboard_rows
from bench.common.replay_rows import options, play_rows, protocol_rows, train_policy
from bench.common.results import RESULTS
from deliberation_env.analysis.metrics import hierarchical_bootstrap
from deliberation_env.cli import ArgumentParser, KeyValueAction, add_env_arguments
from deliberation_env.make import replay_env
from deliberation_env.protocols import protocol_agents
from deliberation_env.replay import ReplayError, ReplaySet


def layout(dataset: ReplaySet, env_options: dict) -> tuple:
    """(observation space, action space) of one agent of the set's test env under ``env_options``."""
    env = replay_env(dataset, split="test", **env_options)
    agent = env.possible_agents[0]
    return env.observation_space(agent), env.action_space(agent)


def check_layouts(sets: dict[str, ReplaySet], env_options: dict) -> None:
    """Raises SystemExit naming the first set whose spaces differ from the first set's."""
    names = list(sets)
    first = layout(sets[names[0]], env_options)
    for name in names[1:]:
        other = layout(sets[name], env_options)
        if other != first:
            raise SystemExit(f"set_transfer.py: '{name}' and '{names[0]}' differ in layout under {env_options} "
                             f"(observation {other[0]} vs {first[0]}; actions {other[1]} vs {first[1]}): a policy of "
                             "one cannot act in the other; play them with one feature set and game")


def protocol_to_beat(dataset: ReplaySet, env_options: dict) -> tuple[str, np.ndarray]:
    """The best fixed protocol on the set's train split (``single`` aside: it needs the tree), and its test runs."""
    train = protocol_rows(dataset, [0], "train", env_options)
    best = max((name for name in PROTOCOL_ROWS if protocol_agents(name) is None), key=lambda n: train[n]["correct"].mean())
    return best, protocol_rows(dataset, [0], "test", env_options, names=(best,))[best]["runs"]


def main(argv=None) -> None:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", nargs="+", required=True, help="replay sets (at least 2): names, folders or hf://")
    parser.add_argument("--algos", nargs="+", default=["softrankpo"], choices=list(leaderboard_rows()))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--episodes", type=int, default=4000)
    add_env_arguments(parser, ("features",), defaults={"features": "v3"})
    parser.add_argument("--env-option", dest="env_options", action=KeyValueAction, default={"concede_to_peer": True},
                        metavar="KEY=VALUE", help="env options of every replay env (default: concede_to_peer=True)")
    parser.add_argument("--out", default=os.path.join(RESULTS, "set_transfer"))
    args = parser.parse_args(argv)
    if len(args.sets) < 2:
        parser.error("--sets needs at least 2 replay sets")
    started = time.perf_counter()
    try:
        sets = {os.path.basename(str(name).rstrip("/")): ReplaySet(name) for name in args.sets}
    except ReplayError as error:
        parser.error(str(error))
    if len(sets) < len(args.sets):
        parser.error(f"--sets {' '.join(args.sets)}: two sets share a name; give each set once")
    check_layouts(sets, options(args))
    protocols = {name: protocol_to_beat(dataset, options(args)) for name, dataset in sets.items()}
    rows = []  # (algo, target, source, runs: seeds x problems)
    for algo in args.algos:
        policies = {(source, seed): train_policy(dataset, algo, seed, args,
                                                 os.path.join(args.out, "runs", f"{algo}-{source}-seed{seed}"))
                    for source, dataset in sets.items() for seed in args.seeds}
        for target, dataset in sets.items():
            for source in sets:
                runs = np.concatenate([play_rows(dataset, lambda s, p=policies[(source, seed)]: PolicyActor(p), [0],
                                                 options(args))["runs"] for seed in args.seeds])
                rows.append((algo, target, source, runs))
                print(f"{algo}: trained on {source}, played on {target}: {runs.mean():.3f} "
                      f"({time.perf_counter() - started:.0f} s)", flush=True)
    report(args, sets, protocols, rows, time.perf_counter() - started)


def report(args, sets: dict, protocols: dict, rows: list, seconds: float) -> None:
    game = " ".join(f"--env-option {k}={v}" for k, v in args.env_options.items())
    lines = ["# Transfer between replay sets", "",
             f"`python bench/studies/set_transfer.py --sets {' '.join(args.sets)} --algos {' '.join(args.algos)} --seeds "
             f"{' '.join(map(str, args.seeds))} --episodes {args.episodes} --features {args.features} {game}` "
             f"({seconds / 60:.1f} min). Each policy trains on its set's train split and plays the target's test "
             "split. Intervals: hierarchical 95% bootstraps over training seeds and, paired, the target's problems; "
             "drop = in-domain - transferred.", "",
             "| played on | trainer | trained on | accuracy | per seed | drop vs in-domain [95%] | "
             "vs best protocol [95%] |", "|---|---|---|---|---|---|---|"]
    csv = ["target,algo,source,accuracy,drop,drop_low,drop_high,vs_protocol,vs_protocol_low,vs_protocol_high"]
    for algo, target, source, runs in rows:
        home = next(r for a, t, s, r in rows if (a, t, s) == (algo, target, target))
        best, protocol = protocols[target]
        drop = hierarchical_bootstrap([home, runs], [1.0, -1.0]) if source != target else (np.nan,) * 3
        versus = hierarchical_bootstrap([runs, protocol], [1.0, -1.0])
        seeds = ", ".join(f"{v:.3f}" for v in runs.mean(1))
        shown = "(in-domain)" if source == target else f"{drop[0]:+.3f} [{drop[1]:+.3f}, {drop[2]:+.3f}]"
        lines.append(f"| {target} | {algo} | {source} | {runs.mean():.3f} | {seeds} | {shown} | "
                     f"{versus[0]:+.3f} [{versus[1]:+.3f}, {versus[2]:+.3f}] ({best}) |")
        csv.append(f"{target},{algo},{source},{runs.mean():.4f},{drop[0]:.4f},{drop[1]:.4f},{drop[2]:.4f},"
                   f"{versus[0]:.4f},{versus[1]:.4f},{versus[2]:.4f}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(f"{args.out}.md", "w") as handle:
        handle.write("\n".join(lines) + "\n")
    with open(f"{args.out}.csv", "w") as handle:
        handle.write("\n".join(csv) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
