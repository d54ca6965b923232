"""The framework-free core: consensus, rewards, concede targets, masks, confidence parsing."""

from __future__ import annotations

import random

import pytest

from deliberation_env.backends.base import Completion
from deliberation_env.core import Action, Deliberation, DeliberationConfig, parse_confidence, plurality, support
from deliberation_env.core.rewards import RoundFacts, check_weights, global_reward, local_reward, reward_components
from deliberation_env.tasks.arithmetic import ArithmeticTask
from deliberation_env.tasks.base import Problem


# ---------------------------------------------------------------- consensus
def test_plurality_majority_wins_over_confidence():
    assert plurality(["7", "7", "9"], [0.1, 0.1, 0.99]) == "7"


def test_plurality_tie_broken_by_summed_confidence():
    assert plurality(["7", "9"], [0.4, 0.6]) == "9"
    assert plurality(["7", "9", "7", "9"], [0.5, 0.3, 0.5, 0.6]) == "7"  # 1.0 vs 0.9


def test_plurality_full_tie_is_deterministic_and_order_free():
    assert plurality(["9", "7"], [0.5, 0.5]) == "7"
    assert plurality(["7", "9"], [0.5, 0.5]) == "7"


def test_plurality_ignores_missing_answers_and_exclusion():
    assert plurality([None, None], [0.9, 0.9]) is None
    assert plurality([None, "3", "3"], [0.9, 0.1, 0.1]) == "3"
    assert plurality(["1", "2", "2"], [0.9, 0.1, 0.1], exclude=1) == "1"  # "1" vs "2" tie, conf 0.9 > 0.1
    assert plurality(["1"], [1.0], exclude=0) is None


def test_support_counts_all_agents():
    assert support(["a", "a", "b", None]) == [0.5, 0.5, 0.25, 0.0]


# ------------------------------------------------------------------ rewards
def _facts(before, after, consensus_ok, loo_ok, tokens=(0, 0, 0), final=False):
    return RoundFacts(tuple(before), tuple(after), consensus_ok, tuple(loo_ok), tuple(tokens), final)


def test_local_reward_is_change_in_own_correctness():
    facts = _facts([False, True, True], [True, False, True], True, [True, True, True])
    assert [local_reward(facts, i) for i in range(3)] == [1.0, -1.0, 0.0]


def test_global_reward_is_leave_one_out_contribution():
    # Consensus right; without agent 0 it would be wrong: agent 0 was pivotal.
    facts = _facts([True] * 3, [True] * 3, True, [False, True, True])
    assert [global_reward(facts, i) for i in range(3)] == [1.0, 0.0, 0.0]
    # Consensus wrong; without agent 2 it would be right: agent 2 hurt the team.
    facts = _facts([True] * 3, [True] * 3, False, [False, False, True])
    assert [global_reward(facts, i) for i in range(3)] == [0.0, 0.0, -1.0]


def test_team_and_token_components_and_weights():
    facts = _facts([False] * 3, [False] * 3, True, [True] * 3, tokens=(10, 0, 5), final=True)
    parts = reward_components(facts, 0)
    assert parts == {"local": 0.0, "global": 0.0, "team": 1.0, "tokens": -10.0}
    assert reward_components(_facts([0] * 3, [0] * 3, True, [1] * 3), 0)["team"] == 0.0
    assert check_weights({"tokens": 0.001})["tokens"] == 0.001
    with pytest.raises(ValueError, match="unknown reward components.*'bonus'"):
        check_weights({"bonus": 1.0})


# ------------------------------------------------ a deliberation driven by hand
class ScriptedBackend:
    """Answers with fixed texts: solve/refine texts per agent, confidences per agent."""

    def __init__(self, answers, confidences):
        self.answers, self.confidences, self.calls = answers, confidences, []

    def identity(self):
        return "scripted"

    def generate(self, requests):
        self.calls.append([r.kind for r in requests])
        out = []
        for request in requests:
            if request.kind == "critic":
                text = f"Yes\nConfidence: {self.confidences[request.agent]}"
            else:
                answer = self.answers[request.agent]
                text = "no idea" if answer is None else f"The answer is {answer}."
            out.append(Completion(text, 10, 5))
        return out


def answer_pending(deliberation, backend):
    while requests := deliberation.pending_requests():
        deliberation.receive(backend.generate(requests))


PROBLEM = Problem(id="p", question="What is 6 * 7?", answer="42")


def started_deliberation(answers, confidences, **config):
    deliberation = Deliberation(ArithmeticTask(), DeliberationConfig(**config))
    backend = ScriptedBackend(list(answers), list(confidences))
    deliberation.start(PROBLEM, seed=1)
    answer_pending(deliberation, backend)
    return deliberation, backend


def test_round_zero_solves_then_introspects_every_agent():
    deliberation, backend = started_deliberation(["42", "41", None], [0.9, 0.6, 0.2])
    assert backend.calls == [["solve"] * 3, ["critic"] * 3]
    assert [a.answer for a in deliberation.agents] == ["42", "41", None]
    assert [a.correct for a in deliberation.agents] == [True, False, False]
    assert [a.confidence for a in deliberation.agents] == [0.9, 0.6, 0.2]
    assert all(a.step_tokens == 30 for a in deliberation.agents)


