"""Tree rollouts of the text env for ``baselines.llm.train_llm`` (CoMLRL's multi-turn MAGRPO), their returns and
group-relative advantages.

A node is a text-env state; a turn is a step in which agents write (solve, then refine per round, and the critic
turns with ``critic="agent"``). At a node every acting agent samples G = ``group_size`` completions of its request,
each with its own reproducible seed (``sampling_seed``). The joint actions of a node (``--joint``):

- ``align``: candidate g of every acting agent together, G per node (G^T leaves after T turns);
- ``cross``: every combination, G^n per node for n acting agents (G^(N*T) leaves when all N agents act every turn).

Each joint action is applied to its own ``fork()`` of the node's env, giving a child node, down to the episode's end.
The tree grows breadth-first: one ``generate`` call answers every node of a depth, of every problem.
``max_tree_nodes`` bounds a problem's tree (states, root and leaves included) before anything is generated.

Returns (``tree_returns``), CoMLRL's return-to-go: joint action j gets R_j = r_j + gamma * (mean of the returns of
its child node's joint actions; 0 at a leaf), r_j being the step's team reward (every agent's summed) or, with
``--credit agent``, each agent's own step reward. A candidate's return is its joint action's (align) or, in cross
mode, the mean of the returns of the joint actions it takes part in. CoMLRL sums them instead; the sum is the mean
times the constant G^(n-1), which would only scale the advantages (by a factor that grows with the team), so we use
the mean.

Advantages (``advantages``) compare the G candidates of one (node, agent), the siblings of one parent, or with
``--pool-agents`` every acting agent's candidates at the node: ``--advantage`` mean (MAGRPO), rloo (MARLOO), max
(MAREMAX) or raw (MAREINFORCE) from ``baselines.advantages.baseline_advantages``, divided by the group's std with
``--algo grpo`` (or ``--std-normalize``); SoftRankPO's rank quantiles with ``--algo softrankpo``.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from baselines.advantages import baseline_advantages, grouped_apply, grouped_flat, softrank_advantages
from baselines.llm.config import LLMTrainConfig
from deliberation_env.requests import Completion, Request

log = logging.getLogger(__name__)
_noted: set[str] = set()


@dataclass
class Sample:
    """One trained completion: who wrote it, where in the tree, the tokens sampled."""

    agent: int
    node: int
    """Index in ``Tree.nodes`` of the state it answered."""
    candidate: int
    """g in 0..G-1 among the agent's candidates at the node."""
    prompt_ids: list[int]
    completion_ids: list[int]
    """The sampled ids, the stop token included when one ended the completion (the re-tokenised text, plus the
    end-of-sequence token when it stopped, for backends that give no ids)."""
    temperature: float
    kind: str = "solve"
    depth: int = 0
    """The turn: 0 for the episode's first step."""
    stop_id: int | None = None
    """The token that ended the completion (None: it ran into max_tokens)."""
    sampler_log_p: list[float] | None = None
    """The sampler's log-probability of each completion id (NaN where unknown), when it gave them."""
    sampler_is_policy: bool = True
    """The sampler is the trained weights in this process (the loss's old log-probabilities: its first pass)."""
    old_log_p: Any = None
    ref_log_p: Any = None


@dataclass
class Joint:
    """One joint action at a node: a candidate of each acting agent, applied to its own copy of the node's env."""

    choice: tuple[int, ...]
    """The candidate of each acting agent, in ``Node.acting`` order."""
    rewards: np.ndarray
    """Every agent's reward of the step (the env's, before ``reward_scale``)."""
    child: Node | None
    """The state it led to (None: the episode ended)."""


@dataclass
class Node:
    """A text-env state of one problem's tree: the acting agents and the joint actions of their candidates."""

    index: int
    problem: int
    path: tuple[int, ...]
    """The position of the joint action taken at each node from the root."""
    acting: tuple[int, ...] = ()
    joints: list[Joint] = field(default_factory=list)


@dataclass
class Tree:
    """Every problem's rollout tree. ``nodes``: the states that acted, parents before children; ``records``: one per
    leaf (a whole episode: per-agent ``rewards``, the reward ``terms`` as per-agent means, ``tokens``, whether the
    consensus was ``correct``); ``generated_tokens``: every completion's tokens, each counted once."""

    agents: int
    group_size: int
    joint: str
    problems: int
    nodes: list[Node] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    generated_tokens: int = 0

    def add(self, problem: int, path: tuple[int, ...]) -> Node:
        node = Node(len(self.nodes), problem, path)
        self.nodes.append(node)
        return node


def sampling_seed(seed: int, *keys: int) -> int:
    """A distinct, reproducible seed per request seed and keys (the update, the node's depth and path, the candidate)."""
    words = [int(k) & 0xFFFF_FFFF_FFFF_FFFF for k in (seed, *keys)]
    return int(np.random.SeedSequence(words).generate_state(2, np.uint64)[0] >> 1)


