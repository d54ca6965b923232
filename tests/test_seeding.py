"""Where an env's problems come from without a seed: never OS entropy. A seeded first reset fixes every later
unseeded one; an env never seeded draws a stream of its own, the same on every run; SuperSuit's copies of one env
each draw their own."""

from __future__ import annotations

import subprocess
import sys
import warnings

import supersuit as ss

import deliberation_env

EPISODES = 6


def problems_of(env, first_seed=None, episodes=EPISODES) -> list[str]:
    """The problems of ``episodes`` episodes, the first reset seeded with ``first_seed``, the rest unseeded."""
    ids = []
    for episode in range(episodes):
        _, infos = env.reset(seed=first_seed if episode == 0 else None)
        ids.append(next(iter(infos.values()))["problem_id"])
    return ids


def test_a_seeded_first_reset_fixes_the_unseeded_ones_after_it():
    first, second = deliberation_env.parallel_env(), deliberation_env.parallel_env()
    assert problems_of(first, first_seed=7) == problems_of(second, first_seed=7)


UNSEEDED_RUN = """
import json, warnings
warnings.simplefilter("ignore")
import numpy as np, supersuit as ss, deliberation_env
env = deliberation_env.parallel_env()
ids = []
for _ in range(5):
    _, infos = env.reset()
    ids.append(infos["agent_0"]["problem_id"])
vec = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(deliberation_env.parallel_env(observation="flat")), 3,
                            num_cpus=0, base_class="stable_baselines3")
observations = vec.reset()
for _ in range(4):
    observations, *_ = vec.step(np.zeros(vec.num_envs, dtype=int))
print(json.dumps([ids, observations.round(6).tolist()]))
"""


def test_an_unseeded_program_draws_the_same_problems_on_every_run():
    """An env never seeded, and SB3 through SuperSuit (which resets without a seed): two runs of one program agree."""
    runs = [subprocess.run([sys.executable, "-c", UNSEEDED_RUN], capture_output=True, text=True, check=True).stdout
            for _ in range(2)]
    assert runs[0] == runs[1] and runs[0].strip()


def test_envs_and_their_copies_draw_streams_of_their_own():
    first, second = deliberation_env.parallel_env(), deliberation_env.parallel_env()
    assert problems_of(first) != problems_of(second)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vec = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(deliberation_env.parallel_env()), 4, num_cpus=0,
                                    base_class="stable_baselines3")
        vec.reset()
    copies = [env.par_env.deliberation.problem.id for env in vec.venv.vec_envs]
    assert len(set(copies)) == 4, copies  # before, all four copies played one problem sequence


def test_a_seeded_env_copies_its_generator_state():
    """A copy of an env that has drawn continues its generator: the copy's next episodes are the original's."""
    import copy

    env = deliberation_env.parallel_env()
    env.reset(seed=3)
    clone = copy.deepcopy(env)
    assert problems_of(env, episodes=3) == problems_of(clone, episodes=3)


def test_the_aec_and_text_forms_follow_the_seeded_generator():
    for make in (deliberation_env.env, deliberation_env.text_env):
        runs = []
        for _ in range(2):
            env = make()
            env.reset(seed=11)
            ids = [env.unwrapped.deliberation.problem.id]
            for _ in range(3):
                env.reset()
                ids.append(env.unwrapped.deliberation.problem.id)
            runs.append(ids)
        assert runs[0] == runs[1] and len(set(runs[0])) > 1
