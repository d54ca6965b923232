"""Tree rollouts (``baselines.llm.rollout``) on a scripted arithmetic text env, no model: the groups are the siblings
of one parent, the leaf counts of align and cross, returns and advantages against values worked out by hand; the
text env's ``fork()`` and its ``Completion`` actions."""

from __future__ import annotations

import logging
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from baselines.advantages import baseline_advantages, grouped_flat
from baselines.llm.config import LLMTrainConfig, make_text_env
from baselines.llm.rollout import advantages, collect, planned_branching, tree_returns, tree_size
from deliberation_env.backends import SimBackend
from deliberation_env.backends.base import Completion
from deliberation_env.env import DeliberationEnv
from deliberation_env.text import text_env

SEED = 5
EOS = 0
# 1 debate round without critic turns: T = 2 turns (solve, refine); each agent's step reward is 1 when its answer
# is right (the "correct" turn term), so a joint action's team reward counts its right answers
CFG = LLMTrainConfig(num_agents=2, group_size=2, max_rounds=1, task_options={"levels": 0}, gamma=0.5,
                     env_options={"confidence": "answer_logprobs"}, reward_weights={"local": 0, "global": 0, "correct": 1})
# (agent, turn) -> whether candidate g answers right
SCRIPT = {(0, 0): (True, False), (1, 0): (True, True), (0, 1): (True, False), (1, 1): (True, False)}


class Scripted:
    """Completions chosen by (agent, candidate, turn). The candidate is the request's position among the identical
    requests of the batch, modulo G (``collect`` asks each node's G candidates one after the other)."""

    def __init__(self, answer: str, script=SCRIPT, ids: bool = True, logprobs: bool = False):
        self.answer, self.script, self.ids, self.logprobs, self.calls = answer, script, ids, logprobs, 0

    def generate(self, requests):
        self.calls += 1
        seen: dict = {}
        completions = []
        for request in requests:
            key = (request.agent, request.messages)
            g = seen.get(key, 0) % CFG.group_size
            seen[key] = seen.get(key, 0) + 1
            right = self.script.get((request.agent, 0 if request.kind == "solve" else 1), (True, True))[g]
            text = f"{'So t' if g else 'T'}he answer is {self.answer if right else int(self.answer) + 1}."
            ids = tuple(range(1, len(text) + 1)) + (EOS,)
            completions.append(Completion(text, 7, len(ids), token_ids=ids if self.ids else None,
                                          token_id_logprobs=tuple(-0.01 * i for i in ids) if self.logprobs else None))
        return completions

    def identity(self) -> str:
        return "scripted"


class FakeTeam:
    """What ``collect`` needs of a ``TeamPolicy``: samplers, prompt ids, re-tokenised ids, the end-of-sequence ids."""

    def __init__(self, sampler, agents: int = 2):
        self.samplers = [sampler] * agents
        self.backends = [SimpleNamespace(eos_ids=[EOS])]

    def encode(self, request):
        return [ord(c) for m in request.messages for c in m.content]

    def completion_ids(self, completion, max_tokens):
        return [ord(c) for c in completion.text][:max_tokens] + ([EOS] if completion.finish_reason == "stop" else [])


def gold(cfg: LLMTrainConfig = CFG) -> str:
    env = make_text_env(cfg)
    env.reset(seed=SEED)
    return env.deliberation.problem.answer


def play(cfg: LLMTrainConfig = CFG, sampler=None, **kwargs):
    sampler = sampler or Scripted(gold(cfg))
    envs = [make_text_env(cfg)]
    return collect(envs, FakeTeam(sampler, cfg.num_agents), [SEED], 0, list(range(cfg.num_agents)), cfg, **kwargs)


def by_group(samples, tree):
    groups: dict = {}
    for s in samples:
        groups.setdefault((s.node, s.agent), []).append(s)
    return groups


@pytest.mark.parametrize("joint", ["align", "cross"])
def test_each_turn_group_holds_the_g_siblings_of_one_parent(joint):
    samples, tree = play(replace(CFG, joint=joint))
    groups = by_group(samples, tree)
    assert len(groups) == 2 * len(tree.nodes)  # one group per (node, agent)
    for (node, _), members in groups.items():
        assert sorted(s.candidate for s in members) == [0, 1]  # exactly the G candidates of one state
        assert len({tuple(s.prompt_ids) for s in members}) == 1  # one history
        assert {s.depth for s in members} == {len(tree.nodes[node].path)}
    refine = [n for n in tree.nodes if len(n.path) == 1]
    assert len(refine) == (2 if joint == "align" else 4)  # the root's joint actions
    assert len({tuple(groups[n.index, 0][0].prompt_ids) for n in refine}) == len(refine)  # different parents' histories
    assert all(s.completion_ids[-1] == EOS and s.stop_id == EOS for s in samples)  # the sampled ids, stop included