def branches(acting: int, group_size: int, joint: str) -> int:
    """Joint actions of a node with ``acting`` agents: G (align) or G^acting (cross)."""
    return group_size if joint == "align" else group_size**acting


def joint_choices(acting: int, group_size: int, joint: str) -> list[tuple[int, ...]]:
    """The joint actions of a node, each a candidate per acting agent: (g, ..., g) for every g (align), or every
    combination (cross)."""
    if joint == "align":
        return [(g,) * acting for g in range(group_size)]
    return list(itertools.product(range(group_size), repeat=acting))


def tree_size(branching: Sequence[int]) -> tuple[int, int]:
    """(states, leaves) of a tree whose nodes at depth d have ``branching[d]`` children (the root and leaves counted)."""
    states, width = 1, 1
    for count in branching:
        width *= count
        states += width
    return states, width


def planned_branching(env: Any, group_size: int, joint: str) -> list[int]:
    """The joint actions per node at each turn of an episode from ``env``'s state: a fork played with empty texts (the
    longest episode of the usual schedules: empty answers never agree early)."""
    probe, branching = env.fork(), []
    while probe.agents:
        branching.append(branches(len(probe.requests), group_size, joint))
        probe.step(dict.fromkeys(probe.agents, ""))
    return branching


def check_tree_size(states: int, cfg: LLMTrainConfig, detail: str) -> None:
    """ValueError naming the numbers and the ways to shrink the tree when ``states`` > ``cfg.max_tree_nodes``."""
    if states > cfg.max_tree_nodes:
        raise ValueError(
            f"a rollout tree would hold {states} states per problem ({detail}; --group-size {cfg.group_size}, --joint "
            f"{cfg.joint}, {cfg.num_agents} agents), more than --max-tree-nodes {cfg.max_tree_nodes}: lower --group-size "
            f"or --max-rounds, {'' if cfg.joint == 'align' else 'use --joint align (cross branches G^agents ways per turn), '}"
            "drop the critic turns (--env-option confidence=answer_logprobs), or raise --max-tree-nodes")


def check_planned_tree(env: Any, cfg: LLMTrainConfig) -> None:
    """``check_tree_size`` for the tree planned from ``env``'s current state (reset it first)."""
    branching = planned_branching(env, cfg.group_size, cfg.joint)
    planned, leaves = tree_size(branching)
    check_tree_size(planned, cfg, f"{leaves} leaves after {len(branching)} turns")


# ----------------------------------------------------------------------------- rollouts
def collect(envs: Sequence[Any], team: Any, seeds: Sequence[int] | np.ndarray, update: int, trained: Sequence[int], cfg: LLMTrainConfig,
            samplers: Sequence[Any] | None = None, sampler_is_policy: bool | None = None) -> tuple[list[Sample], Tree]:
    """Grow one rollout tree per problem, ``envs[p]`` reset with ``seeds[p]`` as its root (module docstring); returns
    the trained agents' samples and the trees.

    Within a depth the requests are asked node by node, agent by agent, candidate by candidate. ``samplers``: one
    generator per agent (default: the team's in-process ones). ``sampler_is_policy`` (default: ``samplers`` left out):
    they are the trained weights in this process, so the loss's old log-probabilities come from its first pass.
    Otherwise they are the samplers' ``token_id_logprobs`` (``use_sampler_logprobs``), unless truncated importance
    weights (``cfg.tis_cap`` > 0) correct for the sampler instead, which needs the trainer's own old log-probabilities;
    the samplers' stay in ``Sample.sampler_log_p`` either way."""
    from deliberation_env.grouping import generate_grouped

    is_policy = samplers is None if sampler_is_policy is None else sampler_is_policy
    samplers = samplers if samplers is not None else team.samplers
    eos_ids = list(team.backends[0].eos_ids)
    size = cfg.group_size
    tree = Tree(len(envs[0].possible_agents) if envs else 0, size, cfg.joint, len(envs))
    level = []
    for p, env in enumerate(envs):
        env.reset(seed=int(seeds[p]))
        level.append((tree.add(p, ()), env, {"rewards": np.zeros(tree.agents), "terms": {}, "tokens": 0, "correct": None}))
    if envs:  # fail before generating anything
        check_planned_tree(envs[0], cfg)
    states = [1] * len(envs)  # per problem, so far
    samples: list[Sample] = []
    while level:
        asked: list[tuple[Node, int, Request]] = []
        for node, env, _ in level:
            requests = sorted(env.requests.values(), key=lambda r: r.agent)
            node.acting = tuple(r.agent for r in requests)
            states[node.problem] += branches(len(requests), size, cfg.joint)
            check_tree_size(states[node.problem], cfg, f"at least that many by turn {len(node.path) + 1}")
            keys = (update, len(node.path), *node.path)
            asked += [(node, g, replace(r, seed=sampling_seed(r.seed, *keys, g))) for r in requests for g in range(size)]
        completions = generate_grouped([request for *_, request in asked], samplers)
        candidates: dict[tuple[int, int], list[Completion]] = {}
        prompts: dict[tuple[int, int], list[int]] = {}
        for (node, g, request), completion in zip(asked, completions):
            key = (node.index, request.agent)
            candidates.setdefault(key, []).append(completion)
            tree.generated_tokens += completion.completion_tokens
            if request.agent in trained:
                if key not in prompts:
                    prompts[key] = team.encode(request)
                samples.append(_sample(request, completion, node, g, prompts[key], team, eos_ids, is_policy))
        level = [child for node, env, record in level for child in _expand(tree, node, env, record, candidates)]
    if not is_policy and not cfg.tis_cap:
        use_sampler_logprobs(samples)
    return samples, tree


