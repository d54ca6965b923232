"""The text-action env: PettingZoo API, equality with the meta-action env, named rewards, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pettingzoo.test import parallel_api_test, parallel_seed_test

from deliberation_env.backends import SimBackend
from deliberation_env.backends.base import Completion, estimate_tokens
from deliberation_env.core.deliberation import Deliberation
from deliberation_env.env import DeliberationEnv
from deliberation_env.text import KINDS, text_env
from deliberation_env.text_rewards import ROUND_REWARDS, TURN_REWARDS


class RecountedSim:
    """The sim's texts, with completion tokens counted from the text as the text env counts them."""

    def __init__(self):
        self.sim = SimBackend()

    def generate(self, requests):
        return [Completion(c.text, c.prompt_tokens, estimate_tokens(c.text)) for c in self.sim.generate(requests)]

    def identity(self) -> str:
        return "recounted-sim"


def oracle(observations, infos):
    return {agent: infos[agent]["oracle_action"] for agent in observations}


def debate(observations, infos):
    return dict.fromkeys(observations, 1)


def meta_rounds(seed, policy, **options):
    """Per round of the meta-action env fed the sim's completions: (infos, rewards)."""
    env = DeliberationEnv(backend=RecountedSim(), **options)
    observations, infos = env.reset(seed=seed)
    rounds = [(infos, dict.fromkeys(infos, 0.0))]
    while env.agents:
        observations, rewards, _, _, infos = env.step(policy(observations, infos))
        rounds.append((infos, rewards))
    return rounds


def play_text(env, seed, writer):
    """One text-env episode; ``writer(env, agent, request)`` gives each completion. Returns the step tuples."""
    steps = [env.reset(seed=seed)]
    while env.agents:
        requests = env.requests
        actions = {agent: writer(env, agent, requests[agent]) if agent in requests else "" for agent in env.agents}
        steps.append(env.step(actions))
    return steps


def sim_writer():
    backend = RecountedSim()
    return lambda env, agent, request: backend.generate([request])[0].text


def text_rounds(steps):
    """The per-round (infos, rewards) the text env reports in infos["rounds"]."""
    rounds = []
    for _, _, _, _, infos in steps[1:]:
        for k in range(infos["agent_0"]["rounds_closed"]):
            per_agent = {agent: dict(info["rounds"][k]) for agent, info in infos.items()}
            rewards = {agent: info.pop("reward") for agent, info in per_agent.items()}
            rounds.append((per_agent, rewards))
    return rounds


@pytest.mark.parametrize("policy, options", [
    (debate, {}),
    (oracle, {}),
    (oracle, {"confidence": "answer_logprobs"}),
    (oracle, {"critic": "sim-recounted", "concede_target": "plurality"}),
])
def test_same_seed_and_completions_give_the_meta_envs_episode(policy, options):
    meta_options = {k: v for k, v in options.items() if k != "critic"}
    if options.get("critic"):
        options = {**options, "critic": RecountedSim()}
    for seed in (0, 1, 2, 7):
        expected = meta_rounds(seed, policy, max_rounds=3, **meta_options)
        steps = play_text(text_env(meta_policy=policy, max_rounds=3, **options), seed, sim_writer())
        assert text_rounds(steps) == expected
        last_infos = steps[-1][4]
        for agent, info in last_infos.items():  # the last step's top-level infos are the last round's
            assert {k: info[k] for k in expected[-1][0][agent] if not k.startswith("reward_")} == \
                {k: v for k, v in expected[-1][0][agent].items() if not k.startswith("reward_")}
        total = {agent: sum(step[1][agent] for step in steps[1:]) for agent in last_infos}
        assert total == pytest.approx({agent: sum(r[agent] for _, r in expected) for agent in total})


def test_critic_turns_belong_to_the_agents_unless_a_backend_serves_them():
    kinds = [{o["kind"] for o in step[0].values()} for step in play_text(text_env(), 3, sim_writer())]
    assert kinds == [{1}, {3}, {2}, {3}, {2}, {3}, {2}, {3}, {0}]  # solve, critic, (refine, critic) x 3, done
    served = play_text(text_env(critic=RecountedSim()), 3, sim_writer())
    assert [{o["kind"] for o in step[0].values()} for step in served] == [{1}, {2}, {2}, {2}, {0}]
    persist = play_text(text_env(meta_policy="self_consistency"), 3, sim_writer())
    assert len(persist) == 3 and persist[-1][4]["agent_0"]["rounds_closed"] == 4  # round 0 and 3 PERSIST rounds


