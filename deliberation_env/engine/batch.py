"""B episodes of a compiled game (``engine.tree``) stepped together with numpy: the fast form of a replay env.

    tree = compile_tree("qwen05-arith-v2", "train", features="v2")
    env = TreeEnv(tree, num_envs=4096)
    obs, info = env.reset(seed=0)                      # obs["self"]: (B, N, F), obs["action_mask"]: (B, N, A)
    obs, rewards, terminated, truncated, info = env.step(actions)   # actions: (B, N) ints; rewards: (B, N)
    obs, info = env.reset_done()                       # restart the episodes that ended

It plays the same game as the PettingZoo env it was compiled from (``tests/test_engine.py`` compares every joint
action), and draws its episodes as the env does. The batch plays one env's stream of episodes, in row order:
``reset(seed=s)`` gives row i the episode the env plays after ``reset(seed=s)`` and i unseeded ``reset()``s, and
each ``reset_done()`` gives the restarted rows, in row order, the next episodes of that stream. An unseeded
``TreeEnv`` draws from a stream of its own, the same on every run of a program (``unseeded_seed``, as an unseeded
env), never from OS entropy. ``reset(seeds=[...])`` starts row i as ``env.reset(seed=seeds[i])`` does instead.

| what                 | shape / type                                                                 |
|----------------------|------------------------------------------------------------------------------|
| observations         | the env's ``observation=`` form, batched: ``"dict"`` gives ``{"self": (B, N, F), |
|                      | "peers": (B, N, N-1, F), "agreement": (B, N, N-1), "action_mask": (B, N, A)}``; |
|                      | ``"flat"``: (B, N, D); ``"masked"``: ``{"observation": (B, N, D'), "action_mask"}`` |
| actions              | (B, N) ints (``core.actions``); rows of ended episodes are ignored             |
| rewards              | (B, N) float32, 0 for episodes that had already ended                         |
| terminated           | (B,) bool: the episode has ended (``truncated`` is always False)              |
| info                 | arrays: ``consensus_correct`` (B,), ``correct``, ``tokens`` (this step's), ``tokens_total`` |
|                      | (the episode's so far, round 0 included), ``oracle_action`` (B, N), ``reward_<component>`` |
|                      | (B, N, after a step), ``problem``, ``stream``, ``node`` (B,), ``live`` (B,: stepped) |

A masked action is played as PERSIST (``invalid_action="persist"``, the env's default); ``invalid_action="raise"``
raises ``ValueError`` instead, as the env does with that option. Episodes do not restart by themselves: ``reset(...)``
starts a new batch, ``reset_done(...)`` restarts only the ended ones (the other rows keep their state). A loop that
restarts after every step passes ``step(actions, observe=False)``: the step then builds no observations (it returns
None for them) and ``reset_done`` builds every row's once. ``engine.gym.TreeVectorEnv`` is the Gymnasium form.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from deliberation_env.engine.tree import CompiledTree
from deliberation_env.env import unseeded_seed
from deliberation_env.formats import ObservationFormat
from deliberation_env.options import INVALID_ACTION_MODES

EPISODE_SEEDS = 2**62
"""The env's episode seeds are drawn from [0, EPISODE_SEEDS) (``DeliberationEnv.begin_episode``)."""
UNSEEDED_TREES = 0xFFFF_FFFF
"""The first number of an unseeded ``TreeEnv``'s stream: ``unseeded_seed((UNSEEDED_TREES, k))`` for the k-th of a
process, apart from the envs' streams (``(k,)`` and their copies')."""
_UNSEEDED = itertools.count()


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
        n = tree.num_agents
        self.possible_agents = [f"agent_{i}" for i in range(n)]
        self.observation_space = self.format.space(n, tree.num_features, tree.num_actions)
        """One agent's observation space, as the PettingZoo env's ``observation_space(agent)``."""
        self._tables = packed_arrays(tree)
        self._observations = observation_table(tree, self.format)
        self._joint_weights = tree.num_actions ** np.arange(n - 1, -1, -1)
        self.node = np.zeros(num_envs, np.int64)
        """Each episode's current node in the tree."""
        self.ended = np.ones(num_envs, bool)
        self.tokens_total = np.zeros((num_envs, n), np.int64)
        """Each episode's tokens so far, per agent (round 0 included): the env's ``tokens_total``."""
        self._ints = np.take(self._tables.node_ints, self.node, axis=0)  # the current nodes' (see ``Packed``)
        self._generator: np.random.Generator | None = None

    @property
    def rng(self) -> np.random.Generator:
        """The generator of the episodes' problems and streams (module docstring): seeded by ``reset(seed=s)``,
        continued by unseeded resets; before any seed, a stream of this env's own (``UNSEEDED_TREES``)."""
        if self._generator is None:
            self._generator = np.random.default_rng(unseeded_seed((UNSEEDED_TREES, next(_UNSEEDED))))
        return self._generator

    @rng.setter
    def rng(self, generator: np.random.Generator) -> None:
        self._generator = generator

    # ------------------------------------------------------------------ API
    def reset(self, seed: int | None = None, *, seeds: Sequence[int] | None = None,
              problems: Sequence[int | None] | None = None) -> tuple[Any, dict[str, np.ndarray]]:
        """Start ``num_envs`` episodes: the next ones of this env's stream (row i: the env's episode after
        ``reset(seed=seed)`` and i unseeded resets; ``seed=None`` continues the stream), or, with ``seeds``, each as
        ``env.reset(seed=seeds[i])`` draws it (the stream is left as it was). ``problems`` fixes each episode's problem
        index (as ``options={"problem_index": ...}``; None: drawn)."""
        self._restart(np.ones(self.num_envs, bool), self._starts(self.num_envs, seed, seeds, problems))
        return self._observe(self.node), self._info()

    def reset_done(self, seed: int | None = None, which: np.ndarray | None = None) -> tuple[Any, dict[str, np.ndarray]]:
        """Restart the ended episodes (those of them where ``which`` is true, if given) with the next episodes of this
        env's stream (seeded ``seed`` first, if given), in row order; the others keep their state. Returns every
        row's observations and infos."""
        ended = self.ended if which is None else self.ended & np.asarray(which, bool)
        count = int(ended.sum())
        if count:
            self._restart(ended, self._starts(count, seed, None, None))
        elif seed is not None:
            self.rng = np.random.default_rng(seed)
        return self._observe(self.node), self._info()

    def step(self, actions: Any, *, observe: bool = True) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray,
                                                                   dict[str, np.ndarray]]:
        """One round of every live episode (see the module docstring). ``observe=False`` builds no observations
        (returns None for them): for a loop whose next call is ``reset_done()``, which builds every row's."""
        tree, n = self.tree, self.tree.num_agents
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs, n) or not np.issubdtype(actions.dtype, np.integer):
            raise ValueError(f"actions must be integers of shape (num_envs, num_agents) = ({self.num_envs}, {n}), "
                             f"got {actions.dtype} {actions.shape}")
        live = ~self.ended
        every = bool(live.all())
        if not every and not live.any():
            raise RuntimeError("step() with every episode ended; call reset() or reset_done()")
        ints = self._ints if every else self._ints[live]
        chosen = actions if every else actions[live]
        if chosen.min() < 0 or chosen.max() >= tree.num_actions:
            raise ValueError(f"actions must be in [0, {tree.num_actions}), got {chosen.min()}..{chosen.max()}")
        tables = self._tables
        legal = (ints[:, tables.legal] >> chosen) & 1
        if not legal.all():
            if self.invalid_action == "raise":
                row, agent = np.argwhere(legal == 0)[0]
                raise ValueError(f"action {chosen[row, agent]} is masked for agent_{agent} in episode "
                                 f"{np.flatnonzero(live)[row]} (see the observation's action_mask); pass "
                                 "invalid_action='persist' to play masked actions as PERSIST")
            chosen = chosen * legal  # PERSIST (0) where masked: the tree's edges play it so too
        flat = ints[:, tables.edge_row].astype(np.int64) * tree.num_joint + chosen @ self._joint_weights
        edges = np.take(tables.edges, flat, axis=0)
        outcome = edges[:, tables.outcome_width:].view(np.int32)  # the child node and whether the episode ends
        child = outcome[:, 0]
        reached = np.take(tables.node_ints, child, axis=0)
        floats = edges[:, :tables.outcome_width].reshape(len(flat), n, -1)
        if every:
            self.node = child.astype(np.int64)
            done = outcome[:, 1].astype(bool)
            self._ints = reached
            self.tokens_total += reached[:, tables.tokens]
        else:
            scattered = np.zeros((self.num_envs, n, floats.shape[-1]), np.float32)
            scattered[live] = floats
            floats = scattered
            self.node[live] = child
            done = self.ended.copy()
            done[live] = outcome[:, 1].astype(bool)
            self._ints = self._ints.copy()  # the last call's infos are views of the old array: they must not change
            self._ints[live] = reached
            self.tokens_total[live] += reached[:, tables.tokens]
        self.ended = done.copy()  # the caller's ``terminated`` must not change when reset_done() restarts episodes
        info = self._info()
        info["live"] = live
        for c, name in enumerate(tree.component_names):
            info[f"reward_{name}"] = floats[:, :, 1 + c]
        observations = self._observe(self.node) if observe else None
        return observations, floats[:, :, 0], done, np.zeros(self.num_envs, bool), info

    def sample_actions(self, rng: np.random.Generator | None = None) -> np.ndarray:
        """(B, N) uniformly random legal actions at the current nodes (an action space's ``sample(mask)``): among k
        legal actions the ``floor(k * w / 2**32)``-th, for w 32 random bits of ``rng``'s generator (so each is
        uniform to within 2**-32)."""
        rng = rng or self.rng
        tables = self._tables
        legal = self._ints[:, tables.legal]
        words = rng.bit_generator.random_raw((legal.size + 1) // 2).view(np.uint32)[:legal.size].reshape(legal.shape)
        pick = ((words * np.take(tables.legal_count, legal)) >> np.uint64(32)).view(np.int64)  # the pick-th legal one
        return np.take(tables.legal_action, legal * self.tree.num_actions + pick)

    def observe(self, nodes: np.ndarray) -> Any:
        """The observations of the given nodes, in this env's format (batched over ``nodes``' shape)."""
        return self._observe(np.asarray(nodes))

    def global_state(self) -> np.ndarray:
        """(B, N * F): every agent's feature row, as the env's ``state()`` (for centralised critics)."""
        return self.tree.rows[self.node].reshape(self.num_envs, -1)

    def node_info(self, nodes: np.ndarray) -> dict[str, np.ndarray]:
        """The info arrays (module docstring) of the given nodes, all but ``tokens_total`` (the sum along an episode's
        path, which this env keeps per row)."""
        nodes = np.asarray(nodes)
        return self._tables.info(np.take(self._tables.node_ints, nodes, axis=0), nodes)

    # ------------------------------------------------------------------ internals
    def _restart(self, rows: np.ndarray, nodes: np.ndarray) -> None:
        """Start the episodes of ``rows`` (a mask) at the root ``nodes``."""
        tables = self._tables
        started = np.take(tables.node_ints, nodes, axis=0)
        if rows.all():
            self.node, self._ints = nodes, started
            self.tokens_total = started[:, tables.tokens].astype(np.int64)
        else:
            self.node[rows] = nodes
            self._ints = self._ints.copy()  # the last call's infos are views of the old array: they must not change
            self._ints[rows] = started
            self.tokens_total[rows] = started[:, tables.tokens]
        self.ended[rows] = False

    def _info(self) -> dict[str, np.ndarray]:
        info = self._tables.info(self._ints, self.node)
        info["tokens_total"] = self.tokens_total.copy()
        return info

    def _starts(self, count: int, seed: int | None, seeds: Sequence[int] | None,
                problems: Sequence[int | None] | None) -> np.ndarray:
        tree = self.tree
        problem_count = len(tree.problem_ids)
        fixed = None
        if problems is not None:
            if len(problems) != count or any(p is not None and not 0 <= int(p) < problem_count for p in problems):
                raise ValueError(f"problems must hold {count} indices in [0, {problem_count}) (None: drawn)")
            fixed = np.array([-1 if p is None else int(p) for p in problems], np.int64)
        if seeds is not None:
            if len(seeds) != count:
                raise ValueError(f"seeds must hold one seed per episode ({count}), got {len(seeds)}")
            picked, episode_seeds = np.zeros(count, np.int64), np.zeros(count, np.int64)
            for i, one in enumerate(seeds):  # each the first episode of the env's reset(seed=one)
                drawn = episode_draws(np.random.default_rng(int(one)), 1, problem_count,
                                      None if fixed is None else fixed[i:i + 1])
                picked[i], episode_seeds[i] = drawn[0][0], drawn[1][0]
        else:
            if seed is not None:
                self.rng = np.random.default_rng(seed)  # gymnasium's seeding.np_random(seed): the env's generator
            picked, episode_seeds = episode_draws(self.rng, count, problem_count, fixed)
        streams = tree.streams  # the stream is the episode seed modulo the streams
        return np.take(self._tables.roots, picked if streams == 1 else picked * streams + episode_seeds % streams)

    def _observe(self, nodes: np.ndarray) -> Any:
        """One gather of the observation table (and one of the int8 masks), then views in the env's format."""
        tree, n, width = self.tree, self.tree.num_agents, self.tree.num_features
        gathered = np.take(self._observations, nodes, axis=0)
        if self.format.mode == "flat":
            return gathered
        mask = np.take(tree.mask, nodes, axis=0)
        if self.format.mode == "masked":
            return {self.format.observation_key: gathered, self.format.mask_key: mask}
        gathered.flags.writeable = False  # "self" and "peers" share rows: a write to one would show in the other
        lead, rows = gathered.shape[:-1], (2 * n - 1) * width
        item = gathered.itemsize
        raw = {"self": gathered[..., :n * width].reshape(*lead, n, width),
               "peers": np.lib.stride_tricks.as_strided(gathered[..., width:], (*lead, n, n - 1, width),
                                                        (*gathered.strides[:-1], width * item, width * item, item),
                                                        writeable=False),
               "agreement": gathered[..., rows:].reshape(*lead, n, n - 1), "action_mask": mask}
        return self.format.observation_batch(raw)


@dataclass(frozen=True)
class Packed:
    """What a step reads, packed per node and per edge so that a step is a few gathers (``np.take``)."""

    node_ints: np.ndarray
    """(M, K) int32: the info columns (``info``), each agent's legal actions as bits, the node's edge row."""
    edges: np.ndarray
    """(E * J, N * (1 + C) + 2) float32: per edge and joint action, each agent's reward and reward components, then
    the child node and whether the episode ends (int32, stored in the float32 columns)."""
    legal_count: np.ndarray
    """(2**A,) uint64: per set of legal actions (as bits), how many actions it holds."""
    roots: np.ndarray
    """(P * S,) int64: ``tree.roots`` flat (problem-major)."""
    legal_action: np.ndarray
    """(2**A * A,) int64: at ``bits * A + k``, the k-th legal action of set ``bits`` (0 past the last)."""
    num_agents: int

    @property
    def outcome_width(self) -> int:
        """The float columns of ``edges`` before the child and done columns."""
        return self.edges.shape[1] - 2

    @property
    def tokens(self) -> slice:
        return slice(1 + self.num_agents, 1 + 2 * self.num_agents)

    @property
    def legal(self) -> slice:
        return slice(3 + 3 * self.num_agents, 3 + 4 * self.num_agents)

    @property
    def edge_row(self) -> int:
        return 3 + 4 * self.num_agents

    def info(self, ints: np.ndarray, nodes: np.ndarray) -> dict[str, np.ndarray]:
        """The info arrays of nodes whose ``node_ints`` rows are ``ints`` (views of it, but the bools)."""
        n = self.num_agents
        return {"consensus_correct": ints[..., 0].astype(bool), "correct": ints[..., 1:1 + n].astype(bool),
                "tokens": ints[..., self.tokens], "oracle_action": ints[..., 1 + 2 * n:1 + 3 * n],
                "problem": ints[..., 1 + 3 * n], "stream": ints[..., 2 + 3 * n], "node": nodes.copy()}


_PACKED: dict[int, tuple[CompiledTree, Packed]] = {}
"""Packed arrays by tree (its id, kept with the tree so that the id is not reused): built once per tree."""
_TABLES: dict[tuple[int, str], tuple[CompiledTree, np.ndarray]] = {}


def packed_arrays(tree: CompiledTree) -> Packed:
    """The tree's ``Packed`` arrays (built on the first call for a tree, then kept)."""
    if id(tree) in _PACKED:
        return _PACKED[id(tree)][1]
    n = tree.num_agents
    legal = (tree.mask.astype(np.int64) << np.arange(tree.num_actions)).sum(-1)
    node_ints = np.concatenate([tree.consensus_correct[:, None], tree.correct, tree.tokens, tree.oracle,
                                tree.problem[:, None], tree.stream[:, None], legal, tree.expand[:, None]],
                               axis=1).astype(np.int32)
    floats = np.concatenate([tree.rewards[..., None], tree.components], axis=-1).reshape(tree.child.size, -1)
    edges = np.empty((tree.child.size, floats.shape[1] + 2), np.float32)
    edges[:, :-2] = floats
    edges[:, -2:].view(np.int32)[:] = np.stack([tree.child.reshape(-1), tree.done.reshape(-1)], axis=1)
    sets = range(2**tree.num_actions)
    legal_action = np.zeros((len(sets), tree.num_actions), np.int64)
    for bits in sets:
        actions = [a for a in range(tree.num_actions) if bits >> a & 1]
        legal_action[bits, :len(actions)] = actions
    packed = Packed(node_ints, edges, np.array([bin(bits).count("1") for bits in sets], np.uint64),
                    tree.roots.reshape(-1).astype(np.int64), legal_action.reshape(-1), n)
    if len(_PACKED) >= 8:
        _PACKED.clear()
    _PACKED[id(tree)] = (tree, packed)
    return packed


def observation_table(tree: CompiledTree, format: ObservationFormat) -> np.ndarray:
    """Per node, what ``TreeEnv._observe`` gathers for ``format`` (built once per tree and form), float32:

    - the dict form: (M, (2N-1) F + N (N-1)): the agents' rows 0..N-1 and again 0..N-2, then each agent's agreement,
      so that agent i's peers (i+1, ..., i+N-1 mod N: ``tree.peer_matrix``) are the N-1 rows after its own, a view;
    - the flat and masked forms: (M, N, D): each agent's flat observation (own row, peers' rows, agreement), and
      the mask as D's last A entries when the flat form holds it."""
    n = tree.num_agents
    if format.mode == "dict":
        form = "ring"
    else:
        form = "flat+mask" if format.mode == "flat" and format.mask_in_observation else "flat"
    if (id(tree), form) in _TABLES:
        return _TABLES[id(tree), form][1]
    count = tree.num_nodes
    if form == "ring":
        table = np.concatenate([tree.rows[:, list(range(n)) + list(range(n - 1)), :].reshape(count, -1),
                                tree.agreement.reshape(count, -1)], axis=1)
    else:
        raw = {"self": tree.rows, "peers": tree.rows[:, tree.peer_matrix, :], "agreement": tree.agreement}
        if form == "flat+mask":
            raw["action_mask"] = tree.mask
        table = raw_flat(raw, tuple(raw))
    if len(_TABLES) >= 8:
        _TABLES.clear()
    _TABLES[id(tree), form] = (tree, np.ascontiguousarray(table, np.float32))
    return _TABLES[id(tree), form][1]


def raw_flat(raw: dict[str, np.ndarray], keys: Sequence[str]) -> np.ndarray:
    """The given entries of a batched raw observation concatenated per agent (the flat form's order)."""
    lead = raw["self"].shape[:-1]
    return np.concatenate([raw[key].reshape(*lead, -1).astype(np.float32, copy=False) for key in keys], axis=-1)


# ---------------------------------------------------------------------- the env's draws
def episode_draws(rng: np.random.Generator, count: int, problem_count: int,
                  fixed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The problem indices and episode seeds of ``count`` env resets in a row on the env's generator ``rng``: each
    draws ``integers(problem_count)`` (unless ``fixed[i] >= 0`` gives the problem) and then
    ``integers(0, EPISODE_SEEDS)``, as ``DeliberationEnv.begin_episode`` does, and ``rng`` ends where the env's
    would. Without fixed problems, numpy's draws are computed from the generator's raw output at once
    (``_bulk_draws``), the same numbers checked once per process against the draws one by one."""
    if fixed is None and problem_count > 1 and count > 1 and _bulk_matches() and type(
            rng.bit_generator) is np.random.PCG64:
        drawn = _bulk_draws(rng, count, problem_count)
        if drawn is not None:
            return drawn
    return _draws_one_by_one(rng, count, problem_count, fixed)


def _draws_one_by_one(rng: np.random.Generator, count: int, problem_count: int,
                      fixed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    problems, seeds = np.zeros(count, np.int64), np.zeros(count, np.int64)
    for i in range(count):
        given = -1 if fixed is None else int(fixed[i])
        problems[i] = int(rng.integers(problem_count)) if given < 0 else given
        seeds[i] = int(rng.integers(0, EPISODE_SEEDS))
    return problems, seeds


def _bulk_draws(rng: np.random.Generator, count: int, problem_count: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``_draws_one_by_one`` computed from PCG64's raw 64-bit outputs: ``integers(0, 2**62)`` is one output shifted
    right by 2 (numpy's Lemire method rejects nothing for a power of two); ``integers(P)`` takes 32 bits, the low
    half of a fresh output and then the high half of the same (PCG64's buffered ``next_uint32``), times P, shifted
    right by 32, rejected (rarely: None is returned, the generator untouched) where the low 32 bits of that product
    fall under (2**32 - P) % P. So a pair of episodes reads three outputs: [problem halves, seed, seed]."""
    bits = rng.bit_generator
    state = bits.state
    first = int(state["has_uint32"])  # a half already buffered: the first episode's problem reads it
    rest = count - first
    outputs = bits.random_raw(3 * (rest // 2) + 2 * (rest % 2) + first)
    raw = np.zeros(first + 3 * ((rest + 1) // 2), np.uint64)
    raw[:len(outputs)] = outputs
    halves = np.empty(count, np.uint64)
    seeds = np.empty(count, np.uint64)
    if first:
        halves[0], seeds[0] = state["uinteger"], raw[0]
    triples = raw[first:].reshape(-1, 3)
    halves[first::2] = triples[:, 0] & np.uint64(0xFFFF_FFFF)
    halves[first + 1::2] = (triples[:, 0] >> np.uint64(32))[:len(halves[first + 1::2])]
    seeds[first::2] = triples[:, 1]
    seeds[first + 1::2] = triples[:, 2][:len(seeds[first + 1::2])]
    product = halves * np.uint64(problem_count)
    if ((product & np.uint64(0xFFFF_FFFF)) < (2**32 - problem_count) % problem_count).any():
        bits.state = state  # a rejected draw: numpy draws again, so the outputs shift; let the slow path do it
        return None
    after = dict(bits.state)
    if rest % 2:  # the last problem read a fresh output's low half: its high half stays buffered
        after["has_uint32"], after["uinteger"] = 1, int(triples[-1, 0] >> np.uint64(32))
    else:
        after["has_uint32"], after["uinteger"] = 0, int(halves[-1])
    bits.state = after
    return (product >> np.uint64(32)).view(np.int64), (seeds >> np.uint64(2)).view(np.int64)  # both < 2**62


@functools.cache
def _bulk_matches() -> bool:
    """Whether ``_bulk_draws`` gives this numpy's draws (checked once per process on a few streams)."""
    for seed, problem_count, skip in ((0, 400, 0), (1, 7, 1), (2, 608, 2), (3, 2**20 + 3, 1)):
        one, bulk = np.random.default_rng(seed), np.random.default_rng(seed)
        for _ in range(skip):
            one.integers(problem_count), bulk.integers(problem_count)
        expected, got = _draws_one_by_one(one, 9, problem_count, None), _bulk_draws(bulk, 9, problem_count)
        if got is None or not all(np.array_equal(a, b) for a, b in zip(expected, got)) or \
                one.integers(2**40) != bulk.integers(2**40) or one.integers(problem_count) != bulk.integers(problem_count):
            return False
    return True