def _expand(tree: Tree, node: Node, env: Any, record: dict[str, Any],
            candidates: dict[tuple[int, int], list[Completion]]) -> list[tuple[Node, Any, dict[str, Any]]]:
    """Apply each joint action of ``node`` to its own fork of ``env`` (the last one to ``env`` itself); returns the
    children that go on, and adds the finished episodes' records to the tree."""
    names = env.possible_agents
    choices = joint_choices(len(node.acting), tree.group_size, tree.joint)
    children = []
    for j, choice in enumerate(choices):
        branch = env.fork() if j < len(choices) - 1 else env
        chosen = {names[a]: candidates[node.index, a][g] for a, g in zip(node.acting, choice)}
        actions = {name: _capped(chosen.get(name, ""), branch.max_action_chars) for name in branch.agents}
        _, rewards, _, _, infos = branch.step(actions)
        step = np.array([rewards.get(name, 0.0) for name in names])
        after = _extended(record, step, infos, sum(c.completion_tokens for c in chosen.values()), not branch.agents)
        child = tree.add(node.problem, (*node.path, j)) if branch.agents else None
        if child is not None:
            children.append((child, branch, after))
        else:
            tree.records.append(after)
        node.joints.append(Joint(choice, step, child))
    return children


def _capped(action: str | Completion, limit: int) -> str | Completion:
    if isinstance(action, Completion):
        return action if len(action.text) <= limit else replace(action, text=action.text[:limit])
    return action[:limit]


def _extended(record: dict[str, Any], step: np.ndarray, infos: dict[str, dict[str, Any]], tokens: int,
              done: bool) -> dict[str, Any]:
    """A path's record after one more step (rewards, per-agent means of the reward terms, tokens, the consensus)."""
    terms = dict(record["terms"])
    for info in infos.values():
        for key, value in info.items():
            if key.startswith("reward_"):
                terms[key] = terms.get(key, 0.0) + value / len(step)
    flags = [info["consensus_correct"] for info in infos.values() if "consensus_correct" in info]
    correct = bool(flags[0]) if done and flags else record["correct"]
    return {"rewards": record["rewards"] + step, "terms": terms, "tokens": record["tokens"] + tokens, "correct": correct}


def _sample(request: Request, completion: Completion, node: Node, candidate: int, prompt_ids: list[int], team: Any,
            eos_ids: Sequence[int], is_policy: bool) -> Sample:
    tokens = sampled_tokens(completion, eos_ids)
    if tokens is None:
        _note_once("retokenise", "the sampler returns no token ids: the trainer re-tokenises the completions' text "
                                 "(plus the first end-of-sequence token when they stopped), which may differ from "
                                 "the tokens sampled")
        ids = list(team.completion_ids(completion, request.max_tokens))
        tokens = ids, None, ids[-1] if completion.finish_reason == "stop" and ids else None
    ids, values, stop = tokens
    return Sample(request.agent, node.index, candidate, prompt_ids, ids, request.temperature, request.kind,
                  len(node.path), stop, values, is_policy)


def sampled_tokens(completion: Completion, eos_ids: Sequence[int]) -> tuple[list[int], list[float] | None, int | None] | None:
    """(ids, the sampler's log-probability of each or None, the stop token or None) of a completion that carries its
    token ids; None when it does not. When the model stopped and the backend did not list the end-of-sequence token,
    the first of ``eos_ids`` is appended (log-probability NaN: unknown)."""
    if completion.token_ids is None:
        return None
    ids = [int(i) for i in completion.token_ids]
    given = completion.token_id_logprobs
    values = [float(v) for v in given] if given is not None and len(given) == len(ids) else None
    if completion.finish_reason == "stop" and (not ids or ids[-1] not in eos_ids):
        ids.append(int(eos_ids[0]))
        values = values + [math.nan] if values is not None else None
    return ids, values, ids[-1] if completion.finish_reason == "stop" else None


