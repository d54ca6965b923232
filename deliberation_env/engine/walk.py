"""The compiler's walk: every distinct move of every reachable state of a replay set's game, played once.

``engine.tree.compile_tree`` hands it the reference env (``replay_env`` with the game's options) and the problems to
compile. The walk goes level by level (the states after d rounds): it plays each history through the env with the one
episode runner (``deliberation_env.vector.run_episodes``), records the state each history's last joint action reaches,
and expands that state by its *distinct* joint actions. Two joint actions are the same move where each agent's action
is, as the env plays it:

- a masked action is PERSIST (the env's ``invalid_action="persist"``: a REFINE in a round past ``refine_rounds``, a
  CONCEDE with no peer to adopt, a CONCEDE to a peer who holds the same answer);
- CONCEDE (the rule's target) is CONCEDE to that target by name, where the game names peers (``concede_to_peer``):
  the core adopts the same peer's answer either way.

Only one joint action of each such class is played; every joint action's edge points to its class's outcome, so the
arrays still hold all ``A ** N`` edges of every expanded node. Ended states that are equal in every stored array are
kept once (the compiled game is then a DAG, not a tree: a node can have several parents). ``tests/test_engine.py``
plays every joint-action sequence of sampled problems through the env and compares it with the compiled arrays.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from deliberation_env.core.actions import FIRST_PEER_ACTION, Action
from deliberation_env.core.rewards import REWARD_COMPONENTS
from deliberation_env.tasks.base import Problem
from deliberation_env.vector import Start, Step, run_episodes

NODE_FIELDS = ("rows", "agreement", "mask", "oracle", "correct", "consensus_correct", "tokens", "problem", "stream",
               "depth")
"""What the walk records of a state (``CompiledTree``'s node arrays)."""


@dataclass(frozen=True)
class Play:
    """One episode of the walk: a problem and stream, the node its history leaves (None: the root, recorded at
    reset) and the joint actions (indices) to play; after them the episode PERSISTs to its end, unrecorded."""

    problem: int
    stream: int
    parent: int | None
    history: tuple[int, ...]


@dataclass
class Walk:
    """What the walk has found: nodes (each a dict of ``NODE_FIELDS``), and per expanded node its edge row."""

    agents: list[str]
    actions: int
    """Actions per agent (A)."""
    joints: np.ndarray
    """(J, N): every joint action, in index order."""
    nodes: list[dict[str, Any]] = field(default_factory=list)
    targets: list[list[int | None]] = field(default_factory=list)
    """Per node, each agent's concede target under the rule (a peer index, or None): to name it, not stored."""
    expand: list[int] = field(default_factory=list)
    child: list[np.ndarray] = field(default_factory=list)
    done: list[np.ndarray] = field(default_factory=list)
    rewards: list[np.ndarray] = field(default_factory=list)
    components: list[np.ndarray] = field(default_factory=list)
    ended: dict[bytes, int] = field(default_factory=dict)
    """Ended nodes by their stored arrays: an equal one reached again is the same node."""
    classes: dict[int, np.ndarray] = field(default_factory=dict)
    """Per expanded node, ``canonical``'s class of each joint action (kept while its children are played)."""
    played: int = 0
    """How many episodes the walk played (the compiler's cost)."""


def walk(env: Any, problems: Sequence[Problem], streams: int) -> tuple[Walk, np.ndarray]:
    """Every reachable node of ``problems`` x ``streams`` on ``env``, and the roots: (P, S) node indices."""
    agents = list(env.possible_agents)
    actions = int(env.action_space(agents[0]).n)
    found = Walk(agents, actions, np.array(list(itertools.product(range(actions), repeat=len(agents))), dtype=np.int64))
    roots = np.full((len(problems), streams), -1, np.int32)
    level = [Play(p, s, None, ()) for p in range(len(problems)) for s in range(streams)]
    while level:
        reached = _play_level(env, problems, found, level, roots)
        found.classes.clear()  # this level's parents are filled in
        level = [Play(play.problem, play.stream, node, play.history + (joint,))
                 for play, node in reached for joint in _expansions(found, node)]
    return found, roots


def _play_level(env: Any, problems: Sequence[Problem], found: Walk, level: list[Play],
                roots: np.ndarray) -> list[tuple[Play, int]]:
    """Play each of ``level``'s histories; record the node its last joint action reaches (and that joint action's
    edge in its parent's row); return the (play, node) pairs whose node goes on (has an edge row to fill)."""
    moves = [0] * len(level)
    reached: list[tuple[Play, int]] = []
    persist = {agent: int(Action.PERSIST) for agent in found.agents}

    def act(steps: list[Step]) -> list[dict[str, int]]:
        out = []
        for step in steps:
            play, made = level[step.episode], moves[step.episode]
            joint = found.joints[play.history[made]] if made < len(play.history) else None
            out.append(persist if joint is None else dict(zip(found.agents, joint.tolist())))
        return out

    def on_step(step: Step) -> None:
        play = level[step.episode]
        if step.actions is not None:
            moves[step.episode] += 1
        if moves[step.episode] != len(play.history) or (step.actions is None) != (not play.history):
            return  # the replayed prefix, or the PERSIST steps after the recorded one
        node = _record(found, step, play)
        if play.parent is None:
            roots[play.problem, play.stream] = node
        else:
            _fill_edge(found, play.parent, play.history[-1], node, step)
        if not step.done:
            reached.append((play, node))

    run_episodes([env], [Start(seed=play.stream, problem=problems[play.problem]) for play in level], act, on_step)
    found.played += len(level)
    return reached


def _record(found: Walk, step: Step, play: Play) -> int:
    """The node of the state ``step`` shows (an ended one already seen: that node)."""
    observations, infos, agents = step.observations, step.infos, found.agents
    node = {"rows": np.stack([observations[a]["self"] for a in agents]),
            "agreement": np.stack([observations[a]["agreement"] for a in agents]),
            "mask": np.stack([observations[a]["action_mask"] for a in agents]),
            "oracle": np.array([infos[a]["oracle_action"] for a in agents], np.int8),
            "correct": np.array([infos[a]["correct"] for a in agents], bool),
            "consensus_correct": bool(infos[agents[0]]["consensus_correct"]),
            "tokens": np.array([infos[a]["tokens"] for a in agents], np.int32),
            "problem": play.problem, "stream": play.stream, "depth": len(play.history)}
    if step.done:
        key = b"".join(np.asarray(node[name]).tobytes() for name in NODE_FIELDS)
        if key in found.ended:
            return found.ended[key]
        found.ended[key] = len(found.nodes)
    index = {a: i for i, a in enumerate(agents)}
    found.targets.append([None if infos[a]["concede_target"] is None else index[infos[a]["concede_target"]]
                          for a in agents])
    found.nodes.append(node)
    found.expand.append(-1)
    if not step.done:
        width, n = len(found.joints), len(agents)
        found.expand[-1] = len(found.child)
        found.child.append(np.full(width, -1, np.int32))
        found.done.append(np.zeros(width, bool))
        found.rewards.append(np.zeros((width, n), np.float32))
        found.components.append(np.zeros((width, n, len(REWARD_COMPONENTS)), np.float32))
    return len(found.nodes) - 1


def _fill_edge(found: Walk, parent: int, joint: int, node: int, step: Step) -> None:
    """The outcome of ``joint`` at ``parent`` goes to every joint action of its class (``canonical``)."""
    edge = found.expand[parent]
    same = found.classes[parent] == joint
    found.child[edge][same] = node
    found.done[edge][same] = step.done
    found.rewards[edge][same] = [float(step.rewards[a]) for a in found.agents]
    found.components[edge][same] = [[step.infos[a][f"reward_{c}"] for c in REWARD_COMPONENTS] for a in found.agents]


def _expansions(found: Walk, node: int) -> list[int]:
    """The distinct moves (one joint action index per class) out of ``node``."""
    found.classes[node] = canonical(found.nodes[node]["mask"], found.targets[node], found.joints)
    return sorted(set(found.classes[node].tolist()))


def canonical(mask: np.ndarray, targets: Sequence[int | None], joints: np.ndarray) -> np.ndarray:
    """(J,): the joint action index that plays as each joint action does at a node (the module docstring):
    ``mask`` (N, A) its action masks, ``targets`` each agent's rule target (a peer index or None)."""
    n, actions = mask.shape
    moves = np.tile(np.arange(actions), (n, 1))
    moves[mask == 0] = Action.PERSIST
    if actions > FIRST_PEER_ACTION:  # CONCEDE to the rule's target is CONCEDE to that peer by name
        for i, target in enumerate(targets):
            if target is not None and mask[i, Action.CONCEDE]:
                moves[i, Action.CONCEDE] = FIRST_PEER_ACTION + (target - i - 1) % n
    played = moves[np.arange(n), joints]  # (J, N)
    return played @ (actions ** np.arange(n - 1, -1, -1))
