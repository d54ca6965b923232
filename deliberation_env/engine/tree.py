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
every joint action has an edge; ``engine.batch.TreeEnv`` refuses masked actions unless asked to play them so. Joint
actions that play alike share one child, and ended states equal in every array are one node (``engine.walk``): the
arrays form a DAG, and a node may have several parents.

Compiling is cached on disk (``cache_dir()``), keyed by the set's name and checksums, the split, the game (the
reference env's whole ``DeliberationConfig``), this module's format and a hash of the source that decides outcomes
and observations (``source_files``: the env, the core, tasks, backends, replay and the runner, with what they import):
a change to any of them compiles afresh. Loading from the cache checks the arrays against the digest saved with them
and replays episodes drawn afresh through the env, comparing everything stored of them (``verify``), so a stale or
altered tree is never used.
"""

from __future__ import annotations

import ast
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
from deliberation_env.engine.walk import walk
from deliberation_env.options import PRESENTATION_KEYWORDS
from deliberation_env.vector import Start, Step, run_episodes

log = logging.getLogger(__name__)

TREE_FORMAT = 2
"""The layout of the arrays above; bump it when it changes (old caches are then compiled afresh). 2: equal moves share
their child and equal ended states are one node (a DAG); the arrays' digest is saved with them."""
GAME_ONLY = {"observation": "dict", "action_mask": "observation", "infos": "full", "invalid_action": "persist"}
"""The reference env's format while compiling (the game does not depend on it; ``TreeEnv`` formats its own)."""
_SOURCE_ROOTS = ("make.py", "engine/tree.py", "engine/walk.py", "core", "tasks", "replay")
"""Where ``source_files`` starts: the reference env's factory, the compiler, the core, the tasks (the env finds them
by name) and the replay backend (the only backend a compiled game runs)."""


class StaleTree(ValueError):
    """A compiled tree that no longer matches what the env plays."""


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
    def arrays(self) -> dict[str, np.ndarray]:
        """Every array field, by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), np.ndarray)}

    def digest(self) -> str:
        """A hash of every array (name, dtype, shape, bytes): written with the tree, checked when it is loaded."""
        digest = hashlib.sha256()
        for name, array in sorted(self.arrays().items()):
            digest.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
            digest.update(np.ascontiguousarray(array).tobytes())
        return digest.hexdigest()

    def save(self, path: str | os.PathLike[str]) -> None:
        """One ``.npz`` (arrays) with the scalars and the arrays' ``digest`` as JSON; written to a temporary name,
        then renamed."""
        arrays = self.arrays()
        meta = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in arrays}
        buffer = io.BytesIO()
        payload: dict[str, Any] = {"meta": np.array(json.dumps({"format": TREE_FORMAT, "digest": self.digest(), **meta})),
                                   **arrays}
        np.savez(buffer, **payload)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + f".{os.getpid()}.tmp")
        partial.write_bytes(buffer.getvalue())
        partial.replace(path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CompiledTree:
        """A saved tree; ``StaleTree`` if its arrays are not the ones it was saved with (a changed file)."""
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            if meta.pop("format", None) != TREE_FORMAT:
                raise ValueError(f"{path} holds a compiled tree of another format; compile it again")
            written = meta.pop("digest", None)
            tree = cls(**meta, **{name: data[name] for name in data.files if name != "meta"})
        if tree.digest() != written:
            raise StaleTree(f"{path}'s arrays are not the ones it was compiled with (the file was changed)")
        return tree


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
    digest = hashlib.sha256()
    for path in source_files():
        digest.update(path.relative_to(package).as_posix().encode())
        digest.update(code_of(path.read_text(encoding="utf-8")).encode())
    return digest.hexdigest()[:16]


def code_of(source: str) -> str:
    """A module's code as its syntax tree, docstrings left out: what a comment, a docstring or the layout of a line
    changes is not part of it (so editing documentation does not make every cached tree stale)."""
    module = ast.parse(source)
    for node in ast.walk(module):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(module)


def source_files() -> list[Path]:
    """Every module of the package that the compiler and its reference env import (``_SOURCE_ROOTS`` and, read off
    their source, what they import, transitively): the code that decides a compiled game's outcomes and observations."""
    package = Path(__file__).resolve().parent.parent
    seen: set[Path] = set()
    todo = [path for root in _SOURCE_ROOTS for path in
            (sorted((package / root).glob("*.py")) if (package / root).is_dir() else [package / root])]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
                [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)] \
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
            for name in names:
                if name.split(".")[0] == package.name:
                    todo.extend(_module_paths(package, name.split(".")[1:]))
    return sorted(seen)


