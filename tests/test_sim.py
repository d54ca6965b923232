"""The simulated backend: deterministic, and realistic in the ways the issue asks for."""

from __future__ import annotations

import numpy as np
import pytest

import deliberation_env
from deliberation_env import Action
from deliberation_env.backends import SimBackend, SimConfig
from deliberation_env.tasks.arithmetic import ArithmeticTask


def first_round_stats(episodes=300, **knobs):
    env = deliberation_env.parallel_env(backend_kwargs=knobs)
    correct, confidence_right, confidence_wrong, majority_wrong = np.zeros(3), [], [], 0
    for seed in range(episodes):
        _, infos = env.reset(seed=seed)
        for i in range(3):
            info = infos[f"agent_{i}"]
            correct[i] += info["correct"]
            (confidence_right if info["correct"] else confidence_wrong).append(info["confidence"])
        answers = [infos[f"agent_{i}"]["answer"] for i in range(3)]
        wrong = [a for a, i in zip(answers, range(3)) if not infos[f"agent_{i}"]["correct"] and a is not None]
        majority_wrong += len(wrong) >= 2 and len(set(wrong)) < len(wrong)
    return correct / episodes, np.mean(confidence_right), np.mean(confidence_wrong), majority_wrong / episodes


def test_heterogeneous_skill_informative_confidence_and_shared_wrong_answers():
    accuracy, conf_right, conf_wrong, shared_wrong = first_round_stats()
    assert accuracy[0] > accuracy[1] > accuracy[2]  # per-agent skill
    assert conf_right > conf_wrong + 0.1  # informative ...
    assert conf_wrong > 0.45  # ... but noisy and over-confident
    assert shared_wrong > 0.05  # wrong agents often agree: a majority can be wrong


def test_difficulty_lowers_accuracy():
    task = ArithmeticTask(levels=(1,))
    easy = deliberation_env.parallel_env(task=task)
    hard = deliberation_env.parallel_env(task=ArithmeticTask(levels=(5,)))
    def accuracy(env):
        return np.mean([env.reset(seed=s)[1]["agent_1"]["correct"] for s in range(200)])
    assert accuracy(easy) > accuracy(hard) + 0.2


def refine_effect(peer_right: bool, own_right: bool, trials=400):
    """P(right after REFINE) for agent 0 given its own and its peers' correctness at round 0."""
    env = deliberation_env.parallel_env()
    after, count = 0, 0
    for seed in range(trials * 6):
        _, infos = env.reset(seed=seed)
        if infos["agent_0"]["correct"] != own_right:
            continue
        if any(infos[f"agent_{i}"]["correct"] != peer_right for i in (1, 2)):
            continue
        _, _, _, _, infos = env.step({"agent_0": Action.REFINE, "agent_1": Action.PERSIST, "agent_2": Action.PERSIST})
        after += infos["agent_0"]["correct"]
        count += 1
        if count == trials:
            break
    assert count > 30, "not enough matching episodes"
    return after / count


def test_refine_helps_with_right_peers_and_sycophancy_hurts_right_agents():
    assert refine_effect(peer_right=True, own_right=False) > 0.6
    assert refine_effect(peer_right=False, own_right=False) < 0.45
    sycophantic = refine_effect(peer_right=False, own_right=True)
    assert 0.3 < sycophantic < 0.9  # a right agent among wrong peers sometimes caves in


def test_sim_text_is_in_task_format_and_tokens_realistic():
    env = deliberation_env.parallel_env()
    _, infos = env.reset(seed=5)
    for i, state in enumerate(env.deliberation.agents):
        assert env.task.extract_answer(state.text) == state.answer
        assert 100 < infos[f"agent_{i}"]["tokens"] < 1500


def test_sim_is_a_pure_function_of_the_request():
    from deliberation_env.backends.base import Request

    env = deliberation_env.parallel_env()
    env.reset(seed=0)
    requests = [r for r in env.deliberation._pending] or [env.deliberation._request(0, (), "solve")]
    backend = SimBackend()
    assert backend.generate(requests) == SimBackend().generate(requests)
    with pytest.raises(ValueError, match="SimContext"):
        backend.generate([Request(messages=(), kind="solve", agent=0, seed=1, max_tokens=64, temperature=0.7)])


def test_sim_config_validation_and_identity():
    with pytest.raises(ValueError, match="sycophancy"):
        SimConfig(sycophancy=2.0)
    assert SimBackend(SimConfig(skills=(0.5,))).identity() != SimBackend().identity()


@pytest.mark.parametrize("name", ["arithmetic", "gsm8k"])
def test_text_form_does_not_give_correctness_away(name, data_dir):
    """A wrong sim solution has the shape of a right one: the same lines and '=' signs.

    Before this held, a wrong arithmetic answer lost one '=' sign, and the policy could tell
    right from wrong agents by comparing its own profile row with its peers' (SFT matched the oracle).
    """
    import random

    from deliberation_env import TASKS
    from deliberation_env.core.features import text_profile

    task = TASKS.make(name, **({} if name == "arithmetic" else {"data_dir": str(data_dir)}))
    compared = 0
    for problem in list(task.problems("test"))[:100]:
        right = text_profile(task.render_solution(problem, problem.answer, random.Random(0)))
        for wrong in task.distractors(problem, random.Random(problem.id)):
            shape = text_profile(task.render_solution(problem, wrong, random.Random(0)))
            assert shape[:2] == right[:2], (problem.id, wrong)  # steps, equations
            compared += 1
    assert compared > 100


def test_sim_answer_logprobs_confidence_is_informative_and_costs_no_critic_call():
    env = deliberation_env.parallel_env(backend="sim", confidence="answer_logprobs")
    critic_env = deliberation_env.parallel_env(backend="sim")
    right, wrong = [], []
    for seed in range(150):
        _, infos = env.reset(seed=seed)
        _, critic_infos = critic_env.reset(seed=seed)
        for agent, info in infos.items():
            assert info["confidence_source"] in ("answer_logprobs", "default") or info["answer"] is None
            assert info["answer"] == critic_infos[agent]["answer"]  # same solutions: the draw comes last
            assert info["tokens"] < critic_infos[agent]["tokens"]  # no critic call
            if info["answer"] is not None:
                (right if info["correct"] else wrong).append(info["confidence"])
    assert np.mean(right) > np.mean(wrong) + 0.1


def test_a_fork_is_answered_from_its_own_state():
    # The sim reads a request's context from the deliberation that made it: a fork (tree rollouts) must get the
    # fork's, not the original's. Confidences after forking equal those of unforked envs given the same texts.
    def env_at_round_0():
        env = deliberation_env.text_env(num_agents=2, max_rounds=1, critic=SimBackend())
        env.reset(seed=3)
        return env

    def confidences(env, answer):
        _, _, _, _, infos = env.step({agent: f"The answer is {answer}." for agent in env.agents})
        return [infos[agent]["confidence"] for agent in sorted(infos)]

    gold = env_at_round_0().deliberation.problem.answer
    original = env_at_round_0()
    fork = original.fork()
    right, wrong = confidences(original, gold), confidences(fork, "7")
    assert right == confidences(env_at_round_0(), gold)
    assert wrong == confidences(env_at_round_0(), "7")
    assert right != wrong
