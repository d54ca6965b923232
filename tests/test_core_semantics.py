"""Round semantics that must not depend on agent order, seeds per round, and a core that survives
whatever a backend sends (regression tests of the hardening issue)."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import deliberation_env
from deliberation_env.backends.base import Completion
from deliberation_env.core import Action, Deliberation, DeliberationConfig, parse_confidence
from deliberation_env.core.rewards import check_weights
from deliberation_env.tasks.arithmetic import ArithmeticTask
from tests.test_core import PROBLEM, ScriptedBackend, answer_pending, started_deliberation

P, R, C = Action.PERSIST, Action.REFINE, Action.CONCEDE


def _play_round(deliberation, backend, actions):
    deliberation.begin_round(actions)
    answer_pending(deliberation, backend)
    return deliberation.finish_round()


# ------------------------------------------------------------- CONCEDE acts on the round-start state
def test_mutual_concede_swaps_the_two_answers():
    deliberation, backend = started_deliberation(["42", "41", "40"], [0.5, 0.9, 0.1])
    assert deliberation.concede_target(0) == 1 and deliberation.concede_target(1) == 0
    texts = [a.text for a in deliberation.agents]
    _play_round(deliberation, backend, [C, C, P])
    agents = deliberation.agents
    assert [a.answer for a in agents] == ["41", "42", "40"]
    assert [a.text for a in agents] == [texts[1], texts[0], texts[2]]
    assert [a.correct for a in agents] == [False, True, False]


def test_concede_chain_takes_the_target_answer_from_the_round_start():
    # agent 2 concedes to agent 0 while agent 0 concedes to agent 1: agent 2 gets agent 0's *old* answer.
    deliberation, backend = started_deliberation(["42", "41", "40"], [0.9, 0.5, 0.1])
    assert deliberation.concede_target(0) == 1 and deliberation.concede_target(2) == 0
    start_profile = deliberation.agents[0].profile
    _play_round(deliberation, backend, [C, P, C])
    agents = deliberation.agents
    assert [a.answer for a in agents] == ["41", "41", "42"]
    assert agents[2].correct and not agents[0].correct
    assert agents[2].profile[:-2] == start_profile[:-2]  # the text's profile travels with the text
    assert agents[2].profile[-1] == 1.0  # its answer changed


@pytest.mark.parametrize("trial", range(6))
def test_round_outcome_is_equivariant_under_agent_permutations(trial):
    """Relabel the agents: every agent's result must follow it, whatever its index."""
    rng = random.Random(trial)
    count = 4
    answers = [str(40 + rng.randrange(4)) for _ in range(count)]
    confidences = rng.sample([0.1, 0.3, 0.5, 0.7, 0.9], count)  # distinct: no index tie-breaks
    results = {}
    for order in itertools.permutations(range(count)):
        deliberation, backend = started_deliberation([answers[j] for j in order], [confidences[j] for j in order],
                                         num_agents=count)
        actions_by_original = {}
        for position, original in enumerate(order):
            legal = deliberation.action_mask(position)
            actions_by_original[original] = C if legal[C] and original % 2 == 0 else (R if original == 3 else P)
        _play_round(deliberation, backend, [actions_by_original[original] for original in order])
        results[order] = {original: (deliberation.agents[position].answer, deliberation.agents[position].correct)
                          for position, original in enumerate(order)}
    reference = results[tuple(range(count))]
    assert all(result == reference for result in results.values())


def test_every_concede_on_the_sim_receives_the_round_start_answer_of_its_target():
    env = deliberation_env.parallel_env(task="arithmetic", backend="sim", num_agents=4, max_rounds=3)
    rng = np.random.default_rng(0)
    concedes = mismatches = 0
    for episode in range(150):
        observations, infos = env.reset(seed=episode)
        while env.agents:
            start_answers = {a: infos[a]["answer"] for a in env.agents}
            targets = {a: infos[a]["concede_target"] for a in env.agents}
            actions = {a: int(rng.choice(np.flatnonzero(observations[a]["action_mask"]))) for a in env.agents}
            observations, _, _, _, infos = env.step(actions)
            for agent, action in actions.items():
                if action == C:
                    concedes += 1
                    mismatches += infos[agent]["answer"] != start_answers[targets[agent]]
    assert concedes > 100 and mismatches == 0


# ------------------------------------------------------------- profile and seeds of round 1
def test_profile_changed_is_set_by_a_round_one_refine():
    deliberation, backend = started_deliberation(["41", "41", "41"], [0.5, 0.6, 0.7])
    seeds = {}
    original_generate = backend.generate

    def recording(requests):
        for request in requests:
            seeds[(deliberation.request_round, request.kind, request.agent)] = request.seed
        return original_generate(requests)

    backend.generate = recording
    backend.answers[0] = "42"
    _play_round(deliberation, backend, [R, P, P])
    assert deliberation.agents[0].answer == "42"
    assert deliberation.agents[0].profile[-1] == 1.0  # the "changed" feature, 0 before the fix
    assert deliberation.feature_matrix()[0][10] == 1.0

    assert seeds[(1, "critic", 0)] != seeds[(1, "refine", 0)]


