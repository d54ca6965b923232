"""Tianshou 2.0 on the AEC form with no glue: one DQN per agent (docs/interop.md, Tianshou section).

Tianshou is not a dev dependency (it needs pandas<3): pip install "torch==2.13.0" tianshou
Usage: python examples/interop/tianshou_dqn.py [EPOCHS]   (prints the learned and random team returns)
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from tianshou.algorithm import DQN, MultiAgentOffPolicyAlgorithm
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.algorithm.random import MARLRandomDiscreteMaskedOffPolicyAlgorithm
from tianshou.data import Collector, CollectStats, VectorReplayBuffer
from tianshou.env import DummyVectorEnv
from tianshou.env.pettingzoo_env import PettingZooEnv
from tianshou.trainer import OffPolicyTrainerParams
from tianshou.utils.net.common import Net

import deliberation_env

AGENTS = 3


def get_env(split: str = "train") -> PettingZooEnv:
    # AEC form: {"observation", "action_mask"} observations; numeric infos (Tianshou rejects None values)
    return PettingZooEnv(deliberation_env.env(num_agents=AGENTS, infos="numeric", split=split))


def dqn(env: PettingZooEnv) -> DQN:
    net = Net(state_shape=env.observation_space["observation"].shape, action_shape=env.action_space.n,
              hidden_sizes=[64, 64])
    policy = DiscreteQLearningPolicy(model=net, action_space=env.action_space, eps_training=0.2, eps_inference=0.0)
    # n-step = number of agents: a round's rewards land on the last agent's row (see docs/interop.md)
    return DQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), gamma=0.99, n_step_return_horizon=AGENTS,
               target_update_freq=100)


def team_return(algorithm, episodes: int = 300) -> float:
    envs = DummyVectorEnv([lambda: get_env("test") for _ in range(4)])
    envs.seed(1000)
    collector = Collector[CollectStats](algorithm, envs)
    collector.reset()
    return float(collector.collect(n_episode=episodes).returns.sum(axis=1).mean())


def main() -> None:
    torch.set_num_threads(1)
    np.random.seed(0)
    torch.manual_seed(0)
    env = get_env()
    marl = MultiAgentOffPolicyAlgorithm(algorithms=[dqn(env) for _ in range(AGENTS)], env=env)
    train_envs = DummyVectorEnv([get_env for _ in range(8)])
    train_envs.seed(0)
    collector = Collector[CollectStats](marl, train_envs, VectorReplayBuffer(20000, 8), exploration_noise=True)
    collector.reset()
    marl.run_training(OffPolicyTrainerParams(
        training_collector=collector, max_epochs=int(sys.argv[1]) if len(sys.argv) > 1 else 2, epoch_num_steps=2000,
        collection_step_num_env_steps=80, batch_size=64, update_step_num_gradient_steps_per_sample=0.25,
        test_in_training=False, show_progress=False, multi_agent_return_reduction=lambda rews: rews.sum(axis=1)))
    random_legal = MultiAgentOffPolicyAlgorithm(
        algorithms=[MARLRandomDiscreteMaskedOffPolicyAlgorithm(env.action_space) for _ in range(AGENTS)], env=env)
    print(f"team return: learned {team_return(marl):.3f}, random legal {team_return(random_legal):.3f}")


if __name__ == "__main__":
    main()