def _module_paths(package: Path, parts: list[str]) -> list[Path]:
    """The files of module ``package.<parts>``: a module file, or a package's ``__init__.py``."""
    base = package.joinpath(*parts)
    if base.with_suffix(".py").is_file():
        return [base.with_suffix(".py")]
    return [base / "__init__.py"] if (base / "__init__.py").is_file() else []


_FINGERPRINT = _source_fingerprint()


def game_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The env keywords that define the game (``PRESENTATION_KEYWORDS`` left out)."""
    return {name: value for name, value in options.items() if name not in PRESENTATION_KEYWORDS}


def tree_key(dataset: Any, split: str, config: Any, problems: Sequence[int] | None = None) -> str:
    """The cache key of a set's game on a split (module docstring): the game is the reference env's whole
    ``DeliberationConfig`` (so ``{}``, ``features="v1"`` and ``concede_to_peer=False`` key one game), ``problems`` the
    compiled subset (None: the split's every problem)."""
    card = dataset.card
    files = {name: entry.get("sha256") for name, entry in sorted(card.files.items())}
    payload = json.dumps({"tree": TREE_FORMAT, "set": card.name, "files": files, "split": split,
                          "game": _plain(asdict(config)), "problems": problems, "code": code_fingerprint()},
                         sort_keys=True, default=repr)
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def reference_env(dataset: Any, split: str, options: Mapping[str, Any]) -> Any:
    """The PettingZoo env whose game a tree compiles: ``replay_env`` with the game's options and ``GAME_ONLY``."""
    from deliberation_env.make import replay_env  # the factory sits above the engine's callers, not the core

    return replay_env(dataset, split, **{**game_options(options), **GAME_ONLY})


def compile_tree(dataset: Any, split: str, *, problems: Sequence[int] | None = None, cache: bool = True,
                 verify_episodes: int = 16, **options: Any) -> CompiledTree:
    """The game of replay set ``dataset`` (a name, folder or ``ReplaySet``) on ``split`` with env ``options``
    (``features``, ``concede_to_peer``, ``confidence``, ``max_rounds``, ``refine_rounds``, ``reward_weights``, ...),
    from the cache when it holds it (checked: its arrays against the digest written with them, and
    ``verify_episodes`` episodes drawn afresh replayed through the env; a stale one is compiled again), else compiled
    and cached. ``problems``: indices into the split's problems to compile only those (for checks: the tree's
    episodes then draw among them, not among the split's)."""
    from deliberation_env.replay.dataset import ReplaySet, loaded

    replay = dataset if isinstance(dataset, ReplaySet) else loaded(str(dataset))
    subset = None if problems is None else sorted({int(p) for p in problems})
    env = reference_env(replay, split, options)
    key = tree_key(replay, split, env.config, subset)
    path = cache_dir() / f"{replay.card.name}-{split}-{key}.npz"
    if cache and path.exists():
        try:
            tree = CompiledTree.load(path)
            if tree.key != key:
                raise StaleTree(f"{path} was compiled under another key")
            verify(tree, env, verify_episodes, seed=None)
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


def verify(tree: CompiledTree, env: Any, episodes: int, seed: int | None = 0) -> None:
    """Replay ``episodes`` random joint-action sequences on ``env`` (the tree's reference env) and compare everything
    the tree stores of them (``verify_plays``). ``seed``: of the draws (None: fresh ones each call)."""
    rng = np.random.default_rng(seed)
    plays = [(int(rng.integers(len(tree.problem_ids))), int(rng.integers(tree.streams)),
              [int(j) for j in rng.integers(tree.num_joint, size=tree.max_rounds)]) for _ in range(episodes)]
    verify_plays(tree, env, plays)


def verify_plays(tree: CompiledTree, env: Any, plays: Sequence[tuple[int, int, Sequence[int]]]) -> int:
    """Play each (problem index into the tree, stream, joint action indices) on ``env`` (the tree's reference env;
    PERSIST after the sequence ends, if the episode goes on) and compare every observation, mask, label, consensus,
    token count, reward, reward component and termination with the tree; ``StaleTree`` names the first difference.
    Returns the number of steps compared."""
    joints = tree.joint_actions()
    by_id = {problem.id: problem for problem in env.problems}
    missing = [problem for problem in tree.problem_ids if problem not in by_id]
    if missing:
        raise StaleTree(f"compiled tree {tree.name}/{tree.split} holds problem {missing[0]!r}, which the set no "
                        "longer has")
    nodes = [int(tree.roots[p, s]) for p, s, _ in plays]
    moves = [0] * len(plays)
    agents = env.possible_agents

    def act(steps: list[Step]) -> list[dict[str, int]]:
        out = []
        for step in steps:
            sequence, made = plays[step.episode][2], moves[step.episode]
            out.append(dict(zip(agents, joints[sequence[made] if made < len(sequence) else 0].tolist())))
        return out

    def on_step(step: Step) -> None:
        where = "reset"
        if step.actions is not None:
            moves[step.episode] += 1
            j = int(tree.joint_index(np.array([step.actions[a] for a in agents])))
            edge, where = int(tree.expand[nodes[step.episode]]), f"joint action {j}"
            nodes[step.episode] = int(tree.child[edge, j])
            components = [[step.infos[a][f"reward_{c}"] for c in tree.component_names] for a in agents]
            if not (np.allclose([step.rewards[a] for a in agents], tree.rewards[edge, j], atol=1e-6)
                    and np.allclose(components, tree.components[edge, j], atol=1e-6)):
                raise StaleTree(f"compiled tree {tree.name}/{tree.split} is stale: the rewards of {where} differ")
            if step.done != bool(tree.done[edge, j]):
                raise StaleTree(f"compiled tree {tree.name}/{tree.split} is stale: termination differs")
        _compare(tree, nodes[step.episode], step.observations, step.infos, where)

    run_episodes([env], [Start(seed=s, problem=by_id[tree.problem_ids[p]]) for p, s, _ in plays], act, on_step)
    return sum(moves) + len(plays)


def _compare(tree: CompiledTree, node: int, observations: Mapping[str, Any], infos: Mapping[str, Any],
             where: str) -> None:
    for i, agent in enumerate(observations):
        obs, info = observations[agent], infos[agent]
        same = (np.array_equal(obs["self"], tree.rows[node, i]) and np.array_equal(obs["action_mask"], tree.mask[node, i])
                and np.array_equal(obs["agreement"], tree.agreement[node, i])
                and info["tokens"] == tree.tokens[node, i] and info["oracle_action"] == tree.oracle[node, i]
                and info["correct"] == tree.correct[node, i]
                and info["consensus_correct"] == tree.consensus_correct[node])
        if not same:
            raise StaleTree(f"compiled tree {tree.name}/{tree.split} is stale: agent {i}'s observation or labels after "
                            f"{where} differ from the env's; it is compiled again on the next compile_tree()")


def _compile(env: Any, problems: list[Any], name: str, split: str, key: str) -> CompiledTree:
    """Every reachable state of ``problems`` on ``env`` (``engine.walk``), as arrays."""
    found, roots = walk(env, problems, env.config.streams or 1)
    config, nodes = env.config, found.nodes
    n, joints = config.num_agents, len(found.joints)

    def stack(name: str, dtype: Any) -> np.ndarray:
        return np.asarray([node[name] for node in nodes], dtype=dtype)

    def edges(arrays: list[np.ndarray], dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
        return np.asarray(arrays, dtype=dtype).reshape(len(arrays), *shape)

    log.info("compiled %s/%s: %d nodes from %d episodes", name, split, len(nodes), found.played)
    return CompiledTree(
        name=name, split=split, problem_ids=[p.id for p in problems], num_agents=n,
        num_actions=found.actions, max_rounds=config.max_rounds,
        feature_names=list(features.feature_names(config.features)), component_names=list(REWARD_COMPONENTS),
        settings=_plain(asdict(config)), key=key,
        rows=stack("rows", np.float32), agreement=stack("agreement", np.float32).reshape(len(nodes), n, n - 1),
        mask=stack("mask", np.int8), oracle=stack("oracle", np.int8), correct=stack("correct", bool),
        consensus_correct=stack("consensus_correct", bool), tokens=stack("tokens", np.int32),
        problem=stack("problem", np.int32), stream=stack("stream", np.int32), depth=stack("depth", np.int8),
        roots=roots, expand=np.asarray(found.expand, np.int32), child=edges(found.child, np.int32, (joints,)),
        done=edges(found.done, bool, (joints,)), rewards=edges(found.rewards, np.float32, (joints, n)),
        components=edges(found.components, np.float32, (joints, n, len(REWARD_COMPONENTS))),
    )


def _plain(value: Any) -> Any:
    """JSON-able data (tuples as lists, dataclasses and odd objects by repr)."""
    return json.loads(json.dumps(value, default=repr))
