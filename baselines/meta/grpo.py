"""GRPO: group-relative advantages ``(r - mean) / std`` within each group of K rollouts.

For a comparison group of K returns (K rollouts of one problem, same reset seed; with
``--credit-span round`` one group per agent and round) the advantage of return r is
``(r - mean) / (std + eps)`` when ``std_normalize`` is on, else ``r - mean``
(``baselines.advantages.group_normalized``). The update is the clipped policy gradient with a
KL term of ``baselines.meta.group_trainer``. Without the std division, advantages scale with
the rewards (the reward-scale study shows the effect).

    python -m baselines.meta.train --algo grpo --episodes 8000
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from baselines.advantages import group_normalized, grouped_apply
from baselines.meta.group_trainer import GroupConfig, train_grouped
from baselines.meta.policy import Policy
from baselines.meta.rollout import Rollouts, agent_returns
from baselines.meta.trainers import Trainer, register_trainer


@dataclass
class GRPOConfig(GroupConfig):
    """GRPO settings."""

    episodes: int = 8000
    """Training budget in episodes (all K members of every group count)."""
    std_normalize: bool = True
    """Divide the centred returns by the group's standard deviation (+ eps)."""
    eps: float = 1e-6
    """Added to the group std before dividing."""


def advantages(ro: Rollouts, cfg: GRPOConfig) -> np.ndarray:
    returns, keys = agent_returns(ro, cfg.credit_span, cfg.gamma)
    return grouped_apply(returns, keys, ro.episode, lambda r: group_normalized(r, cfg.std_normalize, cfg.eps))


def train(cfg: GRPOConfig, env_fn: Callable[[], Any] | None = None) -> Policy:
    return train_grouped(cfg, "grpo", lambda ro: advantages(ro, cfg), env_fn)


register_trainer(Trainer("grpo", GRPOConfig, train))