def use_sampler_logprobs(samples: Sequence[Sample]) -> None:
    """Make the sampler's log-probabilities the loss's old ones (``old_log_p``, zero-padded to the batch's longest
    completion, as the loss slices them), for each agent whose samples all have them, every one known; the other
    agents' come from the first training pass (said once)."""
    import torch

    width = max((len(s.completion_ids) for s in samples), default=0)
    by_agent: dict[int, list[Sample]] = {}
    for sample in samples:
        by_agent.setdefault(sample.agent, []).append(sample)
    for agent, rows in sorted(by_agent.items()):
        given = [s.sampler_log_p for s in rows]
        if not all(values is not None and all(map(math.isfinite, values)) for values in given):
            _note_once(f"old-{agent}", f"agent {agent}'s sampler did not give every sampled token's log-probability: "
                                       "its old log-probabilities come from the first training pass")
            continue
        for sample, values in zip(rows, given):
            old = torch.zeros(width)
            old[: len(values or ())] = torch.tensor(values)
            sample.old_log_p = old


def _note_once(key: str, message: str) -> None:
    if key not in _noted:
        _noted.add(key)
        log.warning("train_llm: %s", message)


# ----------------------------------------------------------------------------- returns and advantages
def tree_returns(tree: Tree, credit: str, gamma: float) -> dict[tuple[int, int, int], float]:
    """Each candidate's return (module docstring), keyed (node index, agent, candidate): ``credit`` team or agent."""
    returns: dict[int, list[np.ndarray]] = {}  # per node, each joint action's return per agent
    for node in reversed(tree.nodes):  # children come after their parents
        values = []
        for joint in node.joints:
            immediate = np.full(tree.agents, joint.rewards.sum()) if credit == "team" else joint.rewards
            future = np.mean(returns[joint.child.index], axis=0) if joint.child is not None else 0.0
            values.append(immediate + gamma * future)
        returns[node.index] = values
    candidates = {}
    for node in tree.nodes:
        for position, agent in enumerate(node.acting):
            for g in range(tree.group_size):
                members = [v[agent] for v, joint in zip(returns[node.index], node.joints) if joint.choice[position] == g]
                candidates[node.index, agent, g] = float(np.mean(members))
    return candidates


def advantage_function(cfg: LLMTrainConfig) -> Callable[[np.ndarray], np.ndarray]:
    """One group's returns -> advantages: ``cfg.advantage``'s baseline (divided by the std with grpo or
    ``std_normalize``), or SoftRankPO's rank quantiles."""
    if cfg.algo == "softrankpo":
        return lambda returns: softrank_advantages(returns, cfg.tau)
    divide = cfg.algo == "grpo" or cfg.std_normalize
    return lambda returns: baseline_advantages(returns, cfg.advantage, divide)


def advantages(samples: Sequence[Sample], tree: Tree, cfg: LLMTrainConfig) -> tuple[list[Sample], np.ndarray, dict[str, float]]:
    """The samples the loss uses (all, or with ``drop_flat_groups`` those of groups whose returns differ), their
    advantages, and stats: ``flat_groups`` (the share of groups whose returns are all equal), ``adv_groups`` and the
    trees' size per problem (``tree_states``, ``tree_leaves``)."""
    problems = max(tree.problems, 1)
    stats = {"tree_states": (len(tree.nodes) + len(tree.records)) / problems, "tree_leaves": len(tree.records) / problems}
    if not samples:
        return [], np.zeros(0), {**stats, "flat_groups": 0.0, "adv_groups": 0.0}
    returns = tree_returns(tree, cfg.credit, cfg.gamma)
    values = np.array([returns[s.node, s.agent, s.candidate] for s in samples]) * cfg.reward_scale
    keys = _ids([(s.node,) if cfg.pool_agents else (s.node, s.agent) for s in samples])
    # a group's members: one return per candidate, except that candidate g of every agent shares one joint action's
    # team return in align mode (so a pooled group counts it once)
    shared = tree.joint == "align" and cfg.credit == "team"
    units = _ids([s.candidate if shared else (s.agent, s.candidate) for s in samples])
    adv = grouped_apply(values, keys, units, advantage_function(cfg))
    flat = grouped_flat(values, keys)
    groups = len(set(keys.tolist()))
    stats.update(flat_groups=len(set(keys[flat].tolist())) / groups, adv_groups=float(groups))
    if cfg.drop_flat_groups:
        keep = np.flatnonzero(~flat)
        return [samples[int(i)] for i in keep], adv[keep], stats
    return list(samples), adv, stats


def _ids(items: Sequence[Hashable]) -> np.ndarray:
    """Consecutive integers for distinct items."""
    index: dict[Hashable, int] = {}
    return np.array([index.setdefault(item, len(index)) for item in items], dtype=np.int64)
