"""A replay set's game compiled into arrays: every reachable state, every joint action's outcome.

A replay set is a finite game: for each recorded problem and stream, every joint meta-action sequence has one
recorded outcome. ``compile_tree`` plays all of them once through the reference env (``replay_env``, driven by
the one episode runner ``deliberation_env.vector.run_episodes``) and keeps what each state shows and what each
joint action does, as arrays:

| array               | shape            | what                                                                  |
|---------------------|------------------|-----------------------------------------------------------------------|
| ``rows``            | (M, N, F) f32    | each agent's feature row at node m (its ``obs["self"]``)              |
| ``agreement``       | (M, N, N-1) f32  | ``obs["agreement"]``: 1 where that peer holds the agent's answer     |
| ``mask``            | (M, N, A) int8   | ``obs["action_mask"]``                                                |
| ``oracle``          | (M, N) int8      | ``infos["oracle_action"]`` (privileged: SFT's labels)                 |
| ``correct``         | (M, N) bool      | ``infos["correct"]`` (privileged)                                     |
| ``consensus_correct`` | (M,) bool      | whether the team's answer at node m is right (privileged)            |
| ``tokens``          | (M, N) int32     | ``infos["tokens"]``: what each agent spent on the step into node m    |
| ``problem``, ``stream``, ``depth`` | (M,) | where node m sits                                                |
| ``roots``           | (P, S) int32     | the node after ``reset`` of problem p on stream s                     |
| ``expand``          | (M,) int32       | node m's row in the edge arrays, -1 where the episode has ended       |
| ``child``           | (E, J) int32     | the node a joint action leads to (J = A ** N, ``itertools.product``   |
|                     |                  | order: agent 0's action is the most significant digit)                |
| ``done``            | (E, J) bool      | the episode ends with that step                                       |
| ``rewards``         | (E, J, N) f32    | each agent's reward (the env's weights)                               |
| ``components``      | (E, J, N, C) f32 | each reward component (``component_names``)                           |

Node 0..P*S-1 are the roots. A masked action is played as PERSIST (the env's ``invalid_action="persist"``), so
every joint action has an edge; ``engine.batch.TreeEnv`` refuses masked actions unless asked to play them so.

Compiling is cached on disk (``cache_dir()``), keyed by the set's name and checksums, the split, the game's
settings, this module's format and a hash of the source code that decides outcomes and observations (the core,
the tasks, the env, the replay backend): a change to any of them compiles afresh. Loading from the cache also
replays a few episodes through the env and compares them (``verify``), so a stale tree is never used.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from deliberation_env.core import features
from deliberation_env.core.rewards import REWARD_COMPONENTS
from deliberation_env.vector import Start, Step, run_episodes

log = logging.getLogger(__name__)

TREE_FORMAT = 1
"""The layout of the arrays above; bump it when it changes (old caches are then compiled afresh)."""
GAME_ONLY = {"observation": "dict", "action_mask": "observation", "infos": "full", "invalid_action": "persist"}
"""The reference env's format while compiling (the game does not depend on it; ``TreeEnv`` formats its own)."""
FORMAT_KEYWORDS = ("observation", "action_mask", "action_mask_key", "observation_key", "infos", "invalid_action",
                   "trace", "trace_label", "render_mode")
"""Env keywords that change how a game is shown, not the game: left out of the compiled tree and its key."""
_SOURCE_DIRS = ("core", "tasks", "replay", "backends")
_SOURCE_FILES = ("env.py", "formats.py", "options.py", "make.py", "engine/tree.py")


