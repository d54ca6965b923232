"""Stable-Baselines3 PPO trains on the env with zero glue: SuperSuit's documented calls and our options only."""

from __future__ import annotations

import numpy as np
import pytest
import supersuit as ss
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.utils import set_random_seed

import deliberation_env

EVAL_SEEDS = range(1000, 1300)


def team_returns(policy, seeds) -> np.ndarray:
    """Per-episode sum of all agents' rewards, the same problems for every policy (seeded resets)."""
    env = deliberation_env.parallel_env(observation="flat")
    returns = []
    for seed in seeds:
        observations, _ = env.reset(seed=seed)
        rng, total = np.random.default_rng(seed), 0.0
        while env.agents:
            observations, rewards, _, _, _ = env.step({a: policy(observations[a], rng) for a in env.agents})
            total += sum(rewards.values())
        returns.append(total)
    return np.array(returns)


@pytest.fixture
def one_torch_thread():
    """Tiny MLP updates: two intra-op threads on a busy 2-core machine made training 13x slower (34 s vs 2.6 s)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_sb3_ppo_on_flat_observations_beats_random_legal_play(one_torch_thread):
    set_random_seed(0)
    # The recipe of docs/interop.md: observation="flat" (a Box; masked actions become PERSIST), SuperSuit, PPO.
    env = deliberation_env.parallel_env(observation="flat")
    vec = ss.pettingzoo_env_to_vec_env_v1(env)
    vec = ss.concat_vec_envs_v1(vec, 4, num_cpus=0, base_class="stable_baselines3")
    model = PPO("MlpPolicy", vec, n_steps=64, batch_size=256, verbose=0)
    model.learn(total_timesteps=3000)

    learned = team_returns(lambda obs, rng: int(model.predict(obs, deterministic=True)[0]), EVAL_SEEDS)
    random_legal = team_returns(lambda obs, rng: int(rng.choice(np.flatnonzero(obs[-3:]))), EVAL_SEEDS)
    difference = learned - random_legal  # paired: same problems and episode seeds
    standard_error = difference.std(ddof=1) / np.sqrt(len(difference))
    assert difference.mean() - 3 * standard_error > 0, (learned.mean(), random_legal.mean(), standard_error)
