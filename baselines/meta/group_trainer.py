"""The training loop shared by the group-relative trainers (SoftRankPO, GRPO, MAGRPO).

They differ only in how a group's returns become advantages; everything else is here:
sample ``groups_per_batch`` problems (reset seeds), play each ``group_size`` times with the
current policy (the last batch has only the groups left in the budget, which is rounded down
to whole groups), turn returns into advantages, then ``epochs`` passes of minibatch updates on

    loss = -mean(min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A))
           + kl_coef * mean(KL(pi || pi_ref)) - ent_coef * mean(H(pi))

where ratio = pi(a|o) / pi_old(a|o) (``clip=0`` disables clipping: the plain policy gradient
``ratio * A``, whose gradient at ratio = 1 is ``A * grad log pi``). The KL is exact over the
legal actions, to the frozen reference policy (the SFT policy when given, else the initial one).
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from baselines.logger import MetricsLogger, progress_bar
from baselines.meta.config import BaseConfig, make_env_fn
from baselines.meta.distributed import open_collector
from baselines.meta.policy import Policy, adam, agent_layout, kl_and_entropy, save_checkpoint
from baselines.meta.rollout import EpisodeSpec, Rollouts, rollout_metrics, sampling_key
from baselines.runtime import seed_everything


@dataclass
class GroupConfig(BaseConfig):
    """Settings of the group-relative trainers."""

    group_size: int = 8
    """K: rollouts per problem (same reset seed, differing only in the sampled actions); >= 2."""
    groups_per_batch: int = 16
    """Problems per batch; a batch has group_size * groups_per_batch episodes."""
    epochs: int = 4
    """Optimisation passes over each batch."""
    minibatches: int = 4
    """Minibatches per epoch."""
    clip: float = 0.2
    """PPO-style ratio clipping epsilon (0: no clipping)."""
    kl_coef: float = 0.05
    """Weight of KL(pi || reference): the SFT policy when given, else the initial policy (0: off)."""
    ent_coef: float = 0.0
    """Entropy bonus weight."""
    max_grad_norm: float = 1.0
    """Gradient-norm clipping (0: off)."""
    reference: str | None = None
    """Checkpoint of the KL reference policy (default: the initial policy)."""
    init: str | None = None
    """Checkpoint to start from (e.g. an SFT policy); also the default reference."""

    def validate(self) -> None:
        super().validate()
        if self.group_size < 2:
            raise ValueError(f"group_size (K) must be >= 2 for group-relative advantages, got {self.group_size}")
        if self.groups_per_batch < 1 or self.epochs < 1 or self.minibatches < 1:
            raise ValueError("groups_per_batch, epochs and minibatches must be >= 1")
        if self.clip < 0 or self.kl_coef < 0:
            raise ValueError("clip and kl_coef must be >= 0")


def actor_loss(policy: Policy, reference: Policy | None, x: torch.Tensor, mask: torch.Tensor, actions: torch.Tensor,
               old_logp: torch.Tensor, advantages: torch.Tensor, clip: float, kl_coef: float,
               ent_coef: float) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped policy-gradient loss with KL-to-reference and entropy terms (module docstring)."""
    log_p = policy.log_probs(x, mask)
    ratio = (log_p.gather(1, actions[:, None]).squeeze(1) - old_logp).exp()
    surrogate = ratio * advantages
    if clip > 0:
        surrogate = torch.min(surrogate, ratio.clamp(1 - clip, 1 + clip) * advantages)
    if reference is not None and kl_coef > 0:
        with torch.no_grad():
            log_q = reference.log_probs(x, mask)
        kl, entropy = kl_and_entropy(log_p, log_q)
    else:
        kl, entropy = kl_and_entropy(log_p, log_p.detach())
    loss = -surrogate.mean() + kl_coef * kl.mean() - ent_coef * entropy.mean()
    with torch.no_grad():
        stats = {"pg_loss": -surrogate.mean().item(), "kl": kl.mean().item(), "entropy": entropy.mean().item(),
                 "clip_frac": ((ratio - 1).abs() > clip).float().mean().item() if clip > 0 else 0.0}
    return loss, stats