def test_critic_seed_of_round_one_differs_from_round_zero():
    deliberation = Deliberation(ArithmeticTask(), DeliberationConfig())
    backend = ScriptedBackend(["41", "42", "43"], [0.5, 0.6, 0.7])
    critic_seeds = []
    deliberation.start(PROBLEM, seed=7)
    while requests := deliberation.pending_requests():
        critic_seeds += [(0, r.agent, r.seed) for r in requests if r.kind == "critic"]
        deliberation.receive(backend.generate(requests))
    deliberation.begin_round([R, R, R])
    while requests := deliberation.pending_requests():
        critic_seeds += [(1, r.agent, r.seed) for r in requests if r.kind == "critic"]
        deliberation.receive(backend.generate(requests))
    by_agent = {}
    for round_, agent, seed in critic_seeds:
        by_agent.setdefault(agent, {})[round_] = seed
    assert all(seeds[0] != seeds[1] for seeds in by_agent.values())


# ------------------------------------------------------------- confidence and hostile completions
@pytest.mark.parametrize("logprobs, expected", [
    ({"Yes": 1000.0, "No": -1.0}, 1 / (1 + math.exp(-1))),  # impossible logprobs > 0 are clipped to 0: no overflow
    ({"Yes": math.inf, "No": -1.0}, 0.0),  # non-finite entries are ignored: only "No" is left
    ({"Yes": math.nan, "No": -0.1}, 0.0),
    ({"Yes": -1e308, "No": -1e308}, 0.5),
    ({"Yes": -800.0, "No": -801.0}, 1 / (1 + math.exp(-1))),  # both underflow exp(): normalised in log space
    ({" yes": -1.0, "YES": -1.0, "no": -1.0}, 2 / 3),
])
def test_parse_confidence_survives_extreme_logprobs(logprobs, expected):
    confidence, source = parse_confidence(Completion("", 1, 1, logprobs))
    assert source == "logprobs" and 0.0 <= confidence <= 1.0 and confidence == pytest.approx(expected)


def test_parse_confidence_ignores_garbage_logprobs():
    for garbage in ({"Yes": "high"}, {"Yes": None}, {1: -0.1}, {"Yes": True}, ["Yes"], "Yes", 3.0):
        confidence, source = parse_confidence(Completion("Confidence: 0.8", 1, 1, garbage))  # type: ignore[arg-type]
        assert (confidence, source) == (0.8, "verbalized")


_numbers = st.one_of(st.integers(-10**12, 10**12), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                     st.none(), st.text(max_size=3))
_logprob_maps = st.one_of(st.none(), st.dictionaries(st.one_of(st.sampled_from(["Yes", "No", " yes", "no "]), st.text()),
                                                     _numbers, max_size=4), st.text(max_size=5), st.integers())


class HostileBackend:
    """Returns arbitrary objects in place of completions, drawn by hypothesis."""

    def __init__(self, draw):
        self.draw = draw

    def identity(self):
        return "hostile"

    def generate(self, requests):
        return [self.draw() for _ in requests]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_observations_stay_in_their_space_whatever_a_backend_returns(data):
    def draw():
        text = data.draw(st.one_of(st.text(max_size=60), st.sampled_from(["The answer is 7.\ud800", "\udfff 12"]),
                                   st.none(), st.integers(), st.binary(max_size=5)))
        return Completion(text, data.draw(_numbers), data.draw(_numbers), data.draw(_logprob_maps))  # type: ignore[arg-type]

    env = deliberation_env.parallel_env(backend=HostileBackend(draw), num_agents=3, max_rounds=2)
    observations, infos = env.reset(seed=0)
    while True:
        for agent, observation in observations.items():
            assert env.observation_space(agent).contains(observation), (agent, observation)
            assert 0.0 <= infos[agent]["confidence"] <= 1.0 and infos[agent]["tokens"] >= 0
        if not env.agents:
            break
        actions = {a: int(data.draw(st.sampled_from(np.flatnonzero(observations[a]["action_mask"]).tolist())))
                   for a in env.agents}
        observations, rewards, _, _, infos = env.step(actions)
        assert all(math.isfinite(r) for r in rewards.values())


# ------------------------------------------------------------- bad settings, interrupted episodes
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "1", None, True])
def test_reward_weights_must_be_finite_numbers(bad):
    with pytest.raises(ValueError, match="must be a finite number"):
        check_weights({"local": bad})
    with pytest.raises(ValueError, match="reward_weights"):
        deliberation_env.parallel_env(reward_weights={"tokens": bad})


class FailingBackend:
    """The sim, except that the call number ``fail_on`` raises (like a server that went away)."""

    def __init__(self, fail_on):
        from deliberation_env.backends.sim import SimBackend

        self.sim, self.calls, self.fail_on = SimBackend(), 0, fail_on

    def identity(self):
        return "failing"

    def generate(self, requests):
        self.calls += 1
        if self.calls in self.fail_on:
            raise ConnectionError("server went away")
        return self.sim.generate(requests)


