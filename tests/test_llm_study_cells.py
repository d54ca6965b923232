"""The LLM study's cells (``bench/studies/llm_study.py``) on a scripted rollout tree with mixed correctness, no model: every
pair of cells of the ``turns`` design gives different advantages, by construction; the pairs the design names
``SAME_BY_CONSTRUCTION`` (a team reward under shared and own credit, the first study's two team cells) give equal
ones wherever every answer is readable, and differ only in the groups holding an unreadable answer. Also the
``team_turn`` reward term that the per-turn team cell pays."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from test_llm_tree import CFG, EOS, SEED, FakeTeam, gold

from baselines.llm.config import make_text_env
from baselines.llm.rollout import advantages, collect
from deliberation_env.backends.base import Completion

G = 3
# (agent, turn) -> what candidate g writes: r(ight), w(rong) or n(o answer the extractor can read). At both turns
# the aligned joint actions are (right, right), (right, wrong), (wrong, wrong): the consensus is right, tied, wrong
MIXED = {(0, 0): "rrw", (1, 0): "rww", (0, 1): "rrw", (1, 1): "rww"}
UNREADABLE = {**MIXED, (1, 1): "nrw"}  # agent 1's first refinement has no readable answer


class Written:
    """Completions chosen by (agent, turn, candidate); the candidate is the request's position among the identical
    requests of the batch, modulo G (``collect`` asks each node's G candidates one after the other)."""

    def __init__(self, answer: str, script: dict[tuple[int, int], str]):
        self.answer, self.script = answer, script

    def generate(self, requests):
        seen: dict = {}
        completions = []
        for request in requests:
            key = (request.agent, request.messages)
            g = seen.get(key, 0) % G
            seen[key] = seen.get(key, 0) + 1
            kind = self.script[request.agent, 0 if request.kind == "solve" else 1][g]
            text = {"r": f"The answer is {self.answer}.", "w": f"The answer is {int(self.answer) + 1}.",
                    "n": "I cannot tell."}[kind]
            ids = tuple(range(1, len(text) + 1)) + (EOS,)
            completions.append(Completion(text, 7, len(ids), token_ids=ids))
        return completions

    def identity(self) -> str:
        return "written"


@pytest.fixture
def study():
    from bench.studies import llm_study

    return llm_study


def cell_advantages(study, cell: str, script) -> dict[tuple[int, int, int], float]:
    """Each sample's advantage under the cell's settings, keyed (node, agent, candidate)."""
    cfg = replace(CFG, group_size=G, gamma=1.0, **study.cell_settings(cell))
    samples, tree = collect([make_text_env(cfg)], FakeTeam(Written(gold(cfg), script)), [SEED], 0, [0, 1], cfg)
    kept, adv, _ = advantages(samples, tree, cfg)
    return {(s.node, s.agent, s.candidate): float(a) for s, a in zip(kept, adv)}


def differing_nodes(a: dict, b: dict) -> set[int]:
    assert a.keys() == b.keys()
    return {key[0] for key in a if not np.isclose(a[key], b[key], atol=1e-9)}


@pytest.mark.parametrize("pair", list(itertools.combinations(("teamturn-shared", "team-shared", "own-shared",
                                                                "own-own"), 2)))
def test_every_pair_of_the_redesigned_cells_gives_different_advantages(study, pair):
    assert set(study.DESIGNS["turns"]) == {"teamturn-shared", "team-shared", "own-shared", "own-own"}
    first, second = (cell_advantages(study, cell, MIXED) for cell in pair)
    assert differing_nodes(first, second), f"{pair} give the same advantages on a tree with mixed correctness"


@pytest.mark.parametrize("pair", [("team-shared", "team-own"), ("teamturn-shared", "teamturn-own")])
def test_a_team_reward_under_shared_and_own_credit_differs_only_where_an_answer_is_unreadable(study, pair):
    assert pair in study.SAME_BY_CONSTRUCTION
    first, second = (cell_advantages(study, cell, MIXED) for cell in pair)
    assert any(abs(value) > 0.1 for value in first.values())  # the groups are not flat: there is something to match
    assert not differing_nodes(first, second)
    first, second = (cell_advantages(study, cell, UNREADABLE) for cell in pair)
    assert differing_nodes(first, second) == {1, 2, 3}  # the refine nodes, where agent 1's candidate 0 is unreadable


def test_the_first_study_crossed_credit_with_a_team_reward(study):
    """Its design held one of the pairs that are equal by construction: the reason the redesign exists."""
    assert ("team-shared", "team-own") in itertools.combinations(study.DESIGNS["2x2"], 2)
    assert not any(pair in itertools.combinations(study.DESIGNS["turns"], 2) for pair in study.SAME_BY_CONSTRUCTION)


def test_team_turn_pays_the_consensus_at_every_turn_and_team_only_at_the_last():
    cfg = replace(CFG, reward_weights={"team_turn": 1.0, "local": 0.0, "global": 0.0})
    env = make_text_env(cfg)
    env.reset(seed=SEED)
    answer = env.deliberation.problem.answer
    _, rewards, _, _, infos = env.step({name: f"The answer is {answer}." for name in env.agents})  # solve: right
    assert rewards == {"agent_0": 1.0, "agent_1": 1.0}
    assert [(i["reward_team_turn"], i["reward_team"], i["reward_consensus_correct"]) for i in infos.values()] == \
        [(1.0, 0.0, 0.0)] * 2
    wrong = str(int(answer) + 1)
    _, rewards, _, _, infos = env.step({name: f"The answer is {wrong}." for name in env.agents})  # refine: wrong
    assert not env.agents and rewards == {"agent_0": 0.0, "agent_1": 0.0}
    assert [(i["reward_team_turn"], i["reward_team"]) for i in infos.values()] == [(0.0, 0.0)] * 2


def test_the_jigsaw_study_gives_each_agent_one_view_and_keeps_its_own_results(study):
    args = study.parse_args(["--task", "jigsaw", "--levels", "0"])
    cfg = study.cell_config(args, "own-own", 0)
    assert args.stem == "train_llm_turns_jigsaw" and cfg.task == "jigsaw" and cfg.task_options["parts"] == 2
    env = make_text_env(cfg)
    observations, _ = env.reset(seed=0)
    problem = env.deliberation.problem
    for k, agent in enumerate(env.agents):  # each agent's prompt holds its own person's count, not the other's
        prompt = observations[agent]["messages"][-1]["content"]
        assert problem.metadata["private"][k] in prompt and problem.metadata["private"][1 - k] not in prompt
    arithmetic = study.cell_config(study.parse_args([]), "own-own", 0)
    assert arithmetic.task == "arithmetic" and "roles" not in arithmetic.env_options
    with pytest.raises(SystemExit):
        study.parse_args(["--task", "jigsaw", "--num-agents", "4"])