def update(policy: Policy, reference: Policy | None, optimizer: torch.optim.Optimizer, ro: Rollouts,
           advantages: np.ndarray, cfg: GroupConfig, generator: torch.Generator) -> dict[str, float]:
    """``cfg.epochs`` passes of minibatch steps of ``actor_loss`` over one batch."""
    x, mask = torch.from_numpy(ro.obs), torch.from_numpy(ro.mask)
    actions, old_logp = torch.from_numpy(ro.actions), torch.from_numpy(ro.logp)
    adv = torch.as_tensor(advantages, dtype=torch.float32)
    stats: list[dict[str, float]] = []
    for _ in range(cfg.epochs):
        for rows in torch.randperm(len(ro), generator=generator).chunk(cfg.minibatches):
            loss, info = actor_loss(policy, reference, x[rows], mask[rows], actions[rows], old_logp[rows], adv[rows],
                                    cfg.clip, cfg.kl_coef, cfg.ent_coef)
            optimizer.zero_grad()
            loss.backward()
            if cfg.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
            optimizer.step()
            stats.append(info)
    return {k: float(np.mean([s[k] for s in stats])) for k in stats[0]}


COLLAPSE_BATCHES = 3
"""Consecutive batches whose advantages are all zero after which the trainer warns that learning has stopped."""


def collapse_message(algo: str, done: int, budget: int) -> str:
    return (f"{algo}: in the last {COLLAPSE_BATCHES} batches every group's rollouts earned equal returns (all "
            f"advantages zero, episode {done} of {budget}), so those batches taught nothing; usually the policy has "
            "become deterministic and will learn nothing more. If it settled too early, lower --lr or add --kl-coef "
            "or --ent-coef (the metrics log's entropy and adv_abs show when).")


def load_into(policy: Policy, path: str) -> Policy:
    from baselines.meta.policy import load_checkpoint

    policy.load_state_dict(load_checkpoint(path)["state_dict"])
    return policy


def train_grouped(cfg: GroupConfig, algo: str, advantages_fn: Callable[[Rollouts], np.ndarray],
                  env_fn: Callable[[], Any] | None = None, policy: Policy | None = None,
                  reference: Policy | None = None) -> Policy:
    """Train with group-relative advantages; saves ``<out>/policy.pt`` and returns the policy."""
    cfg.validate()
    out = cfg.out or f"runs/{algo}-seed{cfg.seed}"
    generator = seed_everything(cfg.seed, cfg.threads)
    env_fn = env_fn or make_env_fn(cfg)
    batch = cfg.group_size * cfg.groups_per_batch
    collector = open_collector(cfg, env_fn, min(cfg.num_envs, batch))
    layout = agent_layout(collector.env)
    policy = policy or Policy(layout, cfg.hidden)
    if cfg.init:
        load_into(policy, cfg.init)
    if reference is None and cfg.kl_coef > 0:
        reference = load_into(Policy(layout, cfg.hidden), cfg.reference) if cfg.reference else copy.deepcopy(policy)
    if reference is not None:
        reference.requires_grad_(False)
    optimizer = adam(policy.parameters(), cfg.lr)
    rng = np.random.default_rng(cfg.seed)
    logger = MetricsLogger(out, cfg.tensorboard)
    budget = cfg.episodes // cfg.group_size * cfg.group_size  # whole groups, never past --episodes
    bar = progress_bar(budget, algo, cfg.progress)
    done, flat_batches, warned = 0, 0, False
    while done < budget:
        groups = min(cfg.groups_per_batch, (budget - done) // cfg.group_size)  # the last batch may be smaller
        seeds = rng.integers(0, 2**31 - 1, size=groups)
        specs = [EpisodeSpec(int(seed), g, stream=done + g * cfg.group_size + k)
                 for g, seed in enumerate(seeds) for k in range(cfg.group_size)]
        ro = collector.collect(layout, policy, specs, sampling_key(cfg.seed, algo), reward_scale=cfg.reward_scale)
        advantages = advantages_fn(ro)
        stats = update(policy, reference, optimizer, ro, advantages, cfg, generator)
        done += len(specs)
        metrics = {**rollout_metrics(ro, cfg.reward_scale), **stats, "adv_abs": float(np.abs(advantages).mean())}
        logger.log(done, metrics)
        flat_batches = flat_batches + 1 if metrics["adv_abs"] == 0 else 0
        if flat_batches == COLLAPSE_BATCHES and done < budget and not warned:
            warnings.warn(collapse_message(algo, done, budget), RuntimeWarning, stacklevel=2)
            warned = True
        bar.update(len(specs))
        bar.set_postfix(acc=metrics.get("accuracy", float("nan")), ret=metrics["episode_return"], kl=stats["kl"])
    bar.close()
    logger.close()
    collector.close()
    save_checkpoint(os.path.join(out, "policy.pt"), policy, algo, asdict(cfg))
    return policy
