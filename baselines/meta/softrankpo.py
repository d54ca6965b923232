"""SoftRankPO: rank-based advantages mapped through normal quantiles (MPDF, arXiv 2509.03817).

The paper does not publish the equations; this is the reconstruction described in the
project's ``docs/method.md``, implemented in ``baselines.advantages.softrank_advantages`` as follows. For a comparison group of K returns
(K rollouts of one problem: the same reset seed, differing only in sampled actions):

1. rank the returns, 1..K, average ranks for ties (values closer than 1e-9 of the group's
   range count as tied, so float noise of a rescaled reward cannot split a tie);
2. percentile ``p = (rank - 0.5) / K``;
3. ``A = Phi^-1(p) / tau`` (``scipy.special.ndtri``), then minus the group mean of A.

Properties (tested): A depends only on the order of the returns, so it is unchanged by any
``r -> a*r + b`` with ``a > 0``; it has zero mean (the quantiles of untied percentiles are
symmetric and sum to zero; the re-centring only acts when ties break that symmetry); equal
returns get equal advantages; an all-equal group gets zeros; ``|A| <= 2 |Phi^-1(0.5/K)| / tau``.

How tau enters: it divides the quantiles, so it sets the contrast of the advantages *relative
to the KL-to-reference and entropy terms* (and to the clip range): small tau (0.4) pushes
hard away from the SFT reference, large tau (5.0) stays close to it. With a positive
``kl_coef`` this changes the fixed point of the update, not only its speed.

Training (``train``): stage 1, unless ``init`` is given, behaviour cloning on oracle labels
(``baselines.meta.sft``, ``sft_episodes`` episodes); stage 2, the group trainer of
``baselines.meta.group_trainer`` with these advantages and the SFT policy as KL reference.

    python -m baselines.meta.train --algo softrankpo --task arithmetic --backend sim
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from baselines.advantages import grouped_apply, softrank_advantages
from baselines.meta.config import make_env_fn
from baselines.meta.group_trainer import GroupConfig, train_grouped
from baselines.meta.policy import Policy
from baselines.meta.rollout import Rollouts, agent_returns
from baselines.meta.sft import SFTConfig
from baselines.meta.sft import train as train_sft
from baselines.meta.trainers import Trainer, register_trainer


@dataclass
class SoftRankPOConfig(GroupConfig):
    """SoftRankPO settings (stage 1 SFT, stage 2 rank-quantile policy optimisation)."""

    episodes: int = 12000
    """RL budget in episodes (all K members of every group count)."""
    kl_coef: float = 0.2
    """Weight of KL(pi || reference), the SFT policy (0.05 drifted below the SFT policy's test accuracy on the sim; 0.2 held it)."""
    tau: float = 0.8
    """Temperature: A = Phi^-1(p) / tau (paper's best 0.8; tried 0.4 to 5.0)."""
    sft_episodes: int = 1500
    """Stage 1: episodes of oracle-labelled data for behaviour cloning (0: no SFT stage, start from scratch)."""
    sft_epochs: int = 15
    """Stage 1: cross-entropy passes over the labelled data."""
    sft_init: str | None = None
    """An SFT checkpoint: skip stage 1, start from it and use it as the KL reference (same as --init)."""

    def validate(self) -> None:
        super().validate()
        if self.tau <= 0:
            raise ValueError(f"tau must be > 0, got {self.tau}")
        if self.sft_episodes < 0:
            raise ValueError("sft_episodes must be >= 0")


def advantages(ro: Rollouts, cfg: SoftRankPOConfig) -> np.ndarray:
    returns, keys = agent_returns(ro, cfg.credit_span, cfg.gamma)
    return grouped_apply(returns, keys, ro.episode, lambda r: softrank_advantages(r, cfg.tau))


def train(cfg: SoftRankPOConfig, env_fn: Callable[[], Any] | None = None) -> Policy:
    """SFT (unless ``cfg.init``), then SoftRankPO with the SFT policy as KL reference."""
    cfg.validate()
    if cfg.sft_init is not None:
        cfg = replace(cfg, init=cfg.sft_init, sft_init=None)
    out = cfg.out or f"runs/softrankpo-seed{cfg.seed}"
    env_fn = env_fn or make_env_fn(cfg)  # one backend for both stages
    policy = reference = None
    if cfg.init is None and cfg.sft_episodes > 0:
        sft_cfg = SFTConfig(**{k: getattr(cfg, k) for k in SFTConfig.__dataclass_fields__ if hasattr(cfg, k)
                               and k not in ("episodes", "epochs", "out")},
                            episodes=cfg.sft_episodes, epochs=cfg.sft_epochs, out=os.path.join(out, "sft"))
        policy = train_sft(sft_cfg, env_fn).train()
        reference = copy.deepcopy(policy) if cfg.kl_coef > 0 else None
    elif cfg.init is not None and cfg.reference is None and cfg.kl_coef > 0:
        cfg = replace(cfg, reference=cfg.init)
    return train_grouped(replace(cfg, out=out), "softrankpo", lambda ro: advantages(ro, cfg), env_fn, policy, reference)


register_trainer(Trainer("softrankpo", SoftRankPOConfig, train))
