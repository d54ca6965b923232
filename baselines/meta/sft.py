"""Behaviour cloning on oracle-labelled actions: MPDF's first stage and SoftRankPO's reference.

1. Play ``episodes`` episodes with a behaviour policy (uniformly random legal actions by
   default, for broad state coverage) and record, for every agent and round, the label the
   environment gives in ``infos[agent][label_key]`` (deliberation_env: ``oracle_action``).
2. Fit the shared policy by cross-entropy on (observation, label) pairs, ``epochs`` passes of
   minibatches of ``minibatch_size``. Rows whose label is missing or masked are dropped.

    python -m baselines.meta.train --algo sft --episodes 2000
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from baselines.logger import MetricsLogger, progress_bar
from baselines.meta.config import BaseConfig, make_env_fn
from baselines.meta.distributed import open_collector
from baselines.meta.policy import Policy, adam, agent_layout, save_checkpoint
from baselines.meta.rollout import EpisodeSpec, rollout_metrics, sampling_key
from baselines.meta.trainers import Trainer, register_trainer
from baselines.runtime import seed_everything


@dataclass
class SFTConfig(BaseConfig):
    """Behaviour-cloning settings."""

    episodes: int = 1500
    """Episodes of labelled data to collect."""
    label_key: str = "oracle_action"
    """infos[agent][label_key] holds the target action of the observation it comes with."""
    behaviour: str = "random"
    """Data-collection policy: 'random' (uniform legal actions) or 'policy' (the network being trained, sampled)."""
    epochs: int = 15
    """Passes over the labelled data."""
    minibatch_size: int = 256
    """Rows per cross-entropy step."""

    def validate(self) -> None:
        super().validate()
        if self.behaviour not in ("random", "policy"):
            raise ValueError(f"behaviour must be 'random' or 'policy', got {self.behaviour!r}")
        if self.epochs < 1 or self.minibatch_size < 1:
            raise ValueError("epochs and minibatch_size must be >= 1")


def train(cfg: SFTConfig, env_fn: Callable[[], Any] | None = None) -> Policy:
    """Collect labelled rollouts, fit by cross-entropy, save ``<out>/policy.pt``."""
    cfg.validate()
    out = cfg.out or f"runs/sft-seed{cfg.seed}"
    generator = seed_everything(cfg.seed, cfg.threads)
    env_fn = env_fn or make_env_fn(cfg)
    collector = open_collector(cfg, env_fn, min(cfg.num_envs, max(1, cfg.episodes)))
    layout = agent_layout(collector.env)
    policy = Policy(layout, cfg.hidden)
    rng = np.random.default_rng(cfg.seed)
    specs = [EpisodeSpec(int(s), i) for i, s in enumerate(rng.integers(0, 2**31 - 1, size=cfg.episodes))]
    with progress_bar(cfg.episodes, "sft data", cfg.progress) as bar:
        ro = collector.collect(layout, policy if cfg.behaviour == "policy" else None, specs,
                               sampling_key(cfg.seed, "sft"), reward_scale=cfg.reward_scale, label_key=cfg.label_key,
                               on_episodes=bar.update if cfg.num_workers == 0 else None)
        bar.update(cfg.episodes - bar.n)
    collector.close()
    labels = ro.labels
    legal = (labels >= 0) & (labels < layout.num_actions)
    legal[legal] &= ro.mask[np.flatnonzero(legal), labels[legal]]
    if not legal.any():
        raise ValueError(f"no usable labels: the environment's infos have no valid {cfg.label_key!r} entries")
    x, mask = torch.from_numpy(ro.obs[legal]), torch.from_numpy(ro.mask[legal])
    y = torch.from_numpy(labels[legal])
    optimizer = adam(policy.parameters(), cfg.lr)
    logger = MetricsLogger(out, cfg.tensorboard)
    logger.log(0, {f"data_{k}": v for k, v in rollout_metrics(ro, cfg.reward_scale).items()})
    for epoch in range(cfg.epochs):
        losses = []
        for rows in torch.randperm(len(y), generator=generator).split(cfg.minibatch_size):
            loss = torch.nn.functional.cross_entropy(policy(x[rows], mask[rows]), y[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        with torch.no_grad():
            accuracy = float((policy(x, mask).argmax(-1) == y).float().mean())
        logger.log(epoch + 1, {"loss": float(np.mean(losses)), "label_accuracy": accuracy})
    logger.close()
    save_checkpoint(os.path.join(out, "policy.pt"), policy, "sft", asdict(cfg), label_shares=np.bincount(
        y.numpy(), minlength=layout.num_actions).tolist())
    return policy.eval()


register_trainer(Trainer("sft", SFTConfig, train))
