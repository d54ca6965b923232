"""A policy's expected score on a split, computed exactly from a compiled tree instead of estimated by play.

A decentralised stochastic policy gives each agent a distribution over its actions at every node; a joint action's
probability is the product of its agents' (they sample independently). The expected final accuracy from a node is
then a finite sum over the joint actions, and the expectation over a split averages the roots (each problem
equally, its streams equally), as episodes drawn uniformly over problems and streams would:

    V(m) = consensus_correct(m)                          at a node where the episode has ended
    V(m) = sum_j P(j | m) * V(child(m, j))                elsewhere

and likewise the tokens spent and the team's return. A greedy policy (``greedy_probabilities``) is one pass; a
stochastic one needs one policy call per node as well: the tree's internal nodes, batched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from deliberation_env.engine.tree import CompiledTree
from deliberation_env.formats import ObservationFormat

Probabilities = Callable[[Any, np.ndarray], np.ndarray]
"""``(observations, nodes) -> (K, N, A)`` action probabilities of each agent at each of the K nodes, given their
observations in the evaluator's format (batched over the K nodes, then the N agents)."""


def greedy_probabilities(probabilities: np.ndarray) -> np.ndarray:
    """One-hot of each agent's most probable action (the first of ties, as ``argmax``)."""
    probabilities = np.asarray(probabilities)
    return np.eye(probabilities.shape[-1], dtype=np.float64)[probabilities.argmax(-1)]


def expected_scores(tree: CompiledTree, policy: Probabilities, *, format: ObservationFormat | None = None,
                    batch: int = 65_536) -> dict[str, np.ndarray]:
    """Per problem of the tree's split (arrays of length P, in ``tree.problem_ids`` order): the expected
    ``accuracy`` (final consensus right), ``tokens`` (the whole episode's, round 0 included) and ``return``
    (rewards summed over agents and rounds) of ``policy`` (``Probabilities``), averaged over the streams.
    ``format``: the observation form ``policy`` reads (default: the env's dict form)."""
    from deliberation_env.engine.batch import TreeEnv

    viewer = TreeEnv(tree, 1, format=format or ObservationFormat())
    accuracy = tree.consensus_correct.astype(np.float64)
    tokens = np.zeros(tree.num_nodes)
    returns = np.zeros(tree.num_nodes)
    joints = tree.joint_actions()
    internal = np.flatnonzero(tree.expand >= 0)
    for depth in sorted(set(tree.depth[internal].tolist()), reverse=True):  # children before their parents
        level = internal[tree.depth[internal] == depth]
        for start in range(0, len(level), batch):
            nodes = level[start:start + batch]
            chances = _joint_probabilities(tree, nodes, policy(viewer.observe(nodes), nodes), joints)
            edges = tree.expand[nodes]
            children = tree.child[edges]
            spent = tree.tokens[children].sum(-1) + tokens[children]
            earned = tree.rewards[edges].sum(-1) + returns[children]
            accuracy[nodes] = (chances * accuracy[children]).sum(-1)
            tokens[nodes] = (chances * spent).sum(-1)
            returns[nodes] = (chances * earned).sum(-1)
    roots = tree.roots
    return {"accuracy": accuracy[roots].mean(1), "tokens": (tokens[roots] + tree.tokens[roots].sum(-1)).mean(1),
            "return": returns[roots].mean(1)}


def _joint_probabilities(tree: CompiledTree, nodes: np.ndarray, probabilities: np.ndarray,
                         joints: np.ndarray) -> np.ndarray:
    """(K, J): the product over agents of each agent's probability of its part of joint action j."""
    probabilities = np.asarray(probabilities, dtype=np.float64)
    expected = (len(nodes), tree.num_agents, tree.num_actions)
    if probabilities.shape != expected:
        raise ValueError(f"the policy gave probabilities of shape {probabilities.shape}, expected {expected} "
                         "(nodes, agents, actions)")
    if (probabilities < 0).any() or not np.allclose(probabilities.sum(-1), 1.0, atol=1e-5):
        raise ValueError("the policy's probabilities must be >= 0 and sum to 1 over each agent's actions")
    per_agent = probabilities[:, np.arange(tree.num_agents), joints]  # (K, J, N)
    return per_agent.prod(-1)
