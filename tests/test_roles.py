"""Roles: a heterogeneous team (a prompt style and a temperature per agent), their requests, features and replay."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import deliberation_env
from deliberation_env.core import features
from deliberation_env.core.deliberation import Deliberation, DeliberationConfig
from deliberation_env.core.roles import Role, make_roles, role_indices
from deliberation_env.make import replay_env
from deliberation_env.record import main as record
from deliberation_env.registry import TASKS
from deliberation_env.replay import ReplayError

TEAM = ["plain", {"name": "words", "prompt": "no_code", "temperature": 1.0}, "plain"]
SIM = {"task": "arithmetic", "task_kwargs": {"levels": [0, 1]}, "backend": "sim", "max_tokens": 64, "max_rounds": 1}


@pytest.mark.parametrize(("spec", "message"), [
    (["a", "b"], "roles has 2 entries but num_agents is 3"),
    ("abc", "must be a list of 3 roles"),
    (["a", {"name": "b", "tone": "warm"}, "c"], r"unknown role field\(s\) \['tone'\]"),
    (["a", {"prompt": "no_code"}, "c"], "a role needs a name"),
    (["a", {"name": "b", "temperature": 9}, "c"], r"temperature must be a number in \[0, 5\]"),
    (["a", {"name": "a", "temperature": 0.2}, "a"], "role name 'a' is given with different settings"),
    ([1, "b", "c"], "a role is a Role, a mapping of its fields or its name"),
])
def test_bad_role_specs_get_one_clear_error(spec, message):
    with pytest.raises(ValueError, match=message):
        DeliberationConfig(num_agents=3, roles=spec)


def test_an_unknown_prompt_style_names_the_task_s_styles():
    with pytest.raises(ValueError, match=r"no prompt style 'verse'; its styles: \['default', 'no_code', 'program'\]"):
        deliberation_env.parallel_env(**SIM, roles=["a", {"name": "b", "prompt": "verse"}, "a"])
    assert make_roles(None, 3) is None
    assert make_roles(TEAM, 3)[1] == Role("words", "no_code", 1.0)
    assert role_indices(make_roles(TEAM, 3), 3) == [0, 1, 0] and role_indices(None, 3) == [0, 0, 0]


def test_each_agent_solves_and_refines_with_its_role_and_the_critic_is_shared():
    task = TASKS.make("arithmetic", levels=[0, 1])
    problem = task.problems("test")[0]
    plain = Deliberation(task, DeliberationConfig(num_agents=3, max_rounds=1))
    team = Deliberation(task, DeliberationConfig(num_agents=3, max_rounds=1, roles=TEAM))
    plain.start(problem, 7)
    team.start(problem, 7)
    base, mixed = plain.pending_requests(), team.pending_requests()
    assert [r.messages for r in mixed[::2]] == [r.messages for r in base[::2]]
    assert "do not write code" in mixed[1].messages[-1].content and "do not write code" not in base[1].messages[-1].content
    assert [r.temperature for r in mixed] == [0.7, 1.0, 0.7] and [r.seed for r in mixed] == [r.seed for r in base]
    env = deliberation_env.parallel_env(**SIM, roles=TEAM, confidence="critic_text")
    env.reset(seed=3)
    env.deliberation.begin_round([1, 1, 1])
    refines = env.deliberation.pending_requests()
    assert "in words and arithmetic" in refines[1].messages[-1].content
    assert "in words and arithmetic" not in refines[0].messages[-1].content
    assert refines[1].temperature == 1.0
    env.receive(env.backends[0].generate(refines))
    core = env.deliberation
    critics = core.pending_requests()
    assert [c.messages for c in critics] == [env.task.critic_messages(core.problem, core.agents[c.agent].text)
                                              for c in critics] and len(critics) == 3


def test_features_v3_add_the_role_one_hot_and_leave_older_layouts_alone():
    assert features.num_features("v3") == 29 and features.feature_names("v3")[:23] == features.feature_names("v2")
    env = deliberation_env.parallel_env(**SIM, roles=TEAM, features="v3")
    observations, _ = env.reset(seed=0)
    roles = features.ROLE_OFFSET
    tools = features.TOOL_OFFSET
    assert observations["agent_0"]["self"][roles:tools].tolist() == [1, 0, 0, 0]
    assert observations["agent_1"]["self"][roles:tools].tolist() == [0, 1, 0, 0]
    assert observations["agent_0"]["peers"][:, roles:tools].tolist() == [[0, 1, 0, 0], [1, 0, 0, 0]]  # agents 1, 2
    plain = deliberation_env.parallel_env(**SIM, features="v3")
    observations, _ = plain.reset(seed=0)
    assert all(o["self"][roles:tools].tolist() == [1, 0, 0, 0] for o in observations.values())
    for name, width in (("v1", 16), ("v2", 23)):
        env = deliberation_env.parallel_env(**SIM, roles=TEAM, features=name)
        assert env.reset(seed=0)[0]["agent_0"]["self"].shape == (width,)
    v2 = deliberation_env.parallel_env(**SIM, roles=TEAM, features="v2").reset(seed=0)[0]
    v3 = deliberation_env.parallel_env(**SIM, roles=TEAM, features="v3").reset(seed=0)[0]
    assert np.array_equal(v2["agent_2"]["self"], v3["agent_2"]["self"][:23])  # the signal columns kept their places


@pytest.fixture(scope="module")
def team_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("sets") / "sim-team"
    record(["--out", str(out), "--split", "test", "--problems", "0:3", "--streams", "1", "--rounds", "1",
            "--backend", "sim", "--task-option", "levels=[0,1]", "--max-tokens", "64", "--agents", "3",
            "--env-option", f"roles={TEAM!r}"])
    return out


def test_a_team_set_records_its_roles_and_replays_equal_to_live(team_set):
    replayed = replay_env(str(team_set), split="test", invalid_action="persist", features="v3")
    assert [r.name for r in replayed.config.roles] == ["plain", "words", "plain"]
    live = deliberation_env.parallel_env(**SIM, split="test", streams=1, roles=TEAM,
                                         confidence=replayed.config.confidence,
                                         invalid_action="persist", features="v3")
    for problem in replayed.problems:
        for joint in itertools.product(range(3), repeat=3):
            options = {"problem_id": problem.id}
            a, b = replayed.reset(seed=0, options=options), live.reset(seed=0, options=options)
            for agent in a[0]:
                assert np.array_equal(a[0][agent]["self"], b[0][agent]["self"])
            stepped = replayed.step({f"agent_{i}": x for i, x in enumerate(joint)})
            expected = live.step({f"agent_{i}": x for i, x in enumerate(joint)})
            assert stepped[4] == expected[4]
    assert replayed.backends[0].misses == 0


def test_a_set_serves_only_the_team_it_recorded(team_set):
    with pytest.raises(ReplayError, match="was recorded with roles="):
        replay_env(str(team_set), split="test", roles=None)
    with pytest.raises(ReplayError, match="was recorded with roles="):
        replay_env(str(team_set), split="test", roles=["plain", "plain", "plain"])
    with pytest.raises(ReplayError, match="was recorded with roles=None"):
        replay_env("qwen05-arith-v2", split="test", roles=TEAM)


def test_the_text_env_prompts_each_agent_in_its_role():
    env = deliberation_env.TextDeliberationEnv(task="arithmetic", task_kwargs={"levels": [0, 1]}, roles=TEAM,
                                               max_rounds=1)
    observations, _ = env.reset(seed=0)
    assert "do not write code" in observations["agent_1"]["messages"][-1]["content"]
    assert "do not write code" not in observations["agent_0"]["messages"][-1]["content"]


def test_a_meta_trainer_trains_a_team_with_role_features(tmp_path):
    from baselines.meta.train import main as train

    policy = train(["--algo", "softrankpo", "--episodes", "32", "--num-envs", "8", "--group-size", "4",
                    "--groups-per-batch", "4", "--sft-episodes", "0", "--out", str(tmp_path), "--env-option",
                    f"roles={TEAM!r}", "--env-option", "features=v3", "--no-progress", "--no-tensorboard",
                    "--no-evaluate"])
    assert policy.layout.self_dim == 29