@dataclass
class CompiledTree:
    """A replay set's game on one split as arrays (the module docstring's table)."""

    name: str
    split: str
    problem_ids: list[str]
    num_agents: int
    num_actions: int
    max_rounds: int
    feature_names: list[str]
    component_names: list[str]
    settings: dict[str, Any]
    """The game: the env's ``DeliberationConfig`` as plain data (after the set's binding)."""
    key: str
    """The cache key it was compiled under."""
    rows: np.ndarray
    agreement: np.ndarray
    mask: np.ndarray
    oracle: np.ndarray
    correct: np.ndarray
    consensus_correct: np.ndarray
    tokens: np.ndarray
    problem: np.ndarray
    stream: np.ndarray
    depth: np.ndarray
    roots: np.ndarray
    expand: np.ndarray
    child: np.ndarray
    done: np.ndarray
    rewards: np.ndarray
    components: np.ndarray

    @property
    def num_nodes(self) -> int:
        return len(self.rows)

    @property
    def num_joint(self) -> int:
        """J = A ** N joint actions."""
        return self.num_actions ** self.num_agents

    @property
    def num_features(self) -> int:
        return len(self.feature_names)

    @property
    def streams(self) -> int:
        return self.roots.shape[1]

    @property
    def peer_matrix(self) -> np.ndarray:
        """(N, N-1): agent i's peers in observation order i+1, i+2, ... (mod N)."""
        n = self.num_agents
        return np.array([[(i + k) % n for k in range(1, n)] for i in range(n)], dtype=np.intp).reshape(n, n - 1)

    def joint_index(self, actions: np.ndarray) -> np.ndarray:
        """(..., N) actions -> (...,) joint action indices (agent 0 the most significant digit)."""
        weights = self.num_actions ** np.arange(self.num_agents - 1, -1, -1)
        return np.asarray(actions, dtype=np.int64) @ weights

    def joint_actions(self) -> np.ndarray:
        """(J, N): the joint actions in index order."""
        return np.array(list(itertools.product(range(self.num_actions), repeat=self.num_agents)), dtype=np.int64)

    # ------------------------------------------------------------------ saving
    def save(self, path: str | os.PathLike[str]) -> None:
        """One ``.npz`` (arrays) with the scalars as JSON; written to a temporary name, then renamed."""
        arrays = {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), np.ndarray)}
        meta = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in arrays}
        buffer = io.BytesIO()
        np.savez(buffer, meta=np.array(json.dumps({"format": TREE_FORMAT, **meta})), **arrays)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + f".{os.getpid()}.tmp")
        partial.write_bytes(buffer.getvalue())
        partial.replace(path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CompiledTree:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            if meta.pop("format", None) != TREE_FORMAT:
                raise ValueError(f"{path} holds a compiled tree of another format; compile it again")
            return cls(**meta, **{name: data[name] for name in data.files if name != "meta"})


def cache_dir() -> Path:
    """Where compiled trees are kept: ``trees/`` in the package's cache folder (``$DELIBERATION_ENV_CACHE``, else
    ``$XDG_CACHE_HOME/deliberation_env``, else ``~/.cache/deliberation_env``: ``tasks.hub.cache_dir``)."""
    from deliberation_env.tasks.hub import cache_dir as package_cache

    return package_cache() / "trees"


def code_fingerprint() -> str:
    """A hash of the source that decides a game's outcomes and observations (see the module docstring), as it was
    when this process loaded it: a process running older code never keys its trees as the files' newer code."""
    return _FINGERPRINT


def _source_fingerprint() -> str:
    package = Path(__file__).resolve().parent.parent
    paths = [p for d in _SOURCE_DIRS for p in sorted((package / d).glob("*.py"))]
    paths += [package / name for name in _SOURCE_FILES]
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.relative_to(package).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


_FINGERPRINT = _source_fingerprint()


def game_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The env keywords that define the game (``FORMAT_KEYWORDS`` left out)."""
    return {name: value for name, value in options.items() if name not in FORMAT_KEYWORDS}


def tree_key(dataset: Any, split: str, options: Mapping[str, Any]) -> str:
    """The cache key of a set's game on a split (module docstring)."""
    card = dataset.card
    files = {name: entry.get("sha256") for name, entry in sorted(card.files.items())}
    payload = json.dumps({"tree": TREE_FORMAT, "set": card.name, "files": files, "split": split,
                          "options": game_options(options), "code": code_fingerprint()},
                         sort_keys=True, default=repr)
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def reference_env(dataset: Any, split: str, options: Mapping[str, Any]) -> Any:
    """The PettingZoo env whose game a tree compiles: ``replay_env`` with the game's options and ``GAME_ONLY``."""
    from deliberation_env.make import replay_env  # the factory sits above the engine's callers, not the core

    return replay_env(dataset, split, **{**game_options(options), **GAME_ONLY})


def compile_tree(dataset: Any, split: str, *, problems: Sequence[int] | None = None, cache: bool = True,
                 verify_episodes: int = 8, **options: Any) -> CompiledTree:
    """The game of replay set ``dataset`` (a name, folder or ``ReplaySet``) on ``split`` with env ``options``
    (``features``, ``concede_to_peer``, ``confidence``, ``max_rounds``, ``reward_weights``, ...), from the cache
    when it holds it (checked by replaying ``verify_episodes`` episodes; a stale one is compiled again), else
    compiled and cached. ``problems``: indices into the split's problems to compile only those (for checks: the
    tree's episodes then draw among them, not among the split's)."""
    from deliberation_env.replay.dataset import ReplaySet

    replay = dataset if isinstance(dataset, ReplaySet) else ReplaySet(dataset)
    subset = None if problems is None else sorted({int(p) for p in problems})
    key = tree_key(replay, split, {**options, "problems": subset})
    path = cache_dir() / f"{replay.card.name}-{split}-{key}.npz"
    env = reference_env(replay, split, options)
    if cache and path.exists():
        try:
            tree = CompiledTree.load(path)
            if tree.key != key:
                raise StaleTree(f"{path} was compiled under another key")
            verify(tree, env, verify_episodes)
            return tree
        except (OSError, ValueError, KeyError, StaleTree) as error:
            log.warning("compiling %s/%s again: %s", replay.card.name, split, error)
    chosen = list(range(len(env.problems))) if subset is None else subset
    if chosen and not 0 <= chosen[0] <= chosen[-1] < len(env.problems):
        raise ValueError(f"problems must be indices in [0, {len(env.problems)}) of split {split!r}")
    tree = _compile(env, [env.problems[i] for i in chosen], replay.card.name, split, key)
    if cache:
        tree.save(path)
    return tree


class StaleTree(ValueError):
    """A compiled tree that no longer matches what the env plays."""


def verify(tree: CompiledTree, env: Any, episodes: int, seed: int = 0) -> None:
    """Replay ``episodes`` random joint-action sequences on ``env`` (the tree's reference env) and compare every
    observation, mask, reward and token count with the tree; ``StaleTree`` names the first difference."""
    rng = np.random.default_rng(seed)
    joints = tree.joint_actions()
    by_id = {problem.id: problem for problem in env.problems}
    missing = [problem for problem in tree.problem_ids if problem not in by_id]
    if missing:
        raise StaleTree(f"compiled tree {tree.name}/{tree.split} holds problem {missing[0]!r}, which the set no "
                        "longer has")
    picks = [(int(rng.integers(len(tree.problem_ids))), int(rng.integers(tree.streams))) for _ in range(episodes)]
    nodes = [int(tree.roots[p, s]) for p, s in picks]

    def act(steps: list[Step]) -> list[dict[str, int]]:
        return [dict(zip(env.possible_agents, joints[int(rng.integers(tree.num_joint))].tolist())) for _ in steps]

    def on_step(step: Step) -> None:
        where = "reset"
        if step.actions is not None:
            j = int(tree.joint_index(np.array([step.actions[a] for a in env.possible_agents])))
            edge, where = int(tree.expand[nodes[step.episode]]), f"joint action {j}"
            nodes[step.episode] = int(tree.child[edge, j])
            if not np.allclose([step.rewards[a] for a in env.possible_agents], tree.rewards[edge, j], atol=1e-6):
                raise StaleTree(f"compiled tree {tree.name}/{tree.split} is stale: the rewards of {where} differ")
            if step.done != bool(tree.done[edge, j]):
                raise StaleTree(f"compiled tree {tree.name}/{tree.split} is stale: termination differs")
        _compare(tree, nodes[step.episode], step.observations, step.infos, where)

    run_episodes([env], [Start(seed=s, problem=by_id[tree.problem_ids[p]]) for p, s in picks], act, on_step)


def _compare(tree: CompiledTree, node: int, observations: Mapping[str, Any], infos: Mapping[str, Any],
             where: str) -> None:
    for i, agent in enumerate(observations):
        obs = observations[agent]
        same = (np.array_equal(obs["self"], tree.rows[node, i]) and np.array_equal(obs["action_mask"], tree.mask[node, i])
                and np.array_equal(obs["agreement"], tree.agreement[node, i])
                and infos[agent]["tokens"] == tree.tokens[node, i])
        if not same:
            raise StaleTree(f"compiled tree {tree.name}/{tree.split} is stale: agent {i}'s observation after {where} "
                            "differs from the env's; it is compiled again on the next compile_tree()")


def _compile(env: Any, problems: list[Any], name: str, split: str, key: str) -> CompiledTree:
    """Play every joint action sequence of every problem (of ``env``'s) and stream on ``env`` (the module
    docstring), level by level: the states after d rounds are expanded by the episodes that replay their history
    and then play each joint action (and PERSIST after it, to the episode's end, where more rounds remain)."""
    config, agents = env.config, env.possible_agents
    n, a, streams = config.num_agents, env.action_space(agents[0]).n, config.streams or 1
    joints = [tuple(j) for j in itertools.product(range(a), repeat=n)]
    components = list(REWARD_COMPONENTS)
    nodes: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    expand: list[int] = []
    roots = np.full((len(problems), streams), -1, np.int32)

    def add_node(step: Step, problem: int, stream: int, depth: int) -> int:
        observations, infos = step.observations, step.infos
        nodes.append({"rows": [observations[x]["self"] for x in agents],
                      "agreement": [observations[x]["agreement"] for x in agents],
                      "mask": [observations[x]["action_mask"] for x in agents],
                      "oracle": [infos[x]["oracle_action"] for x in agents],
                      "correct": [infos[x]["correct"] for x in agents],
                      "consensus_correct": infos[agents[0]]["consensus_correct"],
                      "tokens": [infos[x]["tokens"] for x in agents],
                      "problem": problem, "stream": stream, "depth": depth})
        expand.append(-1)
        return len(nodes) - 1

    def open_edges(node: int) -> None:
        expand[node] = len(edges)
        edges.append({"child": [0] * len(joints), "done": [False] * len(joints),
                      "rewards": [[0.0] * n for _ in joints], "components": [[[0.0] * len(components)] * n for _ in joints]})

    def play(level: list[tuple[int, int, int, tuple[int, ...]]]) -> list[tuple[int, int, int, tuple[int, ...]]]:
        """Play each (problem, stream, parent node or -1 for a root not yet seen, joint-action history); record the
        node each history's last joint action reaches; return the plays of the next level."""
        found: list[tuple[int, int, int, tuple[int, ...]]] = []
        played = [0] * len(level)

        def act(steps: list[Step]) -> list[dict[str, int]]:
            moves = []
            for step in steps:
                history, depth = level[step.episode][3], played[step.episode]
                moves.append(dict(zip(agents, joints[history[depth]] if depth < len(history) else joints[0])))
            return moves

        def on_step(step: Step) -> None:
            p, s, parent, history = level[step.episode]
            if step.actions is None:
                if parent < 0 and roots[p, s] < 0:  # the first play of a root's children records the root
                    roots[p, s] = add_node(step, p, s, 0)
                    open_edges(int(roots[p, s]))
                return
            played[step.episode] += 1
            if played[step.episode] != len(history):
                return  # the replayed prefix, or the PERSIST steps after the joint action that was expanded
            parent = int(roots[p, s]) if parent < 0 else parent
            edge, j = edges[expand[parent]], history[-1]
            child = add_node(step, p, s, len(history))
            edge["child"][j], edge["done"][j] = child, step.done
            edge["rewards"][j] = [float(step.rewards[x]) for x in agents]
            edge["components"][j] = [[step.infos[x][f"reward_{c}"] for c in components] for x in agents]
            if not step.done:
                open_edges(child)
                found.extend((p, s, child, history + (k,)) for k in range(len(joints)))

        # the episode seed s plays stream s (``DeliberationConfig.streams``: seed % streams)
        run_episodes([env], [Start(seed=s, problem=problems[p]) for p, s, _, _ in level], act, on_step)
        return found

    level: list[tuple[int, int, int, tuple[int, ...]]] = [(p, s, -1, (j,)) for p in range(len(problems)) for s in range(streams) for j in range(len(joints))]
    while level:
        level = play(level)

    return _packed(nodes, edges, roots, expand, name=name, split=split, problem_ids=[p.id for p in problems],
                   config=config, key=key, num_actions=int(a), components=components)


def _packed(nodes: list[dict[str, Any]], edges: list[dict[str, Any]], roots: np.ndarray, expand: list[int], *,
            name: str, split: str, problem_ids: list[str], config: Any, key: str, num_actions: int,
            components: list[str]) -> CompiledTree:
    """The compiled game as arrays: the nodes' and the edges' fields stacked (one edge row per expanded node, one
    column per joint action)."""
    n, joints = config.num_agents, num_actions ** config.num_agents

    def stack(field: str, dtype: Any) -> np.ndarray:
        return np.asarray([node[field] for node in nodes], dtype=dtype)

    def edge_stack(field: str, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
        return np.asarray([edge[field] for edge in edges], dtype=dtype).reshape(len(edges), *shape)

    return CompiledTree(
        name=name, split=split, problem_ids=problem_ids, num_agents=n, num_actions=num_actions,
        max_rounds=config.max_rounds, feature_names=list(features.feature_names(config.features)),
        component_names=components, settings=_plain(asdict(config)), key=key,
        rows=stack("rows", np.float32), agreement=stack("agreement", np.float32).reshape(len(nodes), n, n - 1),
        mask=stack("mask", np.int8), oracle=stack("oracle", np.int8), correct=stack("correct", bool),
        consensus_correct=stack("consensus_correct", bool), tokens=stack("tokens", np.int32),
        problem=stack("problem", np.int32), stream=stack("stream", np.int32), depth=stack("depth", np.int8),
        roots=roots, expand=np.asarray(expand, np.int32), child=edge_stack("child", np.int32, (joints,)),
        done=edge_stack("done", bool, (joints,)), rewards=edge_stack("rewards", np.float32, (joints, n)),
        components=edge_stack("components", np.float32, (joints, n, len(components))),
    )


def _plain(value: Any) -> Any:
    """JSON-able data (tuples as lists, dataclasses and odd objects by repr)."""
    return json.loads(json.dumps(value, default=repr))
