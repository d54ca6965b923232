"""Observation wrappers for RL libraries that expect flat vectors.

The same formats are construction options (``parallel_env(observation="flat" | "masked")``,
``deliberation_env.formats``), which ``pettingzoo.make`` users can pass too; these wrappers remain
for wrapping an env built elsewhere.

- ``FlattenObservation(env)``: each observation becomes one float32 Box vector:
  ``concat(self, peers.ravel(), agreement, action_mask)``; the mask stays readable as the
  last A entries (A = 3, or 2 + N with ``concede_to_peer``). This is what SuperSuit's ``pettingzoo_env_to_vec_env_v1`` and
  CleanRL/SB3-style code consume.
- ``ActionMaskObservation(env)``: ``{"observation": float32 vector without the mask,
  "action_mask": int8 (A,)}``, the convention of PettingZoo's classic envs and of
  masked-PPO implementations.
"""

from __future__ import annotations

import math

import gymnasium
import numpy as np
from pettingzoo.utils.wrappers import BaseParallelWrapper

from deliberation_env.formats import FEATURE_KEYS as _KEYS
from deliberation_env.formats import flatten as _flatten


def _flat_size(space: gymnasium.spaces.Dict, keys: tuple[str, ...]) -> int:
    size = 0
    for key in keys:
        shape = space[key].shape
        if shape is None:
            raise ValueError(f"observation[{key!r}] is {space[key]!r}, which has no shape")
        size += math.prod(shape)
    return size


class _ObservationWrapper(BaseParallelWrapper):
    def reset(self, seed=None, options=None):
        observations, infos = self.env.reset(seed=seed, options=options)
        return {agent: self._convert(obs) for agent, obs in observations.items()}, infos

    def step(self, actions):
        observations, rewards, terminations, truncations, infos = self.env.step(actions)
        return {agent: self._convert(obs) for agent, obs in observations.items()}, rewards, terminations, truncations, infos

    def observation_space(self, agent):
        return self._space

    def _convert(self, observation):  # overridden below
        return observation


class FlattenObservation(_ObservationWrapper):
    """Observations as one float32 vector ``[self, peers, agreement, action_mask]``."""

    def __init__(self, env):
        super().__init__(env)
        inner = env.observation_space(env.possible_agents[0])
        size = _flat_size(inner, (*_KEYS, "action_mask"))
        self._space = gymnasium.spaces.Box(0.0, 1.0, (size,), np.float32)

    def _convert(self, observation):
        return _flatten(observation, (*_KEYS, "action_mask"))


class ActionMaskObservation(_ObservationWrapper):
    """Observations as ``{"observation": float32 vector, "action_mask": int8 (A,)}``."""

    def __init__(self, env):
        super().__init__(env)
        inner = env.observation_space(env.possible_agents[0])
        self._space = gymnasium.spaces.Dict(
            {
                "observation": gymnasium.spaces.Box(0.0, 1.0, (_flat_size(inner, _KEYS),), np.float32),
                "action_mask": inner["action_mask"],
            }
        )

    def _convert(self, observation):
        return {"observation": _flatten(observation, _KEYS), "action_mask": observation["action_mask"]}
