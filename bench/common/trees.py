"""A recorded 1-round tree, played out: every joint meta-action's outcome per problem, and the policies over it.

Shared by ``replay_benchmark.py`` (its headroom section) and ``headroom.py`` (the table across sets, concede
rules and feature sets).
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from typing import Any

import numpy as np

from deliberation_env.core import features
from deliberation_env.make import replay_env
from deliberation_env.replay import ReplaySet
from deliberation_env.vector import Start, Step, run_episodes

EXHAUSTIVE_LIMIT = 20_000
"""Policy spaces up to this size are searched exhaustively; larger ones by coordinate ascent."""


def tree_of(dataset: ReplaySet, split: str = "test", **env_options: Any) -> dict[str, Any]:
    """Every joint action of every problem (stream 0) of a 1-round set: outcomes, tokens and each agent's round-0
    view (its ``features="v3"`` row, whose first 16 columns are v1's and first 23 v2's; its peers' rows and
    agreement in observation order; its action mask). ``env_options`` go to ``replay_env`` (e.g.
    ``concede_to_peer=True``, ``concede_target="plurality"``)."""
    env = replay_env(dataset, split=split, invalid_action="persist", features="v3", max_rounds=1, **env_options)
    agents = env.possible_agents
    actions = env.action_space(agents[0]).n
    joints = list(itertools.product(range(actions), repeat=len(agents)))
    n, width = len(env.problems), features.num_features("v3")
    outcome, tokens = np.zeros((n, len(joints)), bool), np.zeros((n, len(joints)))
    agree, confidence, correct0 = np.zeros((n, len(agents)), int), np.zeros((n, len(agents))), np.zeros((n, len(agents)), bool)
    rows, peers = np.zeros((n, len(agents), width), np.float32), np.zeros((n, len(agents), len(agents) - 1, width), np.float32)
    peer_agrees, masks = np.zeros((n, len(agents), len(agents) - 1), bool), np.zeros((n, len(agents), actions), bool)
    flips, concede = Counter(), Counter()
    spent = 0.0
    refine_all = joints.index((1,) * len(agents))

    def on_step(step: Step) -> None:
        nonlocal spent
        p, j = divmod(step.episode, len(joints))
        obs, infos = step.observations, step.infos
        if step.actions is not None:  # the one round: its outcome
            outcome[p, j] = next(iter(infos.values()))["consensus_correct"]
            tokens[p, j] = spent + sum(info["tokens"] for info in infos.values())
            if j == refine_all:
                for a, info in enumerate(infos.values()):
                    flips[bool(correct0[p, a]), bool(info["correct"])] += 1
            return
        spent = sum(info["tokens"] for info in infos.values())
        if j == 0:  # round 0 is the same for every joint action
            for a, agent in enumerate(agents):
                agree[p, a] = int(obs[agent]["agreement"].sum())
                rows[p, a], peers[p, a] = obs[agent]["self"], obs[agent]["peers"]
                peer_agrees[p, a], masks[p, a] = obs[agent]["agreement"] > 0, obs[agent]["action_mask"] > 0
                confidence[p, a] = infos[agent]["confidence"]
                correct0[p, a] = infos[agent]["correct"]
                target = infos[agent]["concede_target"]
                if target is not None:
                    concede["offered"] += 1
                    concede["target_right"] += infos[agent]["concede_target_correct"]
                    if not infos[agent]["correct"]:
                        concede["wrong_offered"] += 1
                        concede["wrong_target_right"] += infos[agent]["concede_target_correct"]

    starts = [Start(0, {"problem_index": p}) for p in range(n) for _ in joints]
    run_episodes([env], starts, lambda steps: [dict(zip(agents, joints[steps[0].episode % len(joints)]))], on_step)
    return {"outcome": outcome, "tokens": tokens, "agree": agree, "confidence": confidence, "correct0": correct0,
            "rows": rows, "peers": peers, "peer_agrees": peer_agrees, "masks": masks, "joints": np.array(joints),
            "actions": actions, "flips": flips, "concede": concede}


def pool_trees(trees: list[dict]) -> dict:
    """The trees of several splits as one (problems stacked)."""
    shared = ("joints", "actions", "flips", "concede")
    pooled = {key: np.concatenate([tree[key] for tree in trees]) for key in trees[0] if key not in shared}
    pooled["joints"], pooled["actions"] = trees[0]["joints"], trees[0]["actions"]
    for key in ("flips", "concede"):
        pooled[key] = sum((tree[key] for tree in trees), Counter())
    return pooled


def joint_index(tree: dict, actions: np.ndarray) -> np.ndarray:
    """The column of ``tree["outcome"]`` that per-agent ``actions`` (..., agents) name (itertools.product order)."""
    index = np.zeros(actions.shape[:-1], int)
    for k in range(actions.shape[-1]):
        index = index * tree["actions"] + actions[..., k]
    return index


def policy_table(tree: dict, state: np.ndarray, policies: np.ndarray) -> np.ndarray:
    """(policies, problems): whether the consensus is right when every agent plays ``policy[state]``
    (``state``: problems x agents ints; ``policies``: policies x states actions)."""
    joint = joint_index(tree, policies[:, state])
    return tree["outcome"][np.arange(state.shape[0]), joint]


@functools.lru_cache(maxsize=8)
def all_policies(actions: int, states: int) -> np.ndarray:
    """Every policy (states -> action) of a small space, one per row (built once per size)."""
    return np.array(list(itertools.product(range(actions), repeat=states)))


def exhaustive(actions: int, states: int) -> bool:
    """Whether ``best_policy`` enumerates every policy (int: numpy's 5 ** 36 wraps around to a small number)."""
    return int(actions) ** states <= EXHAUSTIVE_LIMIT


def best_policy(tree: dict, state: np.ndarray, states: int, on: np.ndarray) -> np.ndarray:
    """The shared policy (states -> action) with the most right consensuses on problems ``on``: exhaustive where
    the space is small (3 actions x 6 states: 729), else coordinate ascent (each state's action set to its best
    given the others, until a sweep changes nothing) from always-PERSIST and from always-REFINE, the better of the
    two: a lower bound of the best."""
    actions, sub = tree["actions"], state[on]
    sub_tree = {"outcome": tree["outcome"][on], "actions": actions}
    if exhaustive(actions, states):
        policies = all_policies(actions, states)
        return policies[int(np.argmax(policy_table(sub_tree, sub, policies).mean(1)))]
    found = []
    for start in (0, 1):
        policy = np.full(states, start)
        for _ in range(10):
            changed = False
            for s in range(states):
                candidates = np.repeat(policy[None], actions, 0)
                candidates[:, s] = np.arange(actions)
                scores = policy_table(sub_tree, sub, candidates).mean(1)
                if scores.max() > scores[policy[s]] + 1e-12:
                    policy[s], changed = int(np.argmax(scores)), True
            if not changed:
                break
        found.append(policy)
    return max(found, key=lambda policy: policy_table(sub_tree, sub, policy[None]).mean())


def split_bit(values: np.ndarray, threshold: float) -> np.ndarray:
    """values >= threshold, or > threshold where that split would put everything on one side."""
    bit = values >= threshold
    return values > threshold if bit.all() else bit


def peer_values(values: np.ndarray) -> np.ndarray:
    """(problems, agents, peers): each agent's peers' ``values`` in observation order (agent+1, agent+2, ...,
    cyclic: ``Deliberation.peer_indices``)."""
    agents = values.shape[1]
    return np.stack([values[:, [(a + k) % agents for k in range(1, agents)]] for a in range(agents)], axis=1)


def role_groups(tree: dict) -> np.ndarray:
    """Each agent's role, as a group index (0, 1, ... in order of first appearance), read off its v3 role columns;
    one group for a team of one role."""
    names = features.feature_names("v3")
    roles = tree["rows"][0, :, [i for i, name in enumerate(names) if name.startswith("role_")]].T  # agents x roles
    _, first, inverse = np.unique(roles, axis=0, return_index=True, return_inverse=True)
    return np.argsort(np.argsort(first))[inverse.reshape(-1)]


def state_of(tree: dict, signal: int | np.ndarray | None, threshold: float, peer_bit: bool,
             groups: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """Each agent's state: peers agreeing (0..N-1) x its own value of ``signal`` split at ``threshold`` (none: one
    level), and with ``peer_bit`` whether its first peer's value is at least its second's (which peer a chosen
    CONCEDE names); with ``groups`` (one per agent: its role), also the agent's group, so that a shared policy over
    this state is one policy per role. Returns (problems x agents states, number of states)."""
    state, levels = tree["agree"].copy(), tree["agree"].shape[1]
    if signal is not None:
        values = _values(tree, signal)
        state, levels = state * 2 + split_bit(values, threshold), levels * 2
        if peer_bit and values.shape[1] >= 3:
            theirs = tree["peers"][:, :, :, signal] if isinstance(signal, int) else peer_values(values)
            state, levels = state * 2 + (theirs[:, :, 0] >= theirs[:, :, 1]), levels * 2
    if groups is not None:
        state, levels = groups[None, :] * levels + state, levels * (int(groups.max()) + 1)
    return state, levels


def _values(tree: dict, signal: int | np.ndarray) -> np.ndarray:
    return tree["rows"][:, :, signal] if isinstance(signal, int) else signal


def headroom(tree: dict, signals: dict[str, int | np.ndarray | None], peer_bit: bool = False, folds: int = 5,
             repeats: int = 10, seed: int = 0, groups: np.ndarray | None = None) -> dict[str, Any]:
    """The best shared decentralised policy over ``state_of``'s state, where the signal (one of ``signals``, by
    name: a column of the rows, or an array, problems x agents, of per-agent values; the agent sees its peers'
    values too; or None, agreement alone), its median threshold and the policy are chosen on the training folds and scored on the held-out fold;
    mean and sd over ``repeats`` fold splits; the best in-sample; and the joint oracle. ``groups``: one policy per
    role (``role_groups``) instead of one for all."""
    n = len(tree["outcome"])
    everything = np.arange(n)

    def fit(on: np.ndarray) -> tuple[float, str, np.ndarray, np.ndarray]:
        best: tuple[float, str, np.ndarray, np.ndarray] | None = None
        for name, signal in signals.items():
            threshold = 0.0 if signal is None else float(np.median(_values(tree, signal)[on]))
            state, levels = state_of(tree, signal, threshold, peer_bit, groups)
            policy = best_policy(tree, state, levels, on)
            right = policy_table(tree, state, policy[None])[0]
            if best is None or right[on].mean() > best[0]:
                best = (float(right[on].mean()), name, policy, right)
        assert best is not None
        return best

    in_sample = fit(everything)[0]
    rng = np.random.default_rng(seed)
    held_outs, chosen = [], Counter()
    for _ in range(repeats):
        held_out, order = np.zeros(n), rng.permutation(n)
        for fold in np.array_split(order, folds):
            _, name, _, right = fit(np.setdiff1d(order, fold))
            held_out[fold] = right[fold]
            chosen[name] += 1
        held_outs.append(held_out)
    scores = np.mean(held_outs, axis=1)
    return {"joint_oracle": float(tree["outcome"].any(1).mean()), "in_sample": in_sample,
            "cross_validated": float(np.mean(scores)), "cv_std": float(np.std(scores)), "chosen": chosen.most_common(3),
            "per_problem": np.mean(held_outs, axis=0)}


def best_constant(tree: dict, folds: int = 5, repeats: int = 10, seed: int = 0, shared: bool = False,
                  nested: bool = False) -> dict[str, Any]:
    """The best fixed protocol of the tree: one joint action for every problem, chosen on the training folds and
    scored on the held-out fold (mean over ``repeats`` fold splits; ``per_problem``: each problem's held-out outcome
    averaged over them, on the fold splits ``headroom`` draws with the same seed); and the one chosen on all
    problems. ``shared``: only the joint actions where every agent plays the same action (the vote, debate, ...).
    ``nested``: each training fold also chooses between those two families, by an inner cross-validation on its
    own problems (so no family is picked after seeing held-out outcomes)."""
    outcome, n = tree["outcome"], len(tree["outcome"])
    alike = np.flatnonzero((tree["joints"] == tree["joints"][:, :1]).all(1))
    families = [np.arange(outcome.shape[1]), alike]
    inner = np.random.default_rng(seed + 1)  # its own stream: the outer fold splits stay headroom's

    def family(train: np.ndarray) -> np.ndarray:
        if not nested:
            return families[1] if shared else families[0]
        held = np.zeros((len(families), len(train)))
        for part in np.array_split(inner.permutation(len(train)), folds):
            rest = np.setdiff1d(np.arange(len(train)), part)
            for k, columns in enumerate(families):
                held[k, part] = outcome[train[part], columns[int(np.argmax(outcome[train[rest]][:, columns].mean(0)))]]
        return families[int(np.argmax(held.mean(1)))]

    rng = np.random.default_rng(seed)
    held_outs = []
    for _ in range(repeats):
        held_out, order = np.zeros(n), rng.permutation(n)
        for fold in np.array_split(order, folds):
            train = np.setdiff1d(order, fold)
            columns = family(train)
            held_out[fold] = outcome[fold, columns[int(np.argmax(outcome[train][:, columns].mean(0)))]]
        held_outs.append(held_out)
    columns = family(np.arange(n))
    best = columns[int(np.argmax(outcome[:, columns].mean(0)))]
    return {"cross_validated": float(np.mean(held_outs)), "joint": tuple(int(a) for a in tree["joints"][best]),
            "per_problem": np.mean(held_outs, axis=0)}


def feature_columns(tree: dict, feature_set: str) -> dict[str, int]:
    """Each feature of a feature set that varies in the tree, by name: its column in the tree's rows."""
    return {name: i for i, name in enumerate(features.feature_names(feature_set)) if np.ptp(tree["rows"][:, :, i]) > 0}