def test_concede_adopts_most_confident_disagreeing_peer_without_generation():
    deliberation, backend = started_deliberation(["42", "41", "40"], [0.5, 0.9, 0.1])
    assert deliberation.concede_target(0) == 1 and deliberation.concede_target(2) == 1
    deliberation.begin_round([Action.PERSIST, Action.PERSIST, Action.CONCEDE])
    answer_pending(deliberation, backend)
    outcome = deliberation.finish_round()
    assert backend.calls[-1] == ["critic"]  # only the conceder is re-introspected
    assert deliberation.agents[2].answer == "41"
    assert outcome.consensus == "41" and not outcome.consensus_correct
    # agent 0 (right) is outvoted: without agent 2 it is a 42-vs-41 tie that 41 wins on confidence
    assert outcome.components[2]["global"] == 0.0
    assert outcome.components[2]["local"] == 0.0


def test_concede_plurality_target():
    deliberation, _ = started_deliberation(["42", "41", "41", "40"], [0.1, 0.2, 0.3, 0.99], num_agents=4, concede_target="plurality")
    assert deliberation.concede_target(0) == 2  # the peers' plurality 41, its most confident holder
    deliberation, _ = started_deliberation(["42", "41", "41", "40"], [0.1, 0.2, 0.3, 0.99], num_agents=4)
    assert deliberation.concede_target(0) == 3


def test_refine_sees_peers_and_rewards_pivotal_agent():
    deliberation, backend = started_deliberation(["41", "41", "42"], [0.5, 0.8, 0.7])
    backend.answers = ["42", "41", "42"]  # agent 0's refinement fixes its answer
    deliberation.begin_round([Action.REFINE, Action.PERSIST, Action.PERSIST])
    assert "41" in deliberation.pending_requests()[0].messages[-1].content  # own/peer answers in prompt
    answer_pending(deliberation, backend)
    outcome = deliberation.finish_round()
    assert outcome.consensus == "42" and outcome.consensus_correct
    assert outcome.components[0] == {"local": 1.0, "global": 1.0, "team": 0.0, "tokens": -30.0}
    assert outcome.rewards[0] == 2.0  # default weights: local 1, global 1, tokens 0
    # without agent 0 it is a 41 (0.8) vs 42 (0.7) tie that 41 wins: agent 0 was pivotal
    assert outcome.components[1]["global"] == 0.0


def test_masks_and_oracle_labels():
    deliberation, _ = started_deliberation(["42", "42", "41"], [0.5, 0.6, 0.7])
    assert list(deliberation.action_mask(0)) == [1, 1, 1]
    assert deliberation.oracle_action(0) == Action.PERSIST
    assert deliberation.oracle_action(2) == Action.CONCEDE
    deliberation, _ = started_deliberation(["41", "41", "41"], [0.5, 0.6, 0.7])
    assert list(deliberation.action_mask(0)) == [1, 1, 0]  # nobody to concede to
    assert deliberation.oracle_action(0) == Action.REFINE


def test_early_stop_on_unanimous_persist():
    deliberation, backend = started_deliberation(["42"] * 3, [0.9] * 3, early_stop=True, max_rounds=3)
    deliberation.begin_round([Action.PERSIST] * 3)
    assert deliberation.pending_requests() == []
    outcome = deliberation.finish_round()
    assert outcome.done and outcome.round == 1


def test_extractor_crash_means_no_answer():
    class Broken(ArithmeticTask):
        def extract_answer(self, text):
            raise RuntimeError("bug")

    deliberation = Deliberation(Broken(), DeliberationConfig())
    deliberation.start(PROBLEM, seed=0)
    answer_pending(deliberation, ScriptedBackend(["42"] * 3, [0.5] * 3))
    assert [a.answer for a in deliberation.agents] == [None] * 3


@pytest.mark.parametrize("bad", [{"num_agents": 0}, {"max_rounds": -1}, {"concede_target": "loudest"},
                                 {"temperature": -1.0}, {"num_agents": 2.5}, {"reward_weights": {"x": 1}}])
def test_config_rejects_nonsense(bad):
    with pytest.raises(ValueError) as error:
        DeliberationConfig(**bad)
    assert next(iter(bad)) in str(error.value) or "reward components" in str(error.value)


# --------------------------------------------------------- confidence parsing
@pytest.mark.parametrize(
    ("text", "expected", "source"),
    [
        ("Yes\nConfidence: 0.83", 0.83, "verbalized"),
        ("No. Confidence = 35%", 0.35, "verbalized"),
        ("confidence: 90", 0.9, "verbalized"),
        ("I'd say 0.4", 0.4, "verbalized"),
        ("Yes, it is right.", 0.75, "verdict"),
        ("no", 0.25, "verdict"),
        ("", 0.5, "default"),
        ("The solution looks plausible", 0.5, "default"),
    ],
)
def test_parse_confidence_from_text(text, expected, source):
    value, found = parse_confidence(Completion(text, 1, 1))
    assert value == pytest.approx(expected) and found == source


def test_parse_confidence_prefers_logprobs():
    value, source = parse_confidence(Completion("No", 1, 1, top_logprobs={"Yes": -0.5, " no": -1.5, "Maybe": -2.0}))
    assert source == "logprobs"
    assert value == pytest.approx(1 / (1 + pow(2.718281828, -1.0)), rel=1e-6)


def test_parse_confidence_never_raises_on_noise():
    rng = random.Random(0)
    alphabet = "yesno0123456789.%:= confidence\n"
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
        value, _ = parse_confidence(Completion(text, 1, 1))
        assert 0.0 <= value <= 1.0
