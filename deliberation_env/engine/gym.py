"""The compiled game as a Gymnasium ``VectorEnv``: every agent of every episode one sub-environment.

    from deliberation_env.engine import compile_tree
    from deliberation_env.engine.gym import TreeVectorEnv
    envs = TreeVectorEnv(compile_tree("qwen05-arith-v2", "fit", features="v2"), num_episodes=1024)
    obs, info = envs.reset(seed=0)             # obs: (1024 * 3, D) float32; info["action_mask"]: (1024 * 3, A)
    obs, rewards, terminations, truncations, info = envs.step(actions)   # actions: (1024 * 3,) ints

The form single-agent vectorised learners take without glue (CleanRL's scripts, a Gymnasium ``VectorEnv`` loop):
sub-environment ``e * N + i`` is agent i of episode e; it sees the env's flat observation (its row, its peers' rows,
agreement, and the legal-action mask as its last A entries), gets its own reward, and ends with its episode. All
agents share one policy, as the baselines do (parameter sharing). Episodes restart on the step after they end
(Gymnasium's ``AutoresetMode.NEXT_STEP``): that step's actions are ignored, and it returns the new episode's first
observation with reward 0. ``info`` holds ``action_mask`` (num_envs, A), ``consensus_correct`` and ``tokens`` per
sub-environment. ``engine.batch.TreeEnv`` is the multi-agent form these are built on.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from deliberation_env.engine.batch import TreeEnv
from deliberation_env.engine.tree import CompiledTree
from deliberation_env.formats import ObservationFormat


class TreeVectorEnv(VectorEnv):
    """``num_episodes`` episodes of a compiled tree as ``num_episodes * N`` single-agent sub-environments."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, tree: CompiledTree, num_episodes: int, invalid_action: str = "persist"):
        self.engine = TreeEnv(tree, num_episodes, format=ObservationFormat(observation="flat"),
                              invalid_action=invalid_action)
        self.num_agents = tree.num_agents
        self.num_envs = num_episodes * tree.num_agents
        self.single_observation_space = self.engine.observation_space
        self.single_action_space = gymnasium.spaces.Discrete(tree.num_actions)
        self.observation_space = gymnasium.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gymnasium.vector.utils.batch_space(self.single_action_space, self.num_envs)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        observations, info = self.engine.reset(seed=seed)
        return self._flat(observations), self._info(observations, info)

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        engine, n = self.engine, self.num_agents
        actions = np.asarray(actions, dtype=np.int64).reshape(engine.num_envs, n)
        rewards = np.zeros((engine.num_envs, n), np.float32)
        restart = engine.ended.copy()  # the episodes that ended last step: they start again, their actions ignored
        ended = np.zeros(engine.num_envs, bool)
        if not restart.all():  # the episodes still running play their round (the ended ones are skipped)
            _, stepped, done, _, _ = engine.step(np.where(restart[:, None], 0, actions), observe=False)
            rewards = np.where(restart[:, None], 0.0, stepped).astype(np.float32)
            ended = done & ~restart
        observations, info = engine.reset_done(which=restart)  # every row's observations, built once
        terminations = np.repeat(ended, n)
        return (self._flat(observations), rewards.reshape(-1), terminations, np.zeros_like(terminations),
                self._info(observations, info))

    def _flat(self, observations: np.ndarray) -> np.ndarray:
        return observations.reshape(self.num_envs, -1)

    def _info(self, observations: np.ndarray, info: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        actions = self.engine.tree.num_actions
        return {"action_mask": observations[..., -actions:].reshape(self.num_envs, actions).astype(np.int8),
                "consensus_correct": np.repeat(info["consensus_correct"], self.num_agents),
                "tokens": info["tokens"].reshape(-1)}