def test_parallel_api_test():
    parallel_api_test(text_env(), num_cycles=50)
    parallel_api_test(text_env(meta_policy=oracle, critic="sim", num_agents=2), num_cycles=50)
    parallel_seed_test(lambda: text_env(max_action_chars=64), num_cycles=20)


def test_observations_are_the_cores_prompts_and_stay_in_their_spaces():
    env = text_env(num_agents=4)
    checked = set()

    def writer(env, agent, request):
        observation = env._observations()[agent]
        assert env.observation_space(agent).contains(observation)
        assert KINDS[observation["kind"]] == request.kind
        assert observation["messages"] == tuple(m.as_dict() for m in request.messages)
        checked.add(request.kind)
        return RecountedSim().generate([request])[0].text

    for seed in range(3):
        for step in play_text(env, seed, writer):
            for agent, observation in step[0].items():
                assert env.observation_space(agent).contains(observation)
    assert checked == {"solve", "refine", "critic"}
    env.reset(seed=0)
    problem = env.deliberation.problem
    assert env.requests["agent_0"].messages == env.task.solve_messages(problem)


def test_named_rewards_are_logged_and_weighted():
    weights = {"correct": 2.0, "format": 0.5, "length": 0.01, "calibration": 1.0, "consensus_correct": 3.0,
               "local": 0.3, "global": 0.7, "team": 1.5, "tokens": 0.001, "team_turn": 0.25}
    env = text_env(reward_weights=weights)
    observations, _ = env.reset(seed=0)
    gold = env.deliberation.problem.answer
    texts = {"agent_0": f"Step 1.\nThe answer is {gold}.", "agent_1": f"The answer is {int(gold) + 1}.",
             "agent_2": "I do not know."}
    _, rewards, _, _, infos = env.step(texts)
    for agent, correct, readable in (("agent_0", 1, 1), ("agent_1", 0, 1), ("agent_2", 0, 0)):
        info = infos[agent]
        assert (info["reward_correct"], info["reward_format"]) == (correct, readable)
        assert info["reward_length"] == -estimate_tokens(texts[agent]) and info["kind"] == "solve"
        assert rewards[agent] == pytest.approx(2 * correct + 0.5 * readable - 0.01 * estimate_tokens(texts[agent])
                                               + 0.25 * info["reward_team_turn"])
    # the team's term: every agent, whether its own answer is right or readable
    assert len({info["reward_team_turn"] for info in infos.values()}) == 1
    _, rewards, _, _, infos = env.step({"agent_0": "Yes\nConfidence: 0.9", "agent_1": "Confidence: 0.9",
                                        "agent_2": "hmm"})
    assert infos["agent_0"]["reward_calibration"] == pytest.approx(-0.01)
    assert infos["agent_1"]["reward_calibration"] == pytest.approx(-0.81)
    assert infos["agent_2"]["reward_format"] == 0.0 and infos["agent_2"]["confidence_source"] == "default"
    # Every step of an episode: the reward is the weighted sum of the terms logged by name.
    names = (*ROUND_REWARDS, *TURN_REWARDS)
    for step in play_text(env, 5, sim_writer())[1:]:
        for agent, info in step[4].items():
            assert step[1][agent] == pytest.approx(sum(weights[n] * info[f"reward_{n}"] for n in names))
    assert step[4]["agent_0"]["reward_consensus_correct"] == float(step[4]["agent_0"]["consensus_correct"])
    assert step[4]["agent_0"]["reward_team_turn"] == float(step[4]["agent_0"]["consensus_correct"])  # the last step


