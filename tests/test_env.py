"""The PettingZoo adapter: API conformance, determinism, containment, bad input, render."""

from __future__ import annotations

import numpy as np
import pytest
from pettingzoo.test import api_test, parallel_api_test, parallel_seed_test

import deliberation_env
from deliberation_env import Action
from deliberation_env.backends import SimBackend, SimConfig
from deliberation_env.tasks.arithmetic import ArithmeticTask
from deliberation_env.tasks.base import Problem

INFO_KEYS = {"answer", "confidence", "tokens", "consensus", "reward_local", "reward_global", "correct",
             "consensus_correct", "concede_target_correct", "oracle_action", "confidence_source"}


def random_episode(env, seed, rng=None, check=None):
    """Play one episode with random legal actions; return the list of step tuples."""
    rng = rng or np.random.default_rng(seed)
    observations, infos = env.reset(seed=seed)
    trace = [(observations, infos)]
    if check:
        check(observations, infos)
    while env.agents:
        actions = {a: int(rng.choice(np.flatnonzero(observations[a]["action_mask"]))) for a in env.agents}
        observations, rewards, terminations, truncations, infos = env.step(actions)
        trace.append((actions, observations, rewards, terminations, truncations, infos))
        if check:
            check(observations, infos)
    return trace


def test_readme_quick_start_loop():
    env = deliberation_env.parallel_env(task="arithmetic", backend="sim", num_agents=3, max_rounds=3)
    obs, infos = env.reset(seed=0)
    steps = 0
    while env.agents:
        actions = {a: env.action_space(a).sample(obs[a]["action_mask"]) for a in env.agents}
        obs, rewards, terminations, truncations, infos = env.step(actions)
        steps += 1
    assert steps == 3 and all(terminations.values()) and not any(truncations.values())
    assert set(rewards) == {"agent_0", "agent_1", "agent_2"}


def test_parallel_api_test():
    parallel_api_test(deliberation_env.parallel_env(invalid_action="persist"), num_cycles=50)


def test_parallel_seed_test():
    """PettingZoo's own check (it compares the first step only; multi-step determinism is tested below)."""
    parallel_seed_test(lambda: deliberation_env.parallel_env(max_rounds=4), num_cycles=20)


def test_aec_api_test():
    env = deliberation_env.env(invalid_action="persist", num_agents=3, max_rounds=2)
    api_test(env, num_cycles=20)


@pytest.mark.parametrize("num_agents", [1, 2, 3, 5])
def test_every_observation_is_contained_and_infos_complete(num_agents):
    env = deliberation_env.parallel_env(num_agents=num_agents, max_rounds=4)
    assert len({id(env.observation_space(a)) for a in env.possible_agents}) == 1  # built once, shared

    def check(observations, infos):
        for agent, obs in observations.items():
            assert env.observation_space(agent).contains(obs), (agent, obs)
            assert obs["peers"].shape == (num_agents - 1, obs["self"].shape[0])
            assert set(infos[agent]) >= INFO_KEYS

    for seed in range(15):
        random_episode(env, seed, check=check)


def test_same_seed_same_whole_episode():
    def run():
        env = deliberation_env.parallel_env(max_rounds=5)
        return [random_episode(env, seed) for seed in (3, 4, 5)]

    first, second = run(), run()
    assert _equal(first, second)
    different = [random_episode(deliberation_env.parallel_env(max_rounds=5), seed) for seed in (6, 7, 8)]
    assert not _equal(first, different)


def test_reset_without_seed_continues_the_stream_reproducibly():
    def run():
        env = deliberation_env.parallel_env()
        env.reset(seed=11)
        return [env.reset()[1]["agent_0"]["problem_id"] for _ in range(5)]

    assert run() == run()
    assert len(set(run())) > 1


def _equal(a, b):
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


def test_problem_pinning_by_index_and_id():
    env = deliberation_env.parallel_env(split="test")
    _, infos = env.reset(seed=0, options={"problem_index": 7})
    assert infos["agent_0"]["problem_id"] == env.problems[7].id
    _, infos = env.reset(seed=1, options={"problem_id": env.problems[9].id})
    assert infos["agent_0"]["problem_id"] == env.problems[9].id
    with pytest.raises(ValueError, match=r"problem_index must be an integer in \[0, 500\)"):
        env.reset(options={"problem_index": 500})
    with pytest.raises(ValueError, match="no problem with id 'nope'"):
        env.reset(options={"problem_id": "nope"})


class FixedAnswers:
    """A backend that always writes the same answers, whatever the problem."""

    def identity(self):
        return "fixed"

    def generate(self, requests):
        from deliberation_env.backends.base import Completion

        texts = {0: "The answer is 5.", 1: "The answer is 6.", 2: "The answer is 5."}
        return [Completion("Yes\nConfidence: 0.6" if r.kind == "critic" else texts[r.agent], 3, 3) for r in requests]


