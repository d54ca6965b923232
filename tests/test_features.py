"""Feature sets of the observation: v1 pinned column by column, v2's completion signals hand-checked, neutral
values without log-probabilities, spaces, and v2 on the sim and on a replay set."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

import deliberation_env
from deliberation_env.analysis.traces import read_traces
from deliberation_env.backends.base import Completion
from deliberation_env.core import Action, features
from deliberation_env.make import replay_env
from deliberation_env.record import main as record
from deliberation_env.replay.dataset import request_key
from tests.test_core import ScriptedBackend
from tests.test_replay import SIM_FLAGS, play_all_joint_actions, sim_live

V1_WIDTH, V2_WIDTH = 16, 23


def scripted_env(backend, **options):
    return deliberation_env.parallel_env(backend=backend, **options)


# ------------------------------------------------------------------ v1: the default layout, pinned
def test_v1_is_the_default_and_its_rows_are_pinned():
    env = scripted_env(ScriptedBackend(["42", "41", "41"], [0.9, 0.6, 0.2]))
    assert env.config.features == "v1" and features.feature_names("v1") == features.FEATURES
    assert features.num_features("v1") == features.NUM_FEATURES == V1_WIDTH
    obs, _ = env.reset(seed=0)
    profile = [0.1, 5 / 512, 0, 0, 0, 0, 0]  # one line, 5 of 512 tokens, no '=', no check, no hedge, round 0
    expected = np.array([[1, 1 / 3, 0, 0.9, *profile, 1, 0, 0, 0, 0],
                         [1, 2 / 3, 1, 0.6, *profile, 1, 0, 0, 0, 0],
                         [1, 2 / 3, 1, 0.2, *profile, 1, 0, 0, 0, 0]], dtype=np.float32)
    np.testing.assert_array_equal(obs["agent_0"]["self"], expected[0])
    np.testing.assert_array_equal(obs["agent_0"]["peers"], expected[[1, 2]])
    np.testing.assert_array_equal(obs["agent_0"]["agreement"], [0, 0])
    np.testing.assert_array_equal(obs["agent_1"]["agreement"], [1, 0])
    np.testing.assert_array_equal(env.state(), expected.ravel())
    assert env.observation_space("agent_0")["self"].shape == (V1_WIDTH,)
    assert env.state_space.shape == (3 * V1_WIDTH,)
    obs, *_ = env.step({"agent_0": Action.REFINE, "agent_1": Action.PERSIST, "agent_2": Action.CONCEDE})
    row = obs["agent_0"]["self"]
    assert row[9] == pytest.approx(1 / 3) and list(row[11:15]) == [0, 0, 1, 0] and row[15] == pytest.approx(1 / 3)
    flat = scripted_env(ScriptedBackend(["42", "41", "41"], [0.9, 0.6, 0.2]), observation="flat")
    assert flat.observation_space("agent_0").shape == (3 * V1_WIDTH + 2 + 3,)


# ------------------------------------------------------------------ v2: signals of the completion
class SignalBackend(ScriptedBackend):
    """Solutions with chosen texts, token log-probabilities and finish reasons; critics as ScriptedBackend."""

    SOLUTIONS = {
        0: Completion("6 * 7 = 42\nThe answer is 42.", 10, 5, finish_reason="stop", token_logprobs=(
            ("6 * 7 = ", -0.1), ("42", -0.2), ("\nThe answer is ", -0.3), ("42", -0.4), (".", 0.0))),
        1: Completion("6 * 7 = 41\n```python\nprint(6 * 7)\n```\nThe answer is 41.", 10, 5, finish_reason="length"),
        2: Completion("The answer is 41.", 10, 5, token_logprobs=(("The answer is 41.", math.nan),)),
    }

    def generate(self, requests):
        self.requests = list(requests)
        critics = iter(super().generate([r for r in requests if r.kind == "critic"]))
        return [next(critics) if r.kind == "critic" else self.SOLUTIONS[r.agent] for r in requests]


def test_v2_columns_are_computed_from_the_completion_by_hand():
    backend = SignalBackend(["42", "41", "41"], [0.9, 0.6, 0.2])
    env = scripted_env(backend, features="v2")
    obs, infos = env.reset(seed=0)
    assert [info["answer"] for info in infos.values()] == ["42", "41", "41"]
    assert features.feature_names("v2")[V1_WIDTH:] == features.SIGNAL_FEATURES
    signals = {name: [obs[a]["self"][V1_WIDTH + k] for a in env.agents] for k, name in enumerate(features.SIGNAL_FEATURES)}
    assert signals["logprobs"] == [1, 0, 0]  # agent 2's only log-probability is not a number
    assert signals["answer_prob"] == pytest.approx([math.exp(-0.4), 0.5, 0.5])  # the answer's last occurrence
    assert signals["stopped"] == [1, 0, 1]
    assert signals["answer_repeats"] == pytest.approx([2 / 5, 2 / 5, 1 / 5])
    assert signals["equations_valid"] == [1, 0, 0.5]  # 6 * 7 = 42 holds, 6 * 7 = 41 does not, none to check
    assert signals["code"] == [0, 1, 0]
    assert signals["target_in_consensus"] == [1, 0, 0]  # consensus 41: agent 0's target holds it
    state = env.deliberation.agents[0].signals
    assert (state.mean_logprob, state.min_logprob, state.completion_tokens) == (pytest.approx(-0.2), -0.4, 5)
    np.testing.assert_array_equal(obs["agent_0"]["self"][:V1_WIDTH],
                                  scripted_env(SignalBackend(["42", "41", "41"], [0.9, 0.6, 0.2])).reset(seed=0)[0]
                                  ["agent_0"]["self"])  # v2 begins with v1's row

    obs, *_ = env.step({"agent_0": Action.PERSIST, "agent_1": Action.PERSIST, "agent_2": Action.CONCEDE})
    np.testing.assert_array_equal(obs["agent_2"]["self"][V1_WIDTH:-1], obs["agent_0"]["self"][V1_WIDTH:-1])
    assert [obs[a]["self"][-1] for a in env.agents] == [0, 1, 0]  # 42 holds the plurality now; agent 1 would adopt it


def test_v2_asks_for_token_logprobs_without_changing_replay_keys():
    for feature_set, asked in (("v1", False), ("v2", True)):
        backend = SignalBackend(["42", "41", "41"], [0.9, 0.6, 0.2])
        env = scripted_env(backend, features=feature_set)
        env.deliberation.start(env.problems[0], 5)
        solves = env.deliberation.pending_requests()
        assert all(r.token_logprobs is asked and r.kind == "solve" for r in solves)
        for request in solves:
            assert request_key(request) == request_key(replace(request, token_logprobs=not asked))


def test_v2_neutral_values_without_logprobs_finish_reason_or_equations():
    env = scripted_env(ScriptedBackend(["42", None, "41"], [0.9, 0.6, 0.2]), features="v2")
    obs, _ = env.reset(seed=0)
    extra = np.array([obs[a]["self"][V1_WIDTH:] for a in env.agents])
    #                 logprobs answer_prob stopped repeats equations code target_in_consensus
    np.testing.assert_array_equal(extra, np.array([[0, 0.5, 1, 0.2, 0.5, 0, 0],  # its target (41) is outvoted
                                                   [0, 0.5, 1, 0.0, 0.5, 0, 1],  # no answer: its target holds 42
                                                   [0, 0.5, 1, 0.2, 0.5, 0, 1]], dtype=np.float32))
    assert features.NO_SIGNALS.row() == (0.0, 0.5, 1.0, 0.0, 0.5, 0.0)


@pytest.mark.parametrize("observation", ["dict", "flat", "masked"])
def test_v2_spaces_are_built_once_and_contain_every_observation(observation):
    env = deliberation_env.parallel_env(features="v2", observation=observation, invalid_action="persist")
    space = env.observation_space("agent_0")
    width = 3 * V2_WIDTH + 2
    if observation == "dict":
        assert space["self"].shape == (V2_WIDTH,) and space["peers"].shape == (2, V2_WIDTH)
    else:
        vector = space if observation == "flat" else space["observation"]
        assert vector.shape == (width + (3 if observation == "flat" else 0),)
    assert env.state_space.shape == (3 * V2_WIDTH,)
    rng = np.random.default_rng(0)
    for seed in range(4):
        obs, _ = env.reset(seed=seed)
        while True:
            assert all(env.observation_space(a).contains(obs[a]) for a in obs)
            assert env.state_space.contains(env.state())
            if not env.agents:
                break
            obs, *_ = env.step({a: int(rng.integers(3)) for a in env.agents})
    assert env.observation_space("agent_0") is space


def test_v2_on_the_sim_keeps_v1_columns_rewards_and_infos():
    v1, v2 = (deliberation_env.parallel_env(features=f, invalid_action="persist") for f in ("v1", "v2"))
    rng = np.random.default_rng(1)
    for seed in range(5):
        (obs1, info1), (obs2, info2) = v1.reset(seed=seed), v2.reset(seed=seed)
        while True:
            assert info1 == info2
            for agent in obs1:
                np.testing.assert_array_equal(obs2[agent]["self"][:V1_WIDTH], obs1[agent]["self"])
                assert obs2[agent]["self"][V1_WIDTH] == 1  # the sim gives token log-probabilities
            if not v1.agents:
                break
            actions = {a: int(rng.integers(3)) for a in v1.agents}
            obs1, rewards1, _, _, info1 = v1.step(actions)
            obs2, rewards2, _, _, info2 = v2.step(actions)
            assert rewards1 == rewards2


def test_unknown_feature_set_is_a_clear_error():
    with pytest.raises(ValueError, match=r"features must be one of \('v1', 'v2', 'v3'"):
        deliberation_env.parallel_env(features="v4")


def test_traces_record_the_feature_set(tmp_path):
    env = deliberation_env.parallel_env(features="v2", trace=str(tmp_path / "t.jsonl"), max_rounds=1)
    env.reset(seed=0)
    env.step({a: 0 for a in env.agents})
    env.close()
    assert read_traces(tmp_path / "t.jsonl")[0].options["features"] == "v2"


def test_replay_with_v2_equals_the_live_sim_with_no_miss(tmp_path):
    out = tmp_path / "sim-arith"
    record(["--out", str(out), "--split", "test", "--problems", "0:2", "--streams", "1", "--rounds", "1", *SIM_FLAGS])
    replayed = replay_env(out, split="test", features="v2", confidence="critic_text", invalid_action="persist")
    assert replayed.observation_space("agent_0")["self"].shape == (V2_WIDTH,)
    played = play_all_joint_actions(replayed, sim_live(rounds=1, streams=1, features="v2"),
                                    ["arithmetic-test-0", "arithmetic-test-1"], seeds=(0,))
    assert played == 2 * 27 and replayed.backends[0].misses == 0
    obs, _ = replayed.reset(seed=0)
    assert all(obs[a]["self"][V1_WIDTH] == 1 for a in obs)  # recorded token log-probabilities reach v2


# ------------------------------------------------------------------ the text signals
@pytest.mark.parametrize(("expression", "value"), [
    ("3 + 4 * 2", 11.0), ("10 - 2 - 3", 5.0), ("8 / 2 * 4", 16.0), (r"3 \times 4", 12.0), ("5 - -2", 7.0),
    ("7 ÷ 2", 3.5), ("1 / 0", None),
])
def test_equations_are_evaluated_with_precedence(expression, value):
    assert features.evaluate(expression) == value


def test_text_signals_count_equations_answers_and_code():
    text = "18 - 8 = 10, 3 + 4 + 5 = 13 and \\(2 \\times 3 = 6\\).\n```python\nx = 1\n```\nThe answer is 10."
    signals = features.completion_signals(Completion(text, 1, 1), "10")
    assert (signals.equations_right, signals.equations_wrong, signals.answer_repeats, signals.code) == (2, 1, 2, True)
    assert not signals.logprobs and signals.answer_logprob is None and signals.stopped


def test_text_env_spaces_follow_the_feature_set():
    for feature_set in ("v1", "v2"):
        env = deliberation_env.text_env(num_agents=3, max_rounds=1, features=feature_set)
        observations, _ = env.reset(seed=4)
        for agent, observation in observations.items():
            assert observation["features"]["self"].shape == (features.num_features(feature_set),)
            assert env.observation_space(agent).contains(observation)
