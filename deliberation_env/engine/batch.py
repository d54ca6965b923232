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

A masked action is played as PERSIST (``invalid_action="persist"``, the env's default); ``invalid_action="raise"``
raises ``ValueError`` instead, as the env does with that option. Episodes do not restart by themselves: ``reset(...)`` starts a new batch, ``reset_done(...)`` restarts
only the ended ones (the other rows keep their state). ``engine.gym.TreeVectorEnv`` is the Gymnasium form.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from deliberation_env.engine.tree import CompiledTree
from deliberation_env.formats import ObservationFormat
from deliberation_env.options import INVALID_ACTION_MODES


class TreeEnv:
    """``num_envs`` episodes of a ``CompiledTree`` stepped together (see the module docstring)."""

    def __init__(self, tree: CompiledTree, num_envs: int, *, format: ObservationFormat | None = None,
                 invalid_action: str = "persist", **format_keywords: Any):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if invalid_action not in INVALID_ACTION_MODES:
            raise ValueError(f"invalid_action must be 'raise' or 'persist', got {invalid_action!r}")
        if format is not None and format_keywords:
            raise TypeError(f"pass either format= or the format keywords {sorted(format_keywords)}, not both")
        self.tree, self.num_envs, self.invalid_action = tree, num_envs, invalid_action
        self.format = format or ObservationFormat(**format_keywords)
        n, width = tree.num_agents, tree.num_features
        self.possible_agents = [f"agent_{i}" for i in range(n)]
        self.observation_space = self.format.space(n, width, tree.num_actions)
        """One agent's observation space, as the PettingZoo env's ``observation_space(agent)``."""
        self._joint_weights = tree.num_actions ** np.arange(n - 1, -1, -1)
        packed = packed_arrays(tree)
        self._packed, self._legal = packed["observations"], packed["legal"]
        self._node_ints, self._edge_floats, self._edge_ints = packed["node_ints"], packed["edge_floats"], packed["edge_ints"]
        self.node = np.zeros(num_envs, np.int64)
        """Each episode's current node in the tree."""
        self.ended = np.ones(num_envs, bool)
        self.rng = np.random.default_rng()

    # ------------------------------------------------------------------ API
    def reset(self, seed: int | None = None, *, seeds: Sequence[int] | None = None,
              problems: Sequence[int | None] | None = None) -> tuple[Any, dict[str, np.ndarray]]:
        """Start ``num_envs`` episodes: from one generator seeded ``seed`` (the batch's problems and streams drawn
        together), or each from its own seed ``seeds[i]`` as ``env.reset(seed=seeds[i])`` draws them; ``problems``
        fixes each episode's problem index (as ``options={"problem_index": ...}``; None: drawn)."""
        self.node[:] = self._starts(self.num_envs, seed, seeds, problems)
        self.ended[:] = False
        return self._observe(self.node), self.node_info(self.node)

    def reset_done(self, seed: int | None = None, which: np.ndarray | None = None) -> tuple[Any, dict[str, np.ndarray]]:
        """Restart the ended episodes (those of them where ``which`` is true, if given), drawn from this env's
        generator (seeded by ``seed`` if given); the others keep their state."""
        ended = self.ended if which is None else self.ended & np.asarray(which, bool)
        if ended.all():
            self.node[:] = self._starts(self.num_envs, seed, None, None)
        elif ended.any():
            self.node[ended] = self._starts(int(ended.sum()), seed, None, None)
        self.ended[ended] = False
        return self._observe(self.node), self.node_info(self.node)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """One round of every live episode (see the module docstring)."""
        tree, n = self.tree, self.tree.num_agents
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs, n) or not np.issubdtype(actions.dtype, np.integer):
            raise ValueError(f"actions must be integers of shape (num_envs, num_agents) = ({self.num_envs}, {n}), "
                             f"got {actions.dtype} {actions.shape}")
        live = ~self.ended
        every = bool(live.all())
        if not every and not live.any():
            raise RuntimeError("step() with every episode ended; call reset() or reset_done()")
        nodes = self.node if every else self.node[live]
        chosen = actions if every else actions[live]
        if chosen.min() < 0 or chosen.max() >= tree.num_actions:
            raise ValueError(f"actions must be in [0, {tree.num_actions}), got {chosen.min()}..{chosen.max()}")
        legal = (np.take(self._legal, nodes, axis=0) >> chosen) & 1
        if not legal.all():
            if self.invalid_action == "raise":
                row, agent = np.argwhere(legal == 0)[0]
                raise ValueError(f"action {chosen[row, agent]} is masked for agent_{agent} in episode "
                                 f"{np.flatnonzero(live)[row]} (see the observation's action_mask); pass "
                                 "invalid_action='persist' to play masked actions as PERSIST")
            chosen = chosen * legal  # PERSIST (0) where masked: the tree's edges play it so too
        flat = np.take(tree.expand, nodes) * tree.num_joint + chosen @ self._joint_weights
        floats = np.take(self._edge_floats, flat, axis=0)
        ints = np.take(self._edge_ints, flat, axis=0)
        if every:
            self.node = ints[:, 0].astype(np.int64)
            done = ints[:, 1].astype(bool)
        else:
            scattered = np.zeros((self.num_envs, n, floats.shape[-1]), np.float32)
            scattered[live] = floats
            floats = scattered
            self.node[live] = ints[:, 0]
            done = self.ended.copy()
            done[live] = ints[:, 1].astype(bool)
        self.ended = done.copy()  # the caller's ``terminated`` must not change when reset_done() restarts episodes
        info = self.node_info(self.node)
        info["live"] = live
        for c, name in enumerate(tree.component_names):
            info[f"reward_{name}"] = floats[:, :, 1 + c]
        return self._observe(self.node), floats[:, :, 0], done, np.zeros(self.num_envs, bool), info

    def sample_actions(self, rng: np.random.Generator | None = None) -> np.ndarray:
        """(B, N) uniformly random legal actions at the current nodes (an action space's ``sample(mask)``)."""
        rng = rng or self.rng
        legal = np.take(self._legal, self.node, axis=0)
        count = np.zeros(legal.shape, np.int64)
        for action in range(self.tree.num_actions):
            count += (legal >> action) & 1
        pick = (rng.random(legal.shape) * count).astype(np.int64)  # the pick-th legal action
        chosen = np.zeros(legal.shape, np.int64)
        for action in range(self.tree.num_actions):
            bit = (legal >> action) & 1
            chosen += action * (bit & (pick == 0))
            pick -= bit
        return chosen

    def observe(self, nodes: np.ndarray) -> Any:
        """The observations of the given nodes, in this env's format (batched over ``nodes``' shape)."""
        return self._observe(np.asarray(nodes))

    def global_state(self) -> np.ndarray:
        """(B, N * F): every agent's feature row, as the env's ``state()`` (for centralised critics)."""
        return self.tree.rows[self.node].reshape(self.num_envs, -1)

    # ------------------------------------------------------------------ internals
    def _starts(self, count: int, seed: int | None, seeds: Sequence[int] | None,
                problems: Sequence[int | None] | None) -> np.ndarray:
        tree = self.tree
        problem_count, streams = len(tree.problem_ids), tree.streams
        fixed = [None] * count if problems is None else list(problems)
        if problems is not None and (len(fixed) != count or any(
                p is not None and not 0 <= int(p) < problem_count for p in fixed)):
            raise ValueError(f"problems must hold {count} indices in [0, {problem_count}) (None: drawn)")
        if seeds is not None:
            if len(seeds) != count:
                raise ValueError(f"seeds must hold one seed per episode ({count}), got {len(seeds)}")
            picked, stream = np.zeros(count, np.int64), np.zeros(count, np.int64)
            for i, one in enumerate(seeds):  # the PettingZoo env's draws: the problem (unless fixed), the episode seed
                rng = np.random.default_rng(int(one))
                given = fixed[i]
                picked[i] = int(rng.integers(problem_count)) if given is None else int(given)
                stream[i] = int(rng.integers(0, 2**62)) % streams
        else:
            if seed is not None:
                self.rng = np.random.default_rng(seed)
            picked = self.rng.integers(problem_count, size=count)
            if problems is not None:
                chosen = np.array([p is not None for p in fixed])
                picked[chosen] = [int(p) for p in fixed if p is not None]
            stream = self.rng.integers(streams, size=count)
        return tree.roots[picked, stream].astype(np.int64)

    def _observe(self, nodes: np.ndarray) -> Any:
        """One gather of the packed features (and one of the int8 masks), then views in the env's format."""
        tree, n, width = self.tree, self.tree.num_agents, self.tree.num_features
        packed = np.take(self._packed, nodes, axis=0)
        mask = np.take(tree.mask, nodes, axis=0)
        lead = packed.shape[:-1]
        raw = {"self": packed[..., :width], "peers": packed[..., width:n * width].reshape(*lead, n - 1, width),
               "agreement": packed[..., n * width:], "action_mask": mask}
        if self.format.mode == "dict":
            return self.format.observation_batch(raw)
        if self.format.mode == "masked":
            return {self.format.observation_key: packed, self.format.mask_key: mask}
        if self.format.mask_in_observation:
            return np.concatenate([packed, mask.astype(np.float32)], axis=-1)
        return packed

    def node_info(self, nodes: np.ndarray) -> dict[str, np.ndarray]:
        """The info arrays (module docstring) of the given nodes."""
        n = self.tree.num_agents
        ints = np.take(self._node_ints, nodes, axis=0)
        return {"consensus_correct": ints[..., 0].astype(bool), "correct": ints[..., 1:1 + n].astype(bool),
                "tokens": ints[..., 1 + n:1 + 2 * n], "oracle_action": ints[..., 1 + 2 * n:1 + 3 * n],
                "problem": ints[..., 1 + 3 * n], "stream": ints[..., 2 + 3 * n], "node": nodes.copy()}