def test_ground_truth_never_enters_observations():
    class TwoProblems(ArithmeticTask):
        def problems(self, split):
            return [Problem("a", "Q?", "5"), Problem("b", "Q?", "6")]

    env = deliberation_env.parallel_env(task=TwoProblems(), backend=FixedAnswers())
    obs_a, infos_a = env.reset(seed=0, options={"problem_index": 0})
    obs_b, infos_b = env.reset(seed=0, options={"problem_index": 1})
    assert infos_a["agent_0"]["correct"] and not infos_b["agent_0"]["correct"]
    assert _equal(obs_a, obs_b)  # the gold answer differs, the observations do not
    step_a = env.step({a: Action.REFINE for a in env.agents})
    env.reset(seed=0, options={"problem_index": 0})
    step_b = env.step({a: Action.REFINE for a in env.agents})
    assert _equal(step_a[0], step_b[0])


def test_infos_and_rewards_are_consistent():
    env = deliberation_env.parallel_env(reward_weights={"tokens": 0.001, "team": 1.0})
    for seed in range(10):
        trace = random_episode(env, seed)
        for actions, _, rewards, terminations, _, infos in trace[1:]:
            for agent, info in infos.items():
                expected = info["reward_local"] + info["reward_global"] + info["reward_team"] + 0.001 * info["reward_tokens"]
                assert rewards[agent] == pytest.approx(expected)
                assert info["reward_tokens"] == -info["tokens"]
                assert info["action"] == Action(actions[agent]).name
                assert info["reward_team"] == (float(info["consensus_correct"]) if terminations[agent] else 0.0)
        # PERSIST costs nothing; REFINE costs a generation and a critic call
        for actions, *_, infos in trace[1:]:
            for agent, action in actions.items():
                if action == Action.PERSIST:
                    assert infos[agent]["tokens"] == 0
                if action == Action.REFINE:
                    assert infos[agent]["tokens"] > 100


def test_early_stop_ends_on_unanimous_persist():
    env = deliberation_env.parallel_env(backend=FixedAnswers(), early_stop=True, max_rounds=5, num_agents=2)
    env.reset(seed=0)
    env.step({"agent_0": Action.CONCEDE, "agent_1": Action.PERSIST})  # agent 0 adopts 6: unanimous
    assert env.agents
    _, _, terminations, _, _ = env.step({a: Action.PERSIST for a in env.agents})
    assert all(terminations.values()) and env.agents == []


def test_heterogeneous_team_list_of_backends():
    strong, weak = SimBackend(SimConfig(skills=(0.95,))), SimBackend(SimConfig(skills=(0.05,)))
    env = deliberation_env.parallel_env(backend=[strong, weak, weak])
    right = np.zeros(3)
    for seed in range(60):
        _, infos = env.reset(seed=seed)
        right += [infos[f"agent_{i}"]["correct"] for i in range(3)]
    assert right[0] > 45 and right[1] < 20 and right[2] < 20


# ------------------------------------------------------------------ bad input
def test_step_before_reset_and_after_end():
    env = deliberation_env.parallel_env(max_rounds=1)
    with pytest.raises(RuntimeError, match="before reset"):
        env.step({a: 0 for a in env.possible_agents})
    env.reset(seed=0)
    env.step({a: 0 for a in env.possible_agents})
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step({a: 0 for a in env.possible_agents})
    env.reset(seed=1)  # usable again
    assert env.agents == env.possible_agents


@pytest.mark.parametrize(
    ("actions", "error", "message"),
    [
        ({"agent_0": 0, "agent_1": 0}, KeyError, r"missing \['agent_2'\]"),
        ({"agent_0": 0, "agent_1": 0, "agent_2": 0, "agent_9": 0}, KeyError, r"unknown \['agent_9'\]"),
        ({"agent_0": 3, "agent_1": 0, "agent_2": 0}, ValueError, "0=PERSIST"),
        ({"agent_0": -1, "agent_1": 0, "agent_2": 0}, ValueError, "not one of"),
        ({"agent_0": "refine", "agent_1": 0, "agent_2": 0}, ValueError, "not one of"),
        ([0, 0, 0], TypeError, "must be a dict"),
    ],
)
def test_bad_actions_raise_and_env_stays_usable(actions, error, message):
    env = deliberation_env.parallel_env()
    observations, _ = env.reset(seed=0)
    with pytest.raises(error, match=message):
        env.step(actions)
    env.step({a: Action.PERSIST for a in env.agents})  # nothing was consumed by the failed call
    assert env.deliberation.round == 1