@pytest.mark.parametrize(("agents", "joint", "leaves"), [(2, "align", 2**2), (2, "cross", 2**4), (3, "align", 2**2),
                                                         (3, "cross", 2**6)])
def test_leaf_counts(agents, joint, leaves):
    cfg = replace(CFG, num_agents=agents, joint=joint)
    samples, tree = play(cfg)
    assert len(tree.records) == leaves  # G^T aligned, G^(N*T) crossed
    root = make_text_env(cfg)
    root.reset(seed=SEED)
    branching = planned_branching(root, cfg.group_size, joint)
    assert tree_size(branching) == (len(tree.nodes) + leaves, leaves)
    per_node = 2 if joint == "align" else 2**agents
    assert len(tree.nodes) == 1 + per_node and all(len(n.joints) == per_node for n in tree.nodes)
    assert len(samples) == agents * 2 * len(tree.nodes)
    assert all(r["correct"] is not None and r["rewards"].shape == (agents,) for r in tree.records)


def test_a_tree_over_the_bound_is_an_error_before_anything_is_generated():
    sampler = Scripted(gold())
    with pytest.raises(ValueError, match=r"73 states per problem \(64 leaves after 2 turns; --group-size 2, --joint "
                                         r"cross, 3 agents\), more than --max-tree-nodes 50: lower --group-size"):
        play(replace(CFG, num_agents=3, joint="cross", max_tree_nodes=50), sampler)
    assert sampler.calls == 0
    play(replace(CFG, num_agents=3, joint="cross", max_tree_nodes=73))


def adv_of(cfg, **changes):
    cfg = replace(cfg, **changes)
    samples, tree = play(cfg)
    kept, adv, stats = advantages(samples, tree, cfg)
    return {(len(tree.nodes[s.node].path), s.agent, s.candidate): a for s, a in zip(kept, adv)}, stats, tree


# Hand computation, gamma = 0.5, team credit. Solve: agent 0 right with candidate 0 only, agent 1 right with both;
# refine: each agent right with candidate 0 only.
# align: root joint g=0 scores 2, g=1 scores 1; in every child, joint g=0 scores 2, g=1 scores 0 (mean 1), so the
#   root's returns are 2 + 0.5 * 1 = 2.5 and 1 + 0.5 = 1.5 (both agents: they share the joint action).
# cross: the root's joint (c0, c1) scores 2, 2, 1, 1 for (0,0), (0,1), (1,0), (1,1); each child's joints score 2, 1,
#   1, 0 (mean 1), so the root's joint returns are 2.5, 2.5, 1.5, 1.5; agent 0's candidates 2.5 and 1.5, agent 1's
#   (the mean over the joints it is in) 2 and 2: a flat group. A child's candidate returns: (2 + 1) / 2, (1 + 0) / 2.
ALIGN = {"root": [2.5, 1.5], "child": [2.0, 0.0]}
CROSS = {"root0": [2.5, 1.5], "root1": [2.0, 2.0], "child": [1.5, 0.5]}
EXPECTED = {
    "mean": {"align": ([0.5, -0.5], [1.0, -1.0]), "cross": ([0.5, -0.5], [0.0, 0.0], [0.5, -0.5])},
    "rloo": {"align": ([1.0, -1.0], [2.0, -2.0]), "cross": ([1.0, -1.0], [0.0, 0.0], [1.0, -1.0])},
    "max": {"align": ([0.0, -1.0], [0.0, -2.0]), "cross": ([0.0, -1.0], [0.0, 0.0], [0.0, -1.0])},
    "raw": {"align": (ALIGN["root"], ALIGN["child"]), "cross": (CROSS["root0"], CROSS["root1"], CROSS["child"])},
}


