"""End to end: a deliberation episode on every benchmark task with the simulated backend."""

from __future__ import annotations

import numpy as np
import pytest

import deliberation_env

TASK_NAMES = ("gsm8k", "math", "aime24", "amc23", "mmlu")


@pytest.mark.parametrize("name", TASK_NAMES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_legal_episode_on_each_task(name, seed, data_dir):
    env = deliberation_env.parallel_env(task=name, backend="sim", data_dir=str(data_dir), split="test", num_agents=3,
                                        max_rounds=3)
    rng = np.random.default_rng(seed)
    observations, infos = env.reset(seed=seed)
    gold = env.deliberation.problem.answer
    steps = 0
    while True:
        for agent, observation in observations.items():
            assert env.observation_space(agent).contains(observation), (name, agent)
        if not env.agents:
            break
        actions = {a: int(rng.choice(np.flatnonzero(observations[a]["action_mask"]))) for a in env.agents}
        observations, rewards, terminations, truncations, infos = env.step(actions)
        steps += 1
        for info in infos.values():
            answer = info["answer"]
            assert answer is None or isinstance(answer, str)
            assert info["correct"] == (answer is not None and env.task.grade(env.deliberation.problem, answer))
            assert (answer == gold) <= info["correct"]
        assert all(np.isfinite(r) for r in rewards.values())
    assert steps == 3 and all(terminations.values())


@pytest.mark.parametrize("name", TASK_NAMES)
def test_sim_team_gets_some_problems_right_and_some_wrong(name, data_dir):
    env = deliberation_env.parallel_env(task=name, backend="sim", data_dir=str(data_dir), split="test", max_rounds=1)
    outcomes = []
    for seed in range(12):
        env.reset(seed=seed)
        _, _, _, _, infos = env.step({a: 0 for a in env.agents})
        outcomes += [info["correct"] for info in infos.values()]
    assert any(outcomes) and not all(outcomes)
