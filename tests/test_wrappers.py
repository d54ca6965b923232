"""Flat-observation wrappers and SuperSuit vectorisation (CleanRL/SB3-style consumers)."""

from __future__ import annotations

import numpy as np
import pettingzoo
import supersuit as ss
from pettingzoo.test import parallel_api_test

import deliberation_env
from deliberation_env.wrappers import ActionMaskObservation, FlattenObservation


def test_flatten_layout_and_api():
    base = deliberation_env.parallel_env(invalid_action="persist")
    flat = FlattenObservation(deliberation_env.parallel_env(invalid_action="persist"))
    obs_base, _ = base.reset(seed=3)
    obs_flat, _ = flat.reset(seed=3)
    for agent, vector in obs_flat.items():
        assert flat.observation_space(agent).contains(vector)
        original = obs_base[agent]
        expected = np.concatenate([original["self"], original["peers"].ravel(), original["agreement"],
                                   original["action_mask"].astype(np.float32)])
        np.testing.assert_array_equal(vector, expected)
        np.testing.assert_array_equal(vector[-3:], original["action_mask"])
    parallel_api_test(flat, num_cycles=20)


def test_action_mask_observation():
    env = ActionMaskObservation(deliberation_env.parallel_env(invalid_action="persist"))
    observations, _ = env.reset(seed=0)
    for agent, obs in observations.items():
        assert env.observation_space(agent).contains(obs)
        assert obs["action_mask"].dtype == np.int8 and obs["observation"].dtype == np.float32
    parallel_api_test(env, num_cycles=20)


def test_supersuit_vector_env_runs_whole_episodes():
    env = FlattenObservation(deliberation_env.parallel_env(invalid_action="persist", max_rounds=3))
    vec = ss.pettingzoo_env_to_vec_env_v1(env)
    vec = ss.concat_vec_envs_v1(vec, 2, num_cpus=0, base_class="gymnasium")
    assert vec.num_envs == 6  # 2 envs x 3 agents
    observations, _ = vec.reset(seed=0)
    assert observations.shape == (6, env.observation_space("agent_0").shape[0])
    rng = np.random.default_rng(0)
    terminations_seen, total_reward = 0, 0.0
    for _ in range(9):  # three whole episodes per env, auto-reset in between
        masks = observations[:, -3:]
        actions = np.array([rng.choice(np.flatnonzero(mask)) for mask in masks])
        observations, rewards, terminations, truncations, _ = vec.step(actions)
        assert observations.dtype == np.float32 and np.all((observations >= 0) & (observations <= 1))
        terminations_seen += int(terminations.sum())
        total_reward += float(np.abs(rewards).sum())
    assert terminations_seen == 3 * 6
    assert total_reward > 0


def test_pettingzoo_registry_make():
    env = pettingzoo.make("parallel", deliberation_env.ENV_ID, num_agents=2, max_rounds=2)
    observations, _ = env.reset(seed=0)
    assert set(observations) == {"agent_0", "agent_1"}
