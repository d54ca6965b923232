"""Rollout collection on a compiled replay tree (``deliberation_env.engine``): ``collect``'s episodes, played by
numpy instead of the env.

``collect_tree`` plays the same episodes as ``baselines.meta.rollout.collect`` on the replay env the tree was
compiled from, in the same waves, with the same per-episode sampling streams and the same batched policy passes,
so it returns the same ``Rollouts``, row for row (``tests/test_engine_training.py``), at a fraction of the cost.
``TreeCollector`` is the trainers' collector for a replay set (``open_collector`` picks it with ``engine="tree"``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from baselines.meta.policy import ObsLayout, Policy, encode_batch
from baselines.meta.rollout import Collection, EpisodeSpec, Rollouts
from deliberation_env.engine import CompiledTree, TreeEnv, compile_tree

LABELS = ("oracle_action",)
"""The info labels a tree holds per agent (``label_key``)."""


def collect_tree(tree: CompiledTree, format: Any, wave: int, layout: ObsLayout, policy: Policy | None,
                 specs: Sequence[EpisodeSpec], key: Sequence[int], reward_scale: float = 1.0,
                 label_key: str | None = None, want_state: bool = False,
                 on_episodes: Callable[[int], None] | None = None) -> Rollouts:
    """``collect(envs, layout, policy, specs, key, ...)`` with ``len(envs) == wave`` envs of the tree's game in the
    observation ``format`` (the envs' ``ObservationFormat``), played on the tree."""
    if label_key is not None and label_key not in LABELS:
        raise ValueError(f"a compiled tree holds the labels {LABELS}, not {label_key!r}")
    run = Collection(layout, policy, key, reward_scale, label_key, want_state)
    for start in range(0, len(specs), wave):
        indices = np.arange(start, min(start + wave, len(specs)))
        play_wave(TreeEnv(tree, len(indices), format=format), Wave(indices, [specs[i] for i in indices.tolist()]), run)
        if on_episodes is not None:
            on_episodes(len(indices))
    return run.rollouts()


@dataclass
class Wave:
    """Episodes played together on one ``TreeEnv``, as ``collect`` plays a wave of its envs."""

    indices: np.ndarray
    """The episodes' indices in the collection's specs."""
    specs: list[EpisodeSpec]


def play_wave(env: TreeEnv, wave: Wave, run: Collection) -> None:
    """Play ``wave``'s episodes on ``env`` (one row each) to their ends into ``run``: each round, one policy pass for
    every live agent, in episode order, as ``collect`` batches its envs'."""
    tree, agents, n = env.tree, env.possible_agents, env.tree.num_agents
    specs = wave.specs
    observations, info = env.reset(seeds=[spec.seed for spec in specs],
                                   problems=[_problem_index(tree, spec.options) for spec in specs])
    streams = [run.stream(int(i), spec) for i, spec in zip(wave.indices, specs)]
    first = len(run.episodes)
    for spec, tokens in zip(specs, info["tokens"].sum(-1)):
        run.start(spec, agents, float(tokens))
    groups = np.array([spec.group for spec in specs], np.int64)
    live, round_ = np.ones(len(specs), bool), 0
    while live.any():
        where = np.flatnonzero(live)
        count = len(where) * n
        x, mask = encode_batch(run.layout, _rows_of(observations, where, count), count)
        actions = run.act(x, mask, [(streams[k], n) for k in where], episode=np.repeat(wave.indices[where], n),
                          group=np.repeat(groups[where], n), agent=np.tile(np.arange(n), len(where)),
                          step=np.full(count, round_),
                          labels=info["oracle_action"][where] if run.label_key else np.full(count, -1),
                          state=np.repeat(env.global_state()[where], n, axis=0) if run.want_state else None)
        joint = np.zeros((len(specs), n), np.int64)
        joint[where] = actions.numpy().reshape(len(where), n)
        _, rewards, done, _, info = env.step(joint, observe=False)
        step_tokens = info["tokens"].sum(-1)
        for k in where:
            run.record(first + k, dict(zip(agents, rewards[k].tolist())), joint[k].tolist(), float(step_tokens[k]))
            if done[k]:
                run.finish(first + k, bool(info["consensus_correct"][k]))
        live = ~done
        round_ += 1
        if live.any():
            observations = env.observe(env.node)


def _rows_of(observations: Any, where: np.ndarray, count: int) -> Any:
    """The live episodes' observations, one row per agent (episode-major, as ``collect`` orders them)."""
    if isinstance(observations, dict):
        return {k: v[where].reshape(count, *v.shape[2:]) for k, v in observations.items()}
    return observations[where].reshape(count, *observations.shape[2:])


def _problem_index(tree: CompiledTree, options: dict[str, Any] | None) -> int | None:
    """The problem an episode's reset options fix (``problem_index`` or ``problem_id``), else None."""
    if not options:
        return None
    unknown = sorted(set(options) - {"problem_index", "problem_id"})
    if unknown:
        raise ValueError(f"reset options {unknown} are not supported on a compiled tree (problem_index, problem_id)")
    if "problem_index" in options:
        return int(options["problem_index"])
    try:
        return tree.problem_ids.index(options["problem_id"])
    except ValueError:
        raise ValueError(f"no problem with id {options['problem_id']!r} in the tree's split {tree.split!r}") from None


def policy_probabilities(policy: Policy, layout: ObsLayout, greedy: bool = True) -> Any:
    """The engine's ``Probabilities`` of a trained policy (``deliberation_env.engine.expected_scores``): each agent's
    action probabilities at a batch of nodes, from the batched observations in the policy's env format; ``greedy``
    one-hots the most probable action (the leaderboard plays greedily: ``PolicyActor(deterministic=True)``)."""
    import torch

    def probabilities(observations: Any, nodes: np.ndarray) -> np.ndarray:
        first = next(iter(observations.values())) if isinstance(observations, dict) else observations
        count, agents = first.shape[:2]
        x, mask = encode_batch(layout, _rows_of(observations, np.arange(count), count * agents), count * agents)
        with torch.no_grad():
            logits = policy(x, mask)
        if greedy:
            out = np.eye(layout.num_actions)[logits.argmax(-1).numpy()]
        else:
            out = torch.softmax(logits.double(), -1).numpy()
        return out.reshape(count, agents, layout.num_actions)

    return probabilities


class TreeCollector:
    """The trainers' collector on a replay set's compiled tree (``open_collector``'s interface): ``env_fn`` makes
    the set's envs (an ``EnvFactory``); the tree is compiled from the set its backend has loaded."""

    def __init__(self, env_fn: Any, wave: int, split: str, options: dict[str, Any]):
        from deliberation_env.replay.backend import replay_backend

        self.env = env_fn()
        """An env of the learner's own (the observation layout, and the format the tree's observations take)."""
        self.wave = wave
        replay = replay_backend(self.env.backends[0])
        if replay is None:
            raise ValueError("TreeCollector needs the envs of a replay set (engine='tree' plays a recorded tree)")
        self.tree = compile_tree(replay.set, split, **options)

    def collect(self, layout: ObsLayout, policy: Policy | None, specs: Sequence[EpisodeSpec], key: Sequence[int],
                **options: Any) -> Rollouts:
        return collect_tree(self.tree, self.env.format, self.wave, layout, policy, specs, key, **options)

    def close(self) -> None:
        self.env.close()
