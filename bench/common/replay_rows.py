"""The transfer studies' shared steps: the trainers they train on a replay set's train split, and
playing an actor (a trained policy, a fixed protocol) on every problem of a split, per seed.

Shared by ``bench/studies/set_transfer.py`` and ``bench/studies/replay_transfer.py``, which play policies episode by
episode (live, or on another set's test split); the leaderboard's rows are scored exactly by ``baselines.benchmark``
(``bench.common``)."""

from __future__ import annotations

import os
from collections import Counter

import numpy as np

from baselines.benchmark import PROTOCOL_ROWS
from baselines.evaluation.evaluate import episode_seed, play_episodes
from baselines.meta.train import config_class, run
from baselines.meta.trainers import leaderboard_rows
from deliberation_env.make import replay_env
from deliberation_env.protocols import SPECS, make_protocol, protocol_agents
from deliberation_env.replay import ReplaySet


def play_rows(dataset: ReplaySet, actor_for, seeds, options: dict | None = None,
              split: str = "test") -> dict[str, np.ndarray]:
    """Per problem of ``split``: correct per seed (``runs``, seeds x problems) and averaged over seeds, tokens, and
    action shares."""
    envs = [replay_env(dataset, split=split, **(options or {})) for _ in range(32)]
    problems = len(envs[0].problems)
    runs, tokens, actions = np.zeros((len(seeds), problems)), np.zeros(problems), Counter()
    for k, seed in enumerate(seeds):
        episodes = [(episode_seed(seed, i), i) for i in range(problems)]
        records = play_episodes(envs, [actor_for(seed) for _ in envs], episodes)
        runs[k] = [r["correct"] for r in records]
        tokens += [r["tokens"] for r in records]
        for r in records:
            actions.update(r["actions"])
    total = sum(actions.values()) or 1
    return {"correct": runs.mean(0), "runs": runs, "tokens": tokens / len(seeds),
            "shares": np.array([actions[0], actions[1], sum(v for a, v in actions.items() if a >= 2)]) / total}


def protocol_rows(dataset: ReplaySet, seeds, split: str, options: dict,
                  names: tuple[str, ...] = PROTOCOL_ROWS + ("oracle",)) -> dict[str, dict]:
    """The fixed protocols ``names`` (default: all, and the oracle) on ``split`` (``single`` is read off the tree
    by the caller)."""
    return {name: play_rows(dataset, lambda s, n=name: make_protocol(n, seed=s),
                            seeds if "seed" in SPECS[name].options else [0], options, split=split)
            for name in names if protocol_agents(name) is None}


def options(args) -> dict:
    """The env options of every replay env the benchmark builds: --features and --env-option."""
    return {"features": args.features, **args.env_options}


def train_policy(dataset: ReplaySet, algo: str, seed: int, args, run_dir: str | None = None):
    """Trains ``algo`` on the set's train split (``args``: episodes, features, env_options, out); returns the policy."""
    run_dir = run_dir or os.path.join(args.out, "runs", f"{algo}-{args.features}-seed{seed}")
    trained, keywords = leaderboard_rows()[algo]
    cfg = config_class(trained)(
        episodes=args.episodes, seed=seed, out=run_dir, progress=False, tensorboard=False,
        num_agents=dataset.card.settings["num_agents"], max_rounds=dataset.card.rounds, **keywords)
    return run(trained, cfg, lambda: replay_env(dataset, split="train", **options(args)))


