"""The jigsaw task: counts split between agents, so that only a team that shares them is right."""

from __future__ import annotations

import re

import pytest

import deliberation_env
from deliberation_env.backends.base import Completion
from deliberation_env.core.actions import Action
from deliberation_env.tasks.base import styled
from deliberation_env.tasks.jigsaw import JIGSAW_TEAM, JigsawTask

FACT = re.compile(r"\b([A-Z][a-z]+) has (\d+) [a-z]+\.")


class Reader:
    """An agent that writes the counts it can read in its prompt (its own view and its peers' solutions) and
    answers with their sum: right only when it has read every person's count."""

    def generate(self, requests):
        out = []
        for request in requests:
            prompt = request.messages[-1].content
            if request.kind == "critic":
                out.append(Completion("Yes. Confidence: 0.6", 10, 4))
                continue
            facts = dict(FACT.findall(prompt))
            text = " ".join(f"{name} has {count} items." for name, count in facts.items())
            out.append(Completion(f"{text}\nThe answer is {sum(map(int, facts.values()))}", 20, 12))
        return out

    def identity(self) -> str:
        return "reader"


def test_splits_are_disjoint_free_of_repeats_and_answers_follow_the_counts():
    task = JigsawTask(levels=[0, 1, 2], parts=3)
    train, test = task.problems("train"), task.problems("test")
    assert len(train) == 2000 and len(test) == 500
    keys = [(p.question, tuple(p.metadata["private"])) for p in (*train, *test)]
    assert len(set(keys)) == len(keys)
    for problem in (*train[:200], *test[:200]):
        meta, total = problem.metadata, sum(problem.metadata["counts"])
        expected = {0: total, 1: total // meta.get("boxes", 1), 2: total + meta.get("packs", 0) * meta.get("size", 0)}
        assert int(problem.answer) == expected[meta["level"]] and len(meta["private"]) == 3
        if meta["level"] == 1:
            assert total % meta["boxes"] == 0
        for count in meta["counts"]:  # the question every agent sees holds no private count
            assert not re.search(rf"\b{count}\b", problem.question)
    assert {p.metadata["level"] for p in test} == {0, 1, 2}


def test_each_view_shows_its_own_count_and_nothing_shows_it_to_the_critic():
    task = JigsawTask(levels=[0])
    problem = task.problems("test")[0]
    mine, theirs = problem.metadata["private"]
    view = styled(task, "view_0")
    for messages in (view.solve_messages(problem), view.refine_messages(problem, "my work", [])):
        assert mine in messages[-1].content and theirs not in messages[-1].content
    assert all(fact in task.solve_messages(problem)[-1].content for fact in (mine, theirs))  # full: the control
    critic = view.critic_messages(problem, "The answer is 3")[-1].content
    assert mine not in critic and theirs not in critic


def test_bad_settings_are_clear_errors():
    with pytest.raises(ValueError, match="jigsaw parts must be 2 or 3"):
        JigsawTask(parts=4)
    with pytest.raises(ValueError, match="jigsaw levels"):
        JigsawTask(levels=[3])
    with pytest.raises(ValueError, match="jigsaw prompt must be one of"):
        JigsawTask(prompt="view_2")  # two parts: no third view
    with pytest.raises(ValueError, match="no prompt style 'view_2'"):
        deliberation_env.parallel_env(task="jigsaw", num_agents=3, roles=[*JIGSAW_TEAM, {"name": "c", "prompt": "view_2"}])


def test_a_split_team_is_right_only_after_it_shares_what_each_agent_knows():
    def play(roles):
        env = deliberation_env.parallel_env(task="jigsaw", task_kwargs={"levels": [0]}, backend=Reader(),
                                            num_agents=2, roles=roles, max_rounds=1, invalid_action="persist")
        first, refined = [], []
        for seed in range(6):
            env.reset(seed=seed)
            first.append([a.correct for a in env.deliberation.agents])
            env.step({agent: int(Action.REFINE) for agent in env.agents})
            refined.append([a.correct for a in env.deliberation.agents])
        return first, refined

    first, refined = play(list(JIGSAW_TEAM))
    assert not any(map(any, first)) and all(map(all, refined))  # alone: wrong; having read the peer: right
    first, refined = play(None)  # every count shown: nothing to share
    assert all(map(all, first)) and all(map(all, refined))