def test_masked_concede_raises_or_persists():
    env = deliberation_env.parallel_env(backend=FixedAnswers(), num_agents=3, invalid_action="raise")
    observations, _ = env.reset(seed=0)
    # agents 0 and 2 answer 5, agent 1 answers 6: everyone has someone to concede to
    assert all(obs["action_mask"][Action.CONCEDE] for obs in observations.values())
    env.step({"agent_0": Action.PERSIST, "agent_1": Action.CONCEDE, "agent_2": Action.PERSIST})
    observations = env._observations()
    assert not observations["agent_0"]["action_mask"][Action.CONCEDE]  # unanimous now
    with pytest.raises(ValueError, match="CONCEDE is masked for agent_0.*invalid_action='raise'"):
        env.step({a: Action.CONCEDE for a in env.agents})
    lenient = deliberation_env.parallel_env(backend=FixedAnswers())  # the default: a masked action plays PERSIST
    lenient.reset(seed=0)
    lenient.step({"agent_0": Action.PERSIST, "agent_1": Action.CONCEDE, "agent_2": Action.PERSIST})
    _, _, _, _, infos = lenient.step({a: Action.CONCEDE for a in lenient.agents})
    assert {info["action"] for info in infos.values()} == {"PERSIST"}


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"task": "nope"}, KeyError, "unknown task 'nope'; registered tasks: .*arithmetic"),
        ({"backend": "gpt9"}, KeyError, "unknown backend 'gpt9'; registered backends: .*sim"),
        ({"num_agents": 0}, ValueError, "num_agents must be an integer >= 1"),
        ({"max_rounds": "3"}, ValueError, "max_rounds must be an integer"),
        ({"render_mode": "rgb_array"}, ValueError, "render_mode must be None or one of"),
        ({"invalid_action": "ignore"}, ValueError, "invalid_action must be one of"),
        ({"split": "validation"}, ValueError, "arithmetic has splits"),
        ({"concede_target": "random"}, ValueError, "concede_target must be one of"),
        ({"temprature": 0.5}, TypeError, r"unknown option\(s\) \['temprature'\]"),
        ({"backend": [SimBackend()]}, ValueError, "backend list has 1 entries but num_agents is 3"),
        ({"backend": 42}, TypeError, "backend must be a registered name"),
        ({"task": object()}, TypeError, "task must be a registered name or a Task"),
        ({"backend_kwargs": {"skills": (1.5,)}}, ValueError, "SimConfig.skills"),
        ({"backend_kwargs": {"skill": 0.5}}, TypeError, "SimConfig fields"),
    ],
)
def test_bad_config_errors_name_the_problem(kwargs, error, message):
    with pytest.raises(error, match=message):
        deliberation_env.parallel_env(**kwargs)


def test_reserved_task_names_are_registered():
    for name in ("gsm8k", "math", "aime24", "amc23", "mmlu", "humaneval", "arithmetic"):
        assert name in deliberation_env.TASKS


def test_render_ansi_and_human(capsys):
    env = deliberation_env.parallel_env(render_mode="ansi")
    env.reset(seed=0)
    text = env.render()
    assert "round 0/3" in text and text.count("agent_") == 3 and "consensus" in text
    env.step({a: Action.REFINE for a in env.agents})
    assert "action=REFINE" in env.render()
    human = deliberation_env.parallel_env(render_mode="human")
    human.reset(seed=0)
    human.step({a: Action.PERSIST for a in human.agents})
    assert "action=PERSIST" in capsys.readouterr().out


def test_metadata_and_spaces():
    env = deliberation_env.parallel_env()
    assert env.metadata["name"] == "deliberation_v0" and env.metadata["is_parallelizable"]
    assert set(env.metadata["render_modes"]) == {"ansi", "human"}
    assert env.possible_agents == ["agent_0", "agent_1", "agent_2"]
    assert env.action_space("agent_1").n == 3
    assert [a.value for a in Action] == [0, 1, 2] and Action.CONCEDE.name == "CONCEDE"
    env.reset(seed=0)
    assert env.state().shape == (3 * env.observation_space("agent_0")["self"].shape[0],)


def test_the_parts_form_and_the_flat_keywords_build_the_same_env():
    from deliberation_env.backends.sim import SimBackend
    from deliberation_env.core.deliberation import DeliberationConfig
    from deliberation_env.formats import ObservationFormat
    from deliberation_env.registry import TASKS

    config = DeliberationConfig(num_agents=2, max_rounds=2, early_stop=True, reward_weights={"team": 0.5})
    parts = deliberation_env.DeliberationEnv(TASKS.make("arithmetic"), SimBackend(), config, "test",
                                             format=ObservationFormat("flat", infos="numeric"))
    flat = deliberation_env.parallel_env(backend=SimBackend(), split="test", num_agents=2, max_rounds=2, early_stop=True,
                                         reward_weights={"team": 0.5}, observation="flat", infos="numeric")
    assert parts.config == flat.config and parts.invalid_action == flat.invalid_action == "persist"
    assert parts.observation_space("agent_0") == flat.observation_space("agent_0")
    for env in (parts, flat):
        env.reset(seed=3)
    for _ in range(2):
        if not parts.agents:
            break
        actions = {agent: 1 for agent in parts.agents}
        a, b = parts.step(actions), flat.step(actions)
        assert all(np.array_equal(a[0][k], b[0][k]) for k in a[0]) and a[1:] == b[1:]
    with pytest.raises(TypeError, match="either format= or"):
        deliberation_env.DeliberationEnv(format=ObservationFormat(), observation="flat")
