"""Your own algorithm on the benchmark: REINFORCE in numpy, written outside ``baselines``, trained on a cell's ``fit``
split through the compiled-tree engine, then scored the leaderboard's way with one call (docs/benchmark.md).

    python examples/own_algorithm.py                         # qwen05-arith-v2:v2, 400k episodes, about a minute
    python examples/own_algorithm.py --cell qwen05-team-arith:chosen-v3 --episodes 20000

The policy is one linear softmax shared by the agents over each agent's observation (its row, its peers' rows,
whom it agrees with); the reward is the team's: 1 when the final consensus is right.
"""

from __future__ import annotations

import argparse

import numpy as np

from baselines.benchmark import parse_cell, score
from deliberation_env.engine import TreeEnv


def inputs(observations: dict[str, np.ndarray]) -> np.ndarray:
    """(B, N, D): each agent's own row, its peers' rows and agreement, and a bias."""
    batch, agents = observations["self"].shape[:2]
    return np.concatenate([observations["self"], observations["peers"].reshape(batch, agents, -1),
                           observations["agreement"], np.ones((batch, agents, 1), np.float32)], axis=-1)


def probabilities(weights: np.ndarray, observations: dict[str, np.ndarray]) -> np.ndarray:
    """(B, N, A) action probabilities, masked actions at 0."""
    logits = np.where(observations["action_mask"] > 0, inputs(observations) @ weights, -np.inf)
    logits -= logits.max(-1, keepdims=True)
    exp = np.exp(logits)
    return exp / exp.sum(-1, keepdims=True)


def train(cell, episodes: int, batch: int = 4096, lr: float = 2.0, seed: int = 0) -> np.ndarray:
    """REINFORCE with a running-mean baseline on the cell's fit split; returns the weights."""
    tree = cell.tree("fit")
    env, rng = TreeEnv(tree, batch), np.random.default_rng(seed)
    observations, _ = env.reset(seed=seed)
    weights = np.zeros((inputs(observations).shape[-1], tree.num_actions))
    baseline = 0.0
    for _ in range(max(1, episodes // batch)):
        observations, _ = env.reset()
        steps = []  # (inputs, d log pi / d logits) of every round
        while not env.ended.all():  # one round on the shipped sets; more on sets recorded with more rounds
            chances = probabilities(weights, observations)
            actions = (chances.cumsum(-1) < rng.random(chances.shape[:-1])[..., None]).sum(-1)
            live = (~env.ended)[:, None, None]
            steps.append((inputs(observations), (np.eye(tree.num_actions)[actions] - chances) * live))
            observations, _, _, _, info = env.step(actions)
        team = info["consensus_correct"].astype(float)  # the team's reward: the final consensus is right
        advantage = team - baseline
        baseline = 0.9 * baseline + 0.1 * team.mean()
        for step_inputs, direction in steps:
            weights += lr * np.einsum("bnd,bna,b->da", step_inputs, direction, advantage) / batch
    return weights


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cell", default="qwen05-arith-v2:v2")
    parser.add_argument("--episodes", type=int, default=400_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    cell = parse_cell(args.cell)
    weights = train(cell, args.episodes, seed=args.seed)
    print(score(lambda observations, nodes: probabilities(weights, observations), cell, label="reinforce"))


if __name__ == "__main__":
    main()