@pytest.mark.parametrize("mode", ["mean", "rloo", "max", "raw"])
def test_returns_and_advantages_match_the_hand_computation(mode):
    align, stats, tree = adv_of(CFG, advantage=mode)
    root, child = EXPECTED[mode]["align"]
    for agent in (0, 1):
        assert [align[0, agent, g] for g in (0, 1)] == pytest.approx(root)
        assert [align[1, agent, g] for g in (0, 1)] == pytest.approx(child)
    assert stats["flat_groups"] == 0.0 and stats["tree_leaves"] == 4 and stats["tree_states"] == 7
    cross, stats, _ = adv_of(CFG, advantage=mode, joint="cross")
    root0, root1, child = EXPECTED[mode]["cross"]
    assert [cross[0, 0, g] for g in (0, 1)] == pytest.approx(root0)
    assert [cross[0, 1, g] for g in (0, 1)] == pytest.approx(root1)
    assert [cross[1, a, g] for a in (0, 1) for g in (0, 1)] == pytest.approx(child * 2)
    assert stats["flat_groups"] == pytest.approx(1 / 10)  # agent 1 at the root, of 2 + 4 * 2 groups
    # grpo divides each group's advantages by its std
    grpo, *_ = adv_of(CFG, advantage=mode, algo="grpo")
    assert [grpo[0, 0, g] for g in (0, 1)] == pytest.approx(np.array(root) / (0.5 + 1e-6))


def test_returns_by_hand_with_own_credit_and_the_flat_groups_dropped():
    # agent credit, align: the root's joint g=0 gives agents (1, 1), g=1 gives (0, 1); a child's joints give (1, 1)
    # and (0, 0), mean (0.5, 0.5); so the root returns are (1.25, 1.25) and (0.25, 1.25): agent 1's group is flat
    samples, tree = play(replace(CFG, credit="agent"))
    returns = tree_returns(tree, "agent", 0.5)
    assert [returns[0, 0, g] for g in (0, 1)] == pytest.approx([1.25, 0.25])
    assert [returns[0, 1, g] for g in (0, 1)] == pytest.approx([1.25, 1.25])
    assert [returns[1, a, g] for a in (0, 1) for g in (0, 1)] == pytest.approx([1.0, 0.0, 1.0, 0.0])
    assert tree_returns(tree, "agent", 1.0)[0, 0, 0] == pytest.approx(1.5)
    cfg = replace(CFG, credit="agent", advantage="raw")
    kept, adv, stats = advantages(samples, tree, cfg)
    assert stats["flat_groups"] == pytest.approx(1 / 6) and len(kept) == len(samples) == 12
    kept, adv, stats = advantages(samples, tree, replace(cfg, drop_flat_groups=True))
    assert len(kept) == 10 and not any(s.node == 0 and s.agent == 1 for s in kept)
    assert sorted(adv[[s.node == 0 for s in kept]]) == pytest.approx([0.25, 1.25])


def test_pooling_changes_nothing_with_team_credit_in_align_mode_but_does_otherwise():
    samples, tree = play()
    for algo, mode in [("magrpo", "mean"), ("magrpo", "rloo"), ("grpo", "max"), ("softrankpo", "mean")]:
        team = replace(CFG, algo=algo, advantage=mode)
        assert np.allclose(advantages(samples, tree, team)[1], advantages(samples, tree, replace(team, pool_agents=True))[1])
    own = replace(CFG, credit="agent")
    assert not np.allclose(advantages(samples, tree, own)[1], advantages(samples, tree, replace(own, pool_agents=True))[1])
    # crossed, a pooled group has both agents' candidates: agent 0's 2.5, 1.5 and agent 1's 2, 2
    cross, stats, _ = adv_of(CFG, joint="cross", pool_agents=True)
    assert [cross[0, a, g] for a in (0, 1) for g in (0, 1)] == pytest.approx([0.5, -0.5, 0.0, 0.0])


def test_advantage_modes_and_flat_groups():
    returns = np.array([1.0, 2.0, 6.0])
    assert baseline_advantages(returns, "rloo") == pytest.approx([1 - 4, 2 - 3.5, 6 - 1.5])
    assert baseline_advantages(returns, "max") == pytest.approx([-5, -4, 0])
    assert baseline_advantages(returns, "raw", std_normalize=True) == pytest.approx(returns / (returns.std() + 1e-6))
    assert baseline_advantages(np.array([3.0]), "rloo") == pytest.approx([0.0])
    assert grouped_flat(np.array([1.0, 1.0, 0.3, 0.1 + 0.2, 2.0, 1.0]), np.array([0, 0, 1, 1, 2, 2])).tolist() == \
        [True, True, True, True, False, False]
    with pytest.raises(ValueError, match="does not apply to --algo softrankpo"):
        replace(CFG, algo="softrankpo", advantage="max").validate()


def test_seeds_differ_per_candidate_and_node_and_repeat():
    seen = []

    class Recording(Scripted):
        def generate(self, requests):
            seen.extend(r.seed for r in requests)
            return super().generate(requests)

    play(sampler=Recording(gold()))
    first = list(seen)
    assert len(set(first)) == len(first)
    seen.clear()
    play(sampler=Recording(gold()))
    assert seen == first


