"""Independent PPO with parameter sharing and GAE; optionally a centralised critic (MAPPO).

Every agent is an independent learner using one shared actor. The critic is either local
(the same architecture as the actor, over the agent's own observation) or, with
``--centralized-critic``, an MLP over the global state: ``env.state()`` when the environment
implements it, else the concatenation of all agents' observations, followed by a one-hot of
the agent's index (MAPPO: one critic, one value per agent, for per-agent returns). Advantages are
GAE(gamma, lambda) over each agent's trajectory of its own rewards (``--credit-span round``), or,
with ``--credit-span episode``, the agent's episode return minus the value, for every round.
Episode ends (terminations or truncations) are treated as terminal. The actor loss is the
clipped surrogate of ``baselines.meta.group_trainer.actor_loss`` (no KL by default).

    python -m baselines.meta.train --algo ppo --episodes 8000
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from baselines.logger import MetricsLogger, progress_bar
from baselines.meta.config import CREDIT_SPANS, BaseConfig, make_env_fn
from baselines.meta.distributed import open_collector
from baselines.meta.group_trainer import actor_loss
from baselines.meta.policy import Policy, adam, agent_layout, build_network, mlp, save_checkpoint
from baselines.meta.rollout import EpisodeSpec, Rollouts, global_state, rollout_metrics, sampling_key, trajectories
from baselines.meta.trainers import Trainer, register_trainer
from baselines.runtime import seed_everything


@dataclass
class PPOConfig(BaseConfig):
    """PPO / MAPPO settings."""

    episodes: int = 8000
    """Training budget in episodes."""
    credit_span: str = field(default="round", metadata={"argparse": {"choices": CREDIT_SPANS}})
    """'round': GAE over per-round rewards; 'episode': episode return minus value."""
    episodes_per_batch: int = 64
    """Episodes (different problems) per batch."""
    epochs: int = 4
    """Optimisation passes over each batch."""
    minibatches: int = 4
    """Minibatches per epoch."""
    clip: float = 0.2
    """Ratio clipping epsilon."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.01
    """Entropy bonus weight."""
    max_grad_norm: float = 1.0
    """Gradient-norm clipping (0: off)."""
    normalize_advantages: bool = True
    """Standardise advantages per minibatch."""
    centralized_critic: bool = False
    """MAPPO: the critic sees the global state (env.state(), else all agents' observations)."""

    def validate(self) -> None:
        super().validate()
        if self.episodes_per_batch < 1 or self.epochs < 1 or self.minibatches < 1:
            raise ValueError("episodes_per_batch, epochs and minibatches must be >= 1")


def gae(ro: Rollouts, values: np.ndarray, cfg: PPOConfig) -> tuple[np.ndarray, np.ndarray]:
    """(advantages, returns) per transition, one trajectory per (episode, agent)."""
    advantages = np.zeros(len(ro))
    for rows in trajectories(ro):
        rewards, v = ro.rewards[rows], values[rows]
        if cfg.credit_span == "episode":
            advantages[rows] = rewards.sum() - v
            continue
        running = 0.0
        for i in range(len(rows) - 1, -1, -1):
            next_value = v[i + 1] if i + 1 < len(rows) else 0.0
            delta = rewards[i] + cfg.gamma * next_value - v[i]
            running = delta + cfg.gamma * cfg.gae_lambda * running
            advantages[rows[i]] = running
    return advantages, advantages + values


def centralized_input(ro: Rollouts, num_agents: int) -> torch.Tensor:
    """The centralised critic's input per transition: the global state, then the one-hot agent index (without
    it every agent of a state would get the same value, though their returns differ)."""
    if ro.state is None:
        raise ValueError("the centralised critic needs the rollouts' global state (collect them with want_state=True)")
    identity = np.eye(num_agents, dtype=np.float32)[ro.agent]
    return torch.from_numpy(np.concatenate([ro.state.astype(np.float32), identity], axis=1))


def train(cfg: PPOConfig, env_fn: Callable[[], Any] | None = None) -> Policy:
    """Train, save ``<out>/policy.pt`` (the actor), return the actor."""
    cfg.validate()
    out = cfg.out or f"runs/ppo-seed{cfg.seed}"
    generator = seed_everything(cfg.seed, cfg.threads)
    env_fn = env_fn or make_env_fn(cfg)
    collector = open_collector(cfg, env_fn, min(cfg.num_envs, cfg.episodes_per_batch))
    env = collector.env
    layout = agent_layout(env)
    policy = Policy(layout, cfg.hidden)
    num_agents = len(env.possible_agents)
    if cfg.centralized_critic:
        obs, _ = env.reset(seed=cfg.seed)
        critic: torch.nn.Module = mlp(len(global_state(env, layout, obs)) + num_agents, cfg.hidden, 1)
    else:
        critic = build_network(layout, 1, cfg.hidden)
    params = list(policy.parameters()) + list(critic.parameters())
    optimizer = adam(params, cfg.lr)
    rng = np.random.default_rng(cfg.seed)
    logger = MetricsLogger(out, cfg.tensorboard)
    bar = progress_bar(cfg.episodes, "ppo", cfg.progress)
    done = 0
    while done < cfg.episodes:
        seeds = rng.integers(0, 2**31 - 1, size=min(cfg.episodes_per_batch, cfg.episodes - done))  # never past the budget
        specs = [EpisodeSpec(int(s), i, stream=done + i) for i, s in enumerate(seeds)]
        ro = collector.collect(layout, policy, specs, sampling_key(cfg.seed, "ppo"), reward_scale=cfg.reward_scale,
                               want_state=cfg.centralized_critic)
        x, mask = torch.from_numpy(ro.obs), torch.from_numpy(ro.mask)
        critic_in = centralized_input(ro, num_agents) if cfg.centralized_critic else x
        with torch.no_grad():
            values = critic(critic_in).squeeze(-1).double().numpy()
        adv, returns = gae(ro, values, cfg)
        adv_t, ret_t = torch.as_tensor(adv, dtype=torch.float32), torch.as_tensor(returns, dtype=torch.float32)
        actions, old_logp = torch.from_numpy(ro.actions), torch.from_numpy(ro.logp)
        stats: list[dict[str, float]] = []
        for _ in range(cfg.epochs):
            for rows in torch.randperm(len(ro), generator=generator).chunk(cfg.minibatches):
                a = adv_t[rows]
                if cfg.normalize_advantages and len(rows) > 1:
                    a = (a - a.mean()) / (a.std() + 1e-8)
                loss, info = actor_loss(policy, None, x[rows], mask[rows], actions[rows], old_logp[rows], a,
                                        cfg.clip, 0.0, cfg.ent_coef)
                value_loss = (critic(critic_in[rows]).squeeze(-1) - ret_t[rows]).pow(2).mean()
                optimizer.zero_grad()
                (loss + cfg.vf_coef * value_loss).backward()
                if cfg.max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                optimizer.step()
                stats.append({**info, "value_loss": value_loss.item()})
        done += len(specs)
        metrics = {**rollout_metrics(ro, cfg.reward_scale), **{k: float(np.mean([s[k] for s in stats])) for k in stats[0]}}
        logger.log(done, metrics)
        bar.update(len(specs))
        bar.set_postfix(acc=metrics.get("accuracy", float("nan")), ret=metrics["episode_return"])
    bar.close()
    logger.close()
    collector.close()
    save_checkpoint(os.path.join(out, "policy.pt"), policy, "ppo", asdict(cfg))
    return policy


register_trainer(Trainer("ppo", PPOConfig, train, rows={"ppo": {}, "mappo": {"centralized_critic": True}}))