_PACKED: dict[int, tuple[CompiledTree, dict[str, np.ndarray]]] = {}
"""Packed arrays by tree (its id, kept with the tree so that the id is not reused): built once per tree."""


def packed_arrays(tree: CompiledTree) -> dict[str, np.ndarray]:
    """Everything a step reads, packed per node and per edge so that a step is a few gathers (``np.take``)."""
    if id(tree) in _PACKED:
        return _PACKED[id(tree)][1]
    n, rows = tree.num_agents, tree.rows
    raw = {"self": rows, "peers": rows[:, tree.peer_matrix, :], "agreement": tree.agreement}
    packed = {
        "observations": np.ascontiguousarray(raw_flat(raw, ("self", "peers", "agreement"))),
        "legal": (tree.mask.astype(np.int64) << np.arange(tree.num_actions)).sum(-1),
        "node_ints": np.concatenate([tree.consensus_correct[:, None], tree.correct, tree.tokens, tree.oracle,
                                     tree.problem[:, None], tree.stream[:, None]], axis=1).astype(np.int32),
        "edge_floats": np.concatenate([tree.rewards[..., None], tree.components], axis=-1).reshape(
            -1, n, 1 + len(tree.component_names)),
        "edge_ints": np.stack([tree.child.reshape(-1), tree.done.reshape(-1)], axis=1).astype(np.int32),
    }
    if len(_PACKED) >= 8:
        _PACKED.clear()
    _PACKED[id(tree)] = (tree, packed)
    return packed


def raw_flat(raw: dict[str, np.ndarray], keys: Sequence[str]) -> np.ndarray:
    """The given entries of a batched raw observation concatenated per agent (the flat form's order)."""
    lead = raw["self"].shape[:-1]
    return np.concatenate([raw[key].reshape(*lead, -1).astype(np.float32, copy=False) for key in keys], axis=-1)