def test_score_rates_candidates_without_advancing():
    env = text_env(reward_weights={"correct": 1.0, "format": 0.25})
    env.reset(seed=0)
    gold = env.deliberation.problem.answer
    before = env.requests
    scores = env.score("agent_1", [f"The answer is {gold}.", "The answer is -1.", "no idea"])
    assert [s["correct"] for s in scores] == [1.0, 0.0, 0.0] and [s["format"] for s in scores] == [1.0, 1.0, 0.0]
    assert [s["reward"] for s in scores] == [1.25, 0.25, 0.0]
    assert env.requests == before and env.deliberation.agents[1].answer is None
    # G episodes of one seed start from the same prompt (the group of group-relative methods).
    first = [text_env().reset(seed=11)[0]["agent_0"]["messages"] for _ in range(3)]
    assert first[0] == first[1] == first[2]
    play_text(env, 0, sim_writer())
    with pytest.raises(ValueError, match="no request"):
        env.score("agent_0", ["x"])


def test_an_agent_with_several_requests_answers_them_in_turn():
    class SolveTwice(Deliberation):
        def _request_generation(self, jobs):
            super()._request_generation([job for job in jobs for _ in range(2)] if self._starting else jobs)

    env = text_env(num_agents=2)
    env.meta.deliberation = SolveTwice(env.task, env.config)
    observations, _ = env.reset(seed=0)
    gold = env.deliberation.problem.answer
    observations, *_ = env.step({"agent_0": "The answer is -1.", "agent_1": "The answer is -1."})
    assert {o["kind"] for o in observations.values()} == {1}  # each agent's second solve
    observations, *_, infos = env.step({"agent_0": f"The answer is {gold}.", "agent_1": "The answer is -2."})
    assert {o["kind"] for o in observations.values()} == {3}
    assert [a.answer for a in env.deliberation.agents] == [gold, "-2"]


def test_bad_input_gets_a_clear_error():
    env = text_env(max_action_chars=10)
    assert env.action_space("agent_0").max_length == 10
    with pytest.raises(RuntimeError, match="before reset"):
        env.step({"agent_0": ""})
    env.reset(seed=0)
    with pytest.raises(TypeError, match="action of agent_1 must be a str"):
        env.step({"agent_0": "1", "agent_1": 42, "agent_2": "1"})
    with pytest.raises(ValueError, match="has 11 characters, more than the action space's max_length 10"):
        env.step({"agent_0": "1", "agent_1": "x" * 11, "agent_2": "1"})
    with pytest.raises(KeyError, match="missing \\['agent_2'\\]"):
        env.step({"agent_0": "1", "agent_1": "1"})
    env.step({"agent_0": "1", "agent_1": "1", "agent_2": "1"})  # the failed calls changed nothing
    with pytest.raises(ValueError, match="unknown reward components \\['corect'\\]"):
        text_env(reward_weights={"corect": 1.0})
    with pytest.raises(ValueError, match="must be a finite number"):
        text_env(reward_weights={"format": math.nan})
    with pytest.raises(ValueError, match="named schedules"):
        text_env(meta_policy="debat")
    with pytest.raises(TypeError, match="takes no backend"):
        text_env(backend="sim")
    with pytest.raises(ValueError, match="max_prompt_chars=10"):
        text_env(max_prompt_chars=10).reset(seed=0)
    bad_policy = text_env(meta_policy=lambda observations, infos: [1, 1, 1])
    bad_policy.reset(seed=0)
    bad_policy.step(dict.fromkeys(bad_policy.agents, "The answer is 1."))
    with pytest.raises(TypeError, match="meta_policy must return a dict"):
        bad_policy.step(dict.fromkeys(bad_policy.agents, "Confidence: 1"))
    with pytest.raises(RuntimeError, match="interrupted"):
        bad_policy.step(dict.fromkeys(bad_policy.agents, ""))
    assert bad_policy.reset(seed=1)[0]["agent_0"]["kind"] == 1


def test_action_space_samples_are_valid_actions():
    space = text_env(max_action_chars=64).action_space("agent_0")
    space.seed(0)
    samples = [space.sample() for _ in range(20)]
    assert all(space.contains(s) and len(s) <= 64 for s in samples)
    assert space.contains("ünïcode ✓\n") and not space.contains(b"bytes") and not space.contains("x" * 65)
    assert np.unique([len(s) for s in samples]).size > 1
