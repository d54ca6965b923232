"""Deliberation rounds per second of the sim env, against PettingZoo's rps_v2 as the floor.

    python bench/benchmark/env_throughput.py --seconds 5

Both envs run the same loop in the same process: reset with a seed, then random legal
actions drawn from the action masks until the episode ends (3 agents, 3 rounds for ours).
A "round" is one ``step`` call; resets are included in the time. Prints rounds/s of each
and their ratio (ours / rps_v2).

    python bench/benchmark/env_throughput.py --replay qwen05-arith-v2

With ``--replay SET`` it measures instead the replay env of that set against the sim env with the same settings
(task, levels, agents, rounds, tokens), side by side: the target is replay >= 1.0x the sim.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

from pettingzoo.classic import rps_v2

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

import deliberation_env
from deliberation_env.cli import OLD_TEAM_FLAGS, TEAM_FLAGS, ArgumentParser, add_env_arguments, env_arguments


def rounds_per_second(env, seconds: float, seed: int = 0) -> tuple[float, int]:
    """Run whole episodes with random legal actions for about ``seconds``; return (rounds/s, rounds).

    Both envs get the same sampler, a Python ``random.choice`` over the legal actions (all of
    them when the observation has no action mask), so the harness costs them alike.
    """
    rng = random.Random(seed)
    all_actions = {agent: list(range(env.action_space(agent).n)) for agent in env.possible_agents}
    rounds, episode = 0, 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        observations, _ = env.reset(seed=seed + episode)
        episode += 1
        while env.agents:
            actions = {}
            for agent in env.agents:
                obs = observations[agent]
                if isinstance(obs, dict) and "action_mask" in obs:
                    legal = [a for a, allowed in enumerate(obs["action_mask"].tolist()) if allowed]
                else:
                    legal = all_actions[agent]
                actions[agent] = rng.choice(legal)
            observations, *_ = env.step(actions)
            rounds += 1
    return rounds / (time.perf_counter() - start), rounds


def main() -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="time budget per env")
    add_env_arguments(parser, TEAM_FLAGS, aliases=OLD_TEAM_FLAGS)
    parser.add_argument("--ours-only", action="store_true", help="skip rps_v2 (to profile our env alone); no ratio")
    parser.add_argument("--replay", default=None, metavar="SET", help="compare the replay env of SET with the sim")
    args = parser.parse_args()
    if args.replay:
        return compare_replay(args.replay, args.seconds)
    ours = deliberation_env.parallel_env(task="arithmetic", backend="sim", split="test", **env_arguments(args, TEAM_FLAGS))
    agents, rounds = ours.config.num_agents, ours.config.max_rounds
    print(f"config: task=arithmetic backend=sim agents={agents} rounds={rounds} seconds={args.seconds}")
    ours_rate, ours_rounds = rounds_per_second(ours, args.seconds)
    print(f"deliberation_env (sim): {ours_rate:10.0f} rounds/s  ({ours_rounds} rounds)")
    if args.ours_only:
        return
    floor_rate, floor_rounds = rounds_per_second(rps_v2.parallel_env(max_cycles=rounds), args.seconds)
    print(f"pettingzoo rps_v2     : {floor_rate:10.0f} rounds/s  ({floor_rounds} rounds)")
    print(f"ratio ours / rps_v2   : {ours_rate / floor_rate:10.3f}")


def compare_replay(name: str, seconds: float) -> None:
    from deliberation_env.make import replay_env
    from deliberation_env.replay import ReplaySet

    dataset = ReplaySet(name)
    card = dataset.card
    settings = {k: v for k, v in card.settings.items() if k != "num_agents"}
    sim = deliberation_env.parallel_env(task=card.task, task_kwargs=card.task_kwargs, backend="sim", split="test",
                                        num_agents=card.settings["num_agents"], max_rounds=card.rounds,
                                        confidence=card.confidence, **settings)
    replay = replay_env(dataset, split=next(iter(card.splits)))
    slices = 10  # interleaved, so that load from other jobs falls on both alike
    print(f"config: {card.name} ({len(dataset)} completions), agents={card.settings['num_agents']} "
          f"rounds={card.rounds}, {slices} interleaved pairs of {seconds / slices:g} s each")
    pairs = []
    for k in range(slices):
        sim_rate, _ = rounds_per_second(sim, seconds / slices, seed=k)
        replay_rate, _ = rounds_per_second(replay, seconds / slices, seed=k)
        pairs.append((sim_rate, replay_rate))
    ratios = sorted(r / s for s, r in pairs)
    print(f"sim    : {statistics.median(s for s, _ in pairs):10.0f} rounds/s (median of the slices)")
    print(f"replay : {statistics.median(r for _, r in pairs):10.0f} rounds/s")
    print(f"ratio replay / sim : {statistics.median(ratios):10.3f} (median of the pairs; range {ratios[0]:.3f}-{ratios[-1]:.3f})")


if __name__ == "__main__":
    main()
