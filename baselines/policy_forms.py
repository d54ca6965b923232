"""The forms a policy may take for ``baselines.benchmark`` (its docstring's table): resolving a spec or a checkpoint,
telling actors, baselines policies and Stable-Baselines3 models apart, flat-observation policies, and the check that
a probability function's answers are probabilities."""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


def resolve(policy: Any) -> Any:
    """A ``"module:name"`` spec or a checkpoint path -> the object it names (called if it takes no arguments)."""
    if isinstance(policy, (str, os.PathLike)):
        text = os.fspath(policy)
        if os.path.isfile(text) or text.endswith(".pt"):
            from baselines.meta.policy import load_policy

            return load_policy(text)
        module, _, name = text.partition(":")
        if not name:
            raise ValueError(f"a policy spec is a checkpoint path or 'module:name', got {text!r}")
        try:
            found = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as error:
            raise ValueError(f"cannot load policy {text!r}: {error}") from error
        if callable(found) and not is_actor(found) and required_parameters(found) == 0:
            found = found()
        return resolve(found) if isinstance(found, (str, os.PathLike)) else found
    return policy


def required_parameters(function: Callable[..., Any]) -> int:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return -1
    return sum(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in parameters)


def is_actor(policy: Any) -> bool:
    return not isinstance(policy, type) and callable(getattr(policy, "act", None)) and callable(getattr(policy, "reset", None)) \
        and not is_baselines_policy(policy)


def is_baselines_policy(policy: Any) -> bool:
    from baselines.meta.policy import Policy

    return isinstance(policy, Policy)


@dataclass(frozen=True)
class FlatObservations:
    """A policy of the flat observation (what ``observation="flat"`` gives each agent: ``[self, peers, agreement,
    action_mask]``), as libraries trained on it see it: ``probabilities(flat)`` maps an (M, D) float32 array, one row
    per agent, to (M, A) action probabilities. ``score`` hands it the cell's observations in that form, so a model
    trained on flat observations is scored without flattening anything by hand."""

    probabilities: Callable[[np.ndarray], Any]

    def __call__(self, observations: np.ndarray, nodes: Any) -> np.ndarray:
        flat = np.asarray(observations, dtype=np.float32)
        return np.asarray(self.probabilities(flat.reshape(-1, flat.shape[-1]))).reshape(*flat.shape[:-1], -1)

    @classmethod
    def of_sb3(cls, model: Any) -> FlatObservations:
        """A Stable-Baselines3 model's (PPO, A2C, DQN's greedy is its argmax) action probabilities on flat rows."""
        import torch

        expected = getattr(model.observation_space, "shape", None)

        def probabilities(flat: np.ndarray) -> np.ndarray:
            if expected is not None and tuple(expected) != flat.shape[1:]:
                raise ValueError(f"the model reads observations of shape {tuple(expected)}, the cell's flat ones "
                                 f"have shape {flat.shape[1:]}: score it on the cell of the game it trained on")
            tensor, _ = model.policy.obs_to_tensor(flat)
            with torch.no_grad():
                distribution = model.policy.get_distribution(tensor)
            return distribution.distribution.probs.cpu().numpy()

        return cls(probabilities)


def is_sb3_model(policy: Any) -> bool:
    return callable(getattr(getattr(policy, "policy", None), "get_distribution", None)) and hasattr(
        policy, "observation_space")


def validated(policy: Callable[[Any, Any], Any]) -> Callable[[Any, Any], np.ndarray]:
    """``policy`` whose every answer is checked to be probabilities (finite, >= 0, summing to 1 over each agent's
    actions) before it is scored, greedy or not: a ValueError naming the first bad row, never a score of it."""
    def checked(observations: Any, nodes: Any) -> np.ndarray:
        probabilities = np.asarray(policy(observations, nodes), dtype=np.float64)
        totals = probabilities.sum(-1)
        bad = ~np.isfinite(probabilities).all(-1) | (probabilities < 0).any(-1) | ~np.isclose(totals, 1.0, atol=1e-5)
        if probabilities.ndim != 3 or bad.any():
            if probabilities.ndim != 3:
                raise ValueError(f"the policy gave an array of shape {probabilities.shape}; a probability function "
                                 "returns (nodes, agents, actions) probabilities")
            node, agent = (int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"the policy's output is not probabilities: node {node}, agent {agent} got "
                             f"{np.array2string(probabilities[node, agent], precision=4)} (sum {totals[node, agent]:.4g});"
                             " give finite values >= 0 that sum to 1 over each agent's actions (a softmax), in "
                             "greedy scoring too")
        return probabilities

    return checked


def composed(outer: Callable[[Any], Any], inner: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    return lambda observations, nodes: outer(inner(observations, nodes))


def uniform(observations: Any, nodes: Any) -> np.ndarray:
    mask = np.asarray(observations["action_mask"], float)
    return mask / mask.sum(-1, keepdims=True)