def test_samplers_log_probabilities_become_the_old_ones_unless_importance_weights_need_the_trainers():
    torch = pytest.importorskip("torch")
    cfg = replace(CFG, tis_cap=0.0)
    samples, _ = play(cfg, Scripted(gold(), logprobs=True), samplers=[Scripted(gold(), logprobs=True)] * 2)
    width = max(len(s.completion_ids) for s in samples)
    for s in samples:
        assert not s.sampler_is_policy and s.sampler_log_p == pytest.approx([-0.01 * i for i in s.completion_ids])
        assert s.old_log_p.shape == (width,) and torch.allclose(s.old_log_p[: len(s.completion_ids)],
                                                               torch.tensor(s.sampler_log_p))
    samples, _ = play(replace(cfg, tis_cap=2.0), samplers=[Scripted(gold(), logprobs=True)] * 2)
    assert all(s.old_log_p is None and s.sampler_log_p is not None for s in samples)
    samples, _ = play(cfg, Scripted(gold(), logprobs=True))  # the team's own samplers: its first pass
    assert all(s.sampler_is_policy and s.old_log_p is None for s in samples)


def test_backends_without_token_ids_fall_back_to_the_text_once(caplog):
    from baselines.llm import rollout

    rollout._noted.discard("retokenise")
    with caplog.at_level(logging.WARNING, logger="baselines.llm.rollout"):
        samples, _ = play(sampler=Scripted(gold(), ids=False))
        play(sampler=Scripted(gold(), ids=False))
    assert sum("re-tokenises" in r.message for r in caplog.records) == 1
    assert samples[0].completion_ids == [ord(c) for c in "The answer is " + gold() + "."] + [EOS]


# ----------------------------------------------------------------------------- the text env
def steps_equal(a, b) -> bool:
    """Nested equality of step tuples (dicts, sequences, numpy arrays)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(steps_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(steps_equal, a, b))
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return a == b


def writer(branch: int):
    return lambda agent, request: f"Branch {branch}: the answer is {len(request.messages) + branch + int(agent[-1])}."


def drive(env, write, steps: int | None = None):
    """Step ``env`` with ``write(agent, request)`` texts (``steps`` of them, or to the end); returns the step tuples."""
    out = []
    while env.agents and (steps is None or len(out) < steps):
        requests = env.requests
        out.append(env.step({a: write(a, requests[a]) if a in requests else "" for a in env.agents}))
    return out


def test_a_fork_goes_on_independently_and_as_a_fresh_env_on_the_same_path():
    def make():
        return text_env(num_agents=3, max_rounds=2, meta_policy="random", split="train")

    env = make()
    env.reset(seed=11)
    drive(env, writer(0), steps=2)
    fork = env.fork()
    assert fork.task is env.task and fork.deliberation is not env.deliberation
    forked = drive(fork, writer(2))
    original = drive(env, writer(1))
    assert not steps_equal(forked, original)
    for branch, played in ((1, original), (2, forked)):
        fresh = make()
        fresh.reset(seed=11)
        drive(fresh, writer(0), steps=2)
        assert steps_equal(drive(fresh, writer(branch)), played)


def debate(observations, infos):
    return dict.fromkeys(observations, 1)


@pytest.mark.parametrize("confidence", ["answer_logprobs", "critic"])
def test_completion_actions_give_the_meta_envs_episode_with_that_backend(confidence):
    """The text env fed a backend's Completions reproduces the meta-action env with that backend: token counts,
    confidences (from the token log-probabilities) and the consensus (the more confident agent wins a tie)."""
    for seed in range(6):
        meta = DeliberationEnv(backend=SimBackend(), num_agents=2, max_rounds=2, confidence=confidence)
        observations, infos = meta.reset(seed=seed)
        expected = [infos]
        while meta.agents:
            observations, _, _, _, infos = meta.step(debate(observations, infos))
            expected.append(infos)
        sim = SimBackend()
        env = text_env(num_agents=2, max_rounds=2, meta_policy=debate, confidence=confidence)
        env.reset(seed=seed)
        rounds = []
        while env.agents:
            requests = env.requests
            _, _, _, _, infos = env.step({a: sim.generate([requests[a]])[0] if a in requests else "" for a in env.agents})
            rounds += [{a: {k: v for k, v in info["rounds"][k].items() if k != "reward"} for a, info in infos.items()}
                       for k in range(infos["agent_0"]["rounds_closed"])]
        assert steps_equal(rounds, expected), seed
    if confidence == "answer_logprobs":  # the confidences came from the log-probabilities, not the 0.5 default
        assert {info["confidence_source"] for info in expected[-1].values()} <= {"answer_logprobs", "sequence_logprobs"}
