"""MAGRPO (Liu, Liang, Lyu, Amato, arXiv 2508.04652): group-relative credit on a shared team return.

For each problem, G joint rollouts are sampled (``group_size``); the shared team return R^(g)
of rollout g is the sum of every agent's rewards over the episode (``--credit-span round``: the
team's reward-to-go from each round, compared across the G siblings at the same round). Each
agent's advantage for its actions in rollout g is

    A_i^(g) = R^(g) - mean_g' R^(g')          (divided by the group std with --std-normalize)

The plain form has no importance ratio or clipping: one epoch, one minibatch, ``clip=0``
(the surrogate ``ratio * A`` then has the policy-gradient ``A * grad log pi`` at ratio 1), and no
KL. All of these are configurable. Agents share one policy network (aligned turns).

    python -m baselines.meta.train --algo magrpo --episodes 8000
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from baselines.advantages import group_normalized, grouped_apply
from baselines.meta.group_trainer import GroupConfig, train_grouped
from baselines.meta.policy import Policy
from baselines.meta.rollout import Rollouts, team_returns
from baselines.meta.trainers import Trainer, register_trainer


@dataclass
class MAGRPOConfig(GroupConfig):
    """MAGRPO settings (defaults: the plain form of the paper)."""

    episodes: int = 8000
    """Training budget in episodes (all G members of every group count)."""
    epochs: int = 1
    """Optimisation passes over each batch (plain MAGRPO: 1)."""
    minibatches: int = 1
    """Minibatches per epoch (plain MAGRPO: 1, one gradient step per batch)."""
    clip: float = 0.0
    """Ratio clipping (plain MAGRPO: none)."""
    kl_coef: float = 0.0
    """KL to the reference (plain MAGRPO: none)."""
    lr: float = 1e-2
    """Adam learning rate (one step per batch, hence larger than the multi-epoch trainers')."""
    std_normalize: bool = False
    """Divide by the group's std of team returns (a variant in the paper)."""


def advantages(ro: Rollouts, cfg: MAGRPOConfig) -> np.ndarray:
    if cfg.credit_span == "episode":
        returns, keys = team_returns(ro)
    else:
        returns, keys = team_reward_to_go(ro, cfg.gamma)
    return grouped_apply(returns, keys, ro.episode, lambda r: group_normalized(r, cfg.std_normalize))


def team_reward_to_go(ro: Rollouts, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """The team's (all agents') discounted reward-to-go from each round; keyed by (group, round)."""
    returns = np.zeros(len(ro))
    for episode in np.unique(ro.episode):
        rows = np.flatnonzero(ro.episode == episode)
        per_round = np.bincount(ro.step[rows], weights=ro.rewards[rows])
        to_go = np.zeros_like(per_round)
        running = 0.0
        for t in range(len(per_round) - 1, -1, -1):
            running = per_round[t] + gamma * running
            to_go[t] = running
        returns[rows] = to_go[ro.step[rows]]
    keys = np.unique(np.stack([ro.group, ro.step], 1), axis=0, return_inverse=True)[1].reshape(-1)
    return returns, keys


def train(cfg: MAGRPOConfig, env_fn: Callable[[], Any] | None = None) -> Policy:
    return train_grouped(cfg, "magrpo", lambda ro: advantages(ro, cfg), env_fn)


register_trainer(Trainer("magrpo", MAGRPOConfig, train))
