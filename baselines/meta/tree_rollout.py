"""Rollout collection on a compiled replay tree (``deliberation_env.engine``): ``collect``'s episodes, played by
numpy instead of the env.

``collect_tree`` plays the same episodes as ``baselines.meta.rollout.collect`` on the replay env the tree was
compiled from, in the same waves, with the same per-episode sampling streams and the same batched policy passes,
so it returns the same ``Rollouts``, row for row (``tests/test_engine_training.py``), at a fraction of the cost.
``TreeCollector`` is the trainers' collector for a replay set (``open_collector`` picks it with ``engine="tree"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from baselines.meta.policy import ObsLayout, Policy, encode_batch
from baselines.meta.rollout import (
    EpisodeSpec,
    Rollouts,
    add_batch,
    choose,
    episode_stream,
    new_rows,
    new_summary,
    to_rollouts,
)
from deliberation_env.engine import CompiledTree, TreeEnv, compile_tree

LABELS = ("oracle_action",)
"""The info labels a tree holds per agent (``label_key``)."""


def collect_tree(tree: CompiledTree, format: Any, wave: int, layout: ObsLayout, policy: Policy | None,
                 specs: Sequence[EpisodeSpec], key: Sequence[int], reward_scale: float = 1.0,
                 label_key: str | None = None, want_state: bool = False, on_episodes: Any = None) -> Rollouts:
    """``collect(envs, layout, policy, specs, key, ...)`` with ``len(envs) == wave`` envs of the tree's game in the
    observation ``format`` (the envs' ``ObservationFormat``), played on the tree."""
    if label_key is not None and label_key not in LABELS:
        raise ValueError(f"a compiled tree holds the labels {LABELS}, not {label_key!r}")
    rows = new_rows()
    summaries: list[dict[str, Any]] = []
    for start in range(0, len(specs), wave):
        _play_wave(tree, format, layout, policy, specs, range(start, min(start + wave, len(specs))), key,
                   reward_scale, label_key, want_state, rows, summaries)
        if on_episodes is not None:
            on_episodes(min(wave, len(specs) - start))
    return to_rollouts(rows, summaries, layout, want_state)


def _play_wave(tree, format, layout, policy, specs, indices: range, key, reward_scale, label_key, want_state,
               rows, summaries) -> None:
    env = TreeEnv(tree, len(indices), format=format)
    agents, n = env.possible_agents, tree.num_agents
    wave = [specs[i] for i in indices]
    problems = [_problem_index(tree, spec.options) for spec in wave]
    observations, info = env.reset(seeds=[spec.seed for spec in wave], problems=problems)
    streams = [episode_stream(key, i if spec.stream is None else spec.stream) for i, spec in zip(indices, wave)]
    tokens = info["tokens"].sum(-1)
    first = len(summaries)
    summaries.extend(new_summary(spec, agents, float(tokens[k])) for k, spec in enumerate(wave))
    live, round_ = np.ones(len(wave), bool), 0
    while live.any():
        where = np.flatnonzero(live)
        count = len(where) * n
        batch = _rows_of(observations, where, count)
        x, mask = encode_batch(layout, batch, count)
        actions, logp = choose(policy, x, mask, [(streams[k], n) for k in where])
        rows["labels"].append(info["oracle_action"][where].reshape(-1) if label_key else np.full(count, -1))
        rows["episode"].append(np.repeat(np.asarray(indices)[where], n))
        rows["group"].append(np.repeat([wave[k].group for k in where], n))
        rows["agent"].append(np.tile(np.arange(n), len(where)))
        rows["step"].append(np.full(count, round_))
        if want_state:
            state = env.global_state()[where]
            rows["state"].append(np.repeat(state, n, axis=0))
        add_batch(rows, x, mask, actions, logp)
        joint = np.zeros((len(wave), n), np.int64)
        joint[where] = actions.numpy().reshape(len(where), n)
        observations, rewards, done, _, info = env.step(joint)
        scaled = rewards[where].astype(np.float64) * reward_scale
        rows["rewards"].append(scaled.reshape(-1))
        step_tokens = info["tokens"].sum(-1)
        for row, k in enumerate(where):
            summary = summaries[first + k]
            for a, agent in enumerate(agents):
                summary["returns"][agent] += float(scaled[row, a])
                summary["team_return"] += float(scaled[row, a])
            summary["actions"].extend(int(c) for c in joint[k])
            summary["length"] += 1
            summary["tokens"] += float(step_tokens[k])
            if done[k]:
                summary["success"] = bool(info["consensus_correct"][k])
        live = ~done
        round_ += 1


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