def test_a_step_after_a_failed_step_says_to_reset_and_reset_recovers():
    backend = FailingBackend(fail_on={3})  # reset makes calls 1-2 (solve, critic), the first step's refine is 3
    env = deliberation_env.parallel_env(backend=backend)
    env.reset(seed=0)
    with pytest.raises(ConnectionError):
        env.step(dict.fromkeys(env.agents, int(R)))
    with pytest.raises(RuntimeError, match=r"interrupted.*call env\.reset\(\)"):
        env.step(dict.fromkeys(env.possible_agents, int(P)))
    observations, _ = env.reset(seed=0)
    assert env.agents == env.possible_agents and set(observations) == set(env.agents)
    env.step(dict.fromkeys(env.agents, int(P)))


def test_a_failed_reset_leaves_no_live_agents():
    env = deliberation_env.parallel_env(backend=FailingBackend(fail_on={4}))
    env.reset(seed=0)
    assert env.agents
    with pytest.raises(ConnectionError):
        env.reset(seed=1)  # call 3 is its solve, call 4 its critic
    assert env.agents == []
    with pytest.raises(RuntimeError, match="reset"):
        env.step({})


def test_unknown_option_error_lists_every_accepted_option():
    import inspect

    with pytest.raises(TypeError) as error:
        deliberation_env.parallel_env(foo=1)
    message = str(error.value)
    named = [n for n, p in inspect.signature(deliberation_env.DeliberationEnv.__init__).parameters.items()
             if n != "self" and p.kind is not p.VAR_KEYWORD]
    for option in [*named, "reward_weights", "early_stop", "max_tokens", "temperature", "concede_target"]:
        assert option in message, option


# ------------------------------------------------------------- confidence from the answer's own tokens
def test_answer_confidence_is_the_probability_of_the_answer_tokens():
    from deliberation_env.core import answer_confidence

    pieces = (("The", -0.1), (" answer", -0.2), (" is", -0.1), (" 4", -0.5), ("2", -0.25), (".", -0.01))
    confidence, source = answer_confidence(Completion("The answer is 42.", 1, 6, token_logprobs=pieces), "42")
    assert source == "answer_logprobs" and confidence == pytest.approx(math.exp(-0.75))
    confidence, source = answer_confidence(Completion("The answer is 42.", 1, 6, token_logprobs=pieces), "7")
    assert source == "sequence_logprobs" and confidence == pytest.approx(math.exp(-1.16 / 6))
    for garbage in (None, "x", [("a", math.nan)], [(1, -0.1)], [("a", 5.0, 1)]):
        assert answer_confidence(Completion("a", 1, 1, token_logprobs=garbage), "a")[1] == "default"  # type: ignore[arg-type]
    assert answer_confidence(Completion("7", 1, 1, token_logprobs=(("7", 3.0),)), "7") == (1.0, "answer_logprobs")


class TokenLogprobBackend(ScriptedBackend):
    """Scripted solutions whose answer token has log-probability log(confidence); counts critic calls."""

    def generate(self, requests):
        completions = super().generate(requests)
        return [Completion(c.text, c.prompt_tokens, c.completion_tokens,
                           token_logprobs=(("The answer is ", 0.0), (c.text[len("The answer is "):-1],
                                                                     math.log(self.confidences[r.agent])), (".", 0.0))
                           if r.token_logprobs else None)
                for r, c in zip(requests, completions)]


def test_answer_logprobs_confidence_replaces_the_critic_and_concede_copies_it():
    deliberation = Deliberation(ArithmeticTask(), DeliberationConfig(confidence="answer_logprobs"))
    backend = TokenLogprobBackend(["42", "41", "40"], [0.9, 0.6, 0.3])
    deliberation.start(PROBLEM, seed=1)
    assert all(r.token_logprobs and not r.logprobs for r in deliberation.pending_requests())
    answer_pending(deliberation, backend)
    assert backend.calls == [["solve"] * 3]
    assert [a.confidence for a in deliberation.agents] == pytest.approx([0.9, 0.6, 0.3])
    _play_round(deliberation, backend, [P, P, C])  # agent 2 concedes to agent 0
    assert backend.calls == [["solve"] * 3]  # still no critic call
    assert deliberation.agents[2].answer == "42" and deliberation.agents[2].confidence == pytest.approx(0.9)


def test_critic_text_confidence_asks_for_no_logprobs():
    deliberation = Deliberation(ArithmeticTask(), DeliberationConfig(confidence="critic_text"))
    deliberation.start(PROBLEM, seed=1)
    answer_pending(deliberation, ScriptedBackend(["42"] * 3, [0.8] * 3))
    deliberation.begin_round([R, R, R])
    deliberation.receive(ScriptedBackend(["42"] * 3, [0.8] * 3).generate(deliberation.pending_requests()))
    critics = deliberation.pending_requests()
    assert critics and all(r.kind == "critic" and not r.logprobs for r in critics)
    with pytest.raises(ValueError, match="confidence must be one of"):
        DeliberationConfig(confidence="vibes")
