"""B episodes of a compiled game (``engine.tree``) stepped together with numpy: the fast form of a replay env.

    tree = compile_tree("qwen05-arith-v2", "train", features="v2")
    env = TreeEnv(tree, num_envs=4096)
    obs, info = env.reset(seed=0)                      # obs["self"]: (B, N, F), obs["action_mask"]: (B, N, A)
    obs, rewards, terminated, truncated, info = env.step(actions)   # actions: (B, N) ints; rewards: (B, N)

It plays the same game as the PettingZoo env it was compiled from (``tests/test_engine.py`` compares every joint
action): ``reset(seeds=[...])`` draws each episode's problem and stream from its seed exactly as
``env.reset(seed=...)`` does, so episode i of a batch is the PettingZoo env's episode with seed ``seeds[i]``;
``reset(seed=s)`` draws the whole batch from one generator (faster; the same batch for the same ``s``).

| what                 | shape / type                                                                 |
|----------------------|------------------------------------------------------------------------------|
| observations         | the env's ``observation=`` form, batched: ``"dict"`` gives ``{"self": (B, N, F), |
|                      | "peers": (B, N, N-1, F), "agreement": (B, N, N-1), "action_mask": (B, N, A)}``; |
|                      | ``"flat"``: (B, N, D); ``"masked"``: ``{"observation": (B, N, D'), "action_mask"}`` |
| actions              | (B, N) ints (``core.actions``); rows of ended episodes are ignored             |
| rewards              | (B, N) float32, 0 for episodes that had already ended                         |
| terminated           | (B,) bool: the episode has ended (``truncated`` is always False)              |
| info                 | arrays: ``consensus_correct`` (B,), ``correct``, ``tokens``, ``oracle_action`` (B, N), |
|                      | ``reward_<component>`` (B, N), ``problem``, ``stream``, ``node`` (B,)         |

A masked action raises ``ValueError`` (the env's default); ``invalid_action="persist"`` plays it as PERSIST, as
the env does. Episodes do not restart by themselves: ``reset(...)`` starts a new batch, ``reset_done(...)`` restarts
only the ended ones (the other rows keep their state). ``engine.gym.TreeVectorEnv`` is the Gymnasium form.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from deliberation_env.engine.tree import CompiledTree
from deliberation_env.formats import ObservationFormat


class TreeEnv:
    """``num_envs`` episodes of a ``CompiledTree`` stepped together (see the module docstring)."""

    def __init__(self, tree: CompiledTree, num_envs: int, *, format: ObservationFormat | None = None,
                 invalid_action: str = "raise", **format_keywords: Any):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if invalid_action not in ("raise", "persist"):
            raise ValueError(f"invalid_action must be 'raise' or 'persist', got {invalid_action!r}")
        if format is not None and format_keywords:
            raise TypeError(f"pass either format= or the format keywords {sorted(format_keywords)}, not both")
        self.tree, self.num_envs, self.invalid_action = tree, num_envs, invalid_action
        self.format = format or ObservationFormat(**format_keywords)
        self.possible_agents = [f"agent_{i}" for i in range(tree.num_agents)]
        self.observation_space = self.format.space(tree.num_agents, tree.num_features, tree.num_actions)
        """One agent's observation space, as the PettingZoo env's ``observation_space(agent)``."""
        self._peers = tree.peer_matrix
        self._joint_weights = tree.num_actions ** np.arange(tree.num_agents - 1, -1, -1)
        self.node = np.zeros(num_envs, np.int64)
        """Each episode's current node in the tree."""
        self.ended = np.ones(num_envs, bool)
        self.rng = np.random.default_rng()

    # ------------------------------------------------------------------ API
    def reset(self, seed: int | None = None, *, seeds: Sequence[int] | None = None,
              problems: Sequence[int] | None = None) -> tuple[Any, dict[str, np.ndarray]]:
        """Start ``num_envs`` episodes: from one generator seeded ``seed`` (the batch's problems and streams drawn
        together), or each from its own seed ``seeds[i]`` as ``env.reset(seed=seeds[i])`` draws them; ``problems``
        fixes each episode's problem index (as ``options={"problem_index": ...}``)."""
        self.node[:] = self._starts(np.ones(self.num_envs, bool), seed, seeds, problems)
        self.ended[:] = False
        return self._observe(self.node), self._info(self.node)

    def reset_done(self, seed: int | None = None) -> tuple[Any, dict[str, np.ndarray]]:
        """Restart the ended episodes only (drawn from this env's generator, seeded by ``seed`` if given)."""
        ended = self.ended.copy()
        if ended.any():
            self.node[ended] = self._starts(ended, seed, None, None)
            self.ended[ended] = False
        return self._observe(self.node), self._info(self.node)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """One round of every live episode (see the module docstring)."""
        tree = self.tree
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs, tree.num_agents) or not np.issubdtype(actions.dtype, np.integer):
            raise ValueError(f"actions must be integers of shape (num_envs, num_agents) = "
                             f"({self.num_envs}, {tree.num_agents}), got {actions.dtype} {actions.shape}")
        live = ~self.ended
        if not live.any():
            raise RuntimeError("step() with every episode ended; call reset() or reset_done()")
        nodes = self.node[live]
        chosen = actions[live]
        if ((chosen < 0) | (chosen >= tree.num_actions)).any():
            raise ValueError(f"actions must be in [0, {tree.num_actions}), got {chosen.min()}..{chosen.max()}")
        legal = np.take_along_axis(tree.mask[nodes], chosen[:, :, None], axis=2)[:, :, 0].astype(bool)
        if not legal.all():
            if self.invalid_action == "raise":
                row, agent = np.argwhere(~legal)[0]
                raise ValueError(f"action {chosen[row, agent]} is masked for agent_{agent} in episode "
                                 f"{np.flatnonzero(live)[row]} (see the observation's action_mask); pass "
                                 "invalid_action='persist' to play masked actions as PERSIST")
            chosen = np.where(legal, chosen, 0)  # the tree's edges already play them so; kept for the info
        edges = tree.expand[nodes]
        joint = chosen @ self._joint_weights
        children = tree.child[edges, joint]
        rewards = np.zeros((self.num_envs, tree.num_agents), np.float32)
        rewards[live] = tree.rewards[edges, joint]
        components = np.zeros((self.num_envs, tree.num_agents, len(tree.component_names)), np.float32)
        components[live] = tree.components[edges, joint]
        done = self.ended.copy()
        done[live] = tree.done[edges, joint]
        self.node[live] = children
        self.ended = done
        info = self._info(self.node)
        info["live"] = live
        for c, name in enumerate(tree.component_names):
            info[f"reward_{name}"] = components[:, :, c]
        return self._observe(self.node), rewards, done, np.zeros(self.num_envs, bool), info

    def observe(self, nodes: np.ndarray) -> Any:
        """The observations of the given nodes, in this env's format (batched over ``nodes``' shape)."""
        return self._observe(np.asarray(nodes))

    def global_state(self) -> np.ndarray:
        """(B, N * F): every agent's feature row, as the env's ``state()`` (for centralised critics)."""
        return self.tree.rows[self.node].reshape(self.num_envs, -1)

    # ------------------------------------------------------------------ internals
    def _starts(self, which: np.ndarray, seed: int | None, seeds: Sequence[int] | None,
                problems: Sequence[int | None] | None) -> np.ndarray:
        tree, count = self.tree, int(which.sum())
        problem_count, streams = len(tree.problem_ids), tree.streams
        fixed = [None] * count if problems is None else list(problems)
        if len(fixed) != count or any(p is not None and not 0 <= int(p) < problem_count for p in fixed):
            raise ValueError(f"problems must hold {count} indices in [0, {problem_count}) (None: drawn)")
        if seeds is not None:
            if len(seeds) != count:
                raise ValueError(f"seeds must hold one seed per episode ({count}), got {len(seeds)}")
            picked, stream = np.zeros(count, np.int64), np.zeros(count, np.int64)
            for i, one in enumerate(seeds):  # the PettingZoo env's draws: the problem (unless fixed), the episode seed
                rng = np.random.default_rng(int(one))
                picked[i] = rng.integers(problem_count) if fixed[i] is None else fixed[i]
                stream[i] = int(rng.integers(0, 2**62)) % streams
        else:
            if seed is not None:
                self.rng = np.random.default_rng(seed)
            picked = self.rng.integers(problem_count, size=count)
            if problems is not None:
                given = np.array([p is not None for p in fixed])
                picked[given] = [int(p) for p in fixed if p is not None]
            stream = self.rng.integers(streams, size=count)
        return tree.roots[picked, stream].astype(np.int64)

    def _observe(self, nodes: np.ndarray) -> Any:
        tree = self.tree
        rows = tree.rows[nodes]
        raw = {"self": rows, "peers": rows[..., self._peers, :], "agreement": tree.agreement[nodes],
               "action_mask": tree.mask[nodes]}
        return self.format.observation_batch(raw)

    def _info(self, nodes: np.ndarray) -> dict[str, np.ndarray]:
        tree = self.tree
        return {"consensus_correct": tree.consensus_correct[nodes], "correct": tree.correct[nodes],
                "tokens": tree.tokens[nodes], "oracle_action": tree.oracle[nodes], "problem": tree.problem[nodes],
                "stream": tree.stream[nodes], "node": nodes.copy()}
