"""Construction options for RL libraries (observation/mask/info formats) and PettingZoo's own test suite."""

from __future__ import annotations

import functools
import types
from collections import defaultdict

import numpy as np
import pytest
from pettingzoo.test import (
    api_test,
    max_cycles_test,
    parallel_api_test,
    parallel_seed_test,
    render_test,
    seed_test,
    state_test,
)

import deliberation_env
from deliberation_env import Action

MODES = ("dict", "flat", "masked")


def mask_of(env, observation, info):
    """The legal-action mask wherever this env's format puts it."""
    fmt = env.unwrapped.format
    if not fmt.mask_in_observation:
        return info[fmt.mask_key]
    if fmt.mode == "flat":
        return observation[-3:].astype(np.int8)
    return observation[fmt.mask_key]


def play(env, seed, check=None):
    """One episode of random legal actions on a parallel env; returns the actions and rewards per step."""
    rng = np.random.default_rng(seed)
    observations, infos = env.reset(seed=seed)
    steps = []
    while True:
        if check:
            check(observations, infos)
        if not env.agents:
            return steps
        actions = {a: int(rng.choice(np.flatnonzero(mask_of(env, observations[a], infos[a])))) for a in env.agents}
        observations, rewards, _, _, infos = env.step(actions)
        steps.append((actions, rewards))


@pytest.mark.parametrize("mode", MODES)
def test_pettingzoo_test_suite_passes_in_every_observation_mode(mode):
    parallel = functools.partial(deliberation_env.parallel_env, observation=mode)
    aec = functools.partial(deliberation_env.env, observation=mode)
    parallel_api_test(parallel(), num_cycles=10)
    api_test(aec(), num_cycles=10)
    state_test(aec(), parallel(), num_cycles=10)
    seed_test(aec, num_cycles=10)
    render_test(aec)
    max_cycles_test(types.SimpleNamespace(parallel_env=parallel, env=aec))


@pytest.mark.parametrize("task", ["arithmetic", "jigsaw"])
def test_pettingzoo_parallel_tests_pass_on_the_default_form_as_a_user_runs_them(task):
    """``parallel_seed_test`` samples actions without the mask; on jigsaw the sim team soon agrees (CONCEDE masked)."""
    parallel_seed_test(lambda: deliberation_env.parallel_env(task=task), num_cycles=50)
    parallel_api_test(deliberation_env.parallel_env(task=task), num_cycles=50)


@pytest.mark.parametrize("num_agents", [1, 2, 4])
@pytest.mark.parametrize(("mode", "mask"), [("dict", "observation"), ("dict", "info"), ("flat", "both"),
                                            ("flat", "info"), ("masked", "both")])
def test_observations_stay_in_their_space_and_masks_agree(mode, mask, num_agents):
    env = deliberation_env.parallel_env(observation=mode, action_mask=mask, num_agents=num_agents, max_rounds=3)
    reference = deliberation_env.parallel_env(num_agents=num_agents, max_rounds=3)
    space = env.observation_space("agent_0")
    assert all(env.observation_space(a) is space for a in env.possible_agents)  # built once
    for seed in range(6):
        reference_steps: list = []
        seen: list = []
        play(reference, seed, check=lambda o, i, out=reference_steps: out.append((o, i)))
        play(env, seed, check=lambda o, i, out=seen: out.append((o, i)))
        assert len(seen) == len(reference_steps)
        for (observations, infos), (ref_obs, _) in zip(seen, reference_steps):
            for agent, obs in observations.items():
                assert space.contains(obs), (mode, mask, agent, obs)
                np.testing.assert_array_equal(mask_of(env, obs, infos[agent]), ref_obs[agent]["action_mask"])
                if mask == "both":
                    np.testing.assert_array_equal(infos[agent]["action_mask"], ref_obs[agent]["action_mask"])


def test_flat_layout_and_custom_keys():
    flat = deliberation_env.parallel_env(observation="flat")
    masked = deliberation_env.parallel_env(observation="masked", observation_key="observations", action_mask_key="mask")
    plain = deliberation_env.parallel_env()
    (flat_obs, _), (masked_obs, _), (plain_obs, _) = (e.reset(seed=4) for e in (flat, masked, plain))
    for agent, raw in plain_obs.items():
        features = np.concatenate([raw["self"], raw["peers"].ravel(), raw["agreement"]])
        np.testing.assert_array_equal(flat_obs[agent], np.concatenate([features, raw["action_mask"]]))
        assert set(masked_obs[agent]) == {"observations", "mask"}
        np.testing.assert_array_equal(masked_obs[agent]["observations"], features)
    no_mask = deliberation_env.parallel_env(observation="flat", action_mask="info")
    assert no_mask.observation_space("agent_0").shape == (flat.observation_space("agent_0").shape[0] - 3,)


@pytest.mark.parametrize("mask", ["observation", "info"])
def test_numeric_infos_are_floats_with_the_same_keys_every_step(mask):
    env = deliberation_env.parallel_env(infos="numeric", action_mask=mask, max_rounds=4)
    key_sets = set()

    def check(observations, infos):
        for info in infos.values():
            key_sets.add(frozenset(info))
            for key, value in info.items():
                if key == "action_mask":
                    assert value.dtype == np.int8 and value.shape == (3,)
                else:
                    assert type(value) is float and np.isfinite(value), (key, value)

    for seed in range(8):
        play(env, seed, check=check)
    assert len(key_sets) == 1
    keys = next(iter(key_sets))
    assert {"confidence", "tokens", "correct", "consensus_correct", "oracle_action", "action", "concede_target",
            "reward_local", "has_answer"} <= keys
    assert ("action_mask" in keys) == (mask == "info")
    full = deliberation_env.parallel_env(max_rounds=4)
    _, full_infos = full.reset(seed=2)
    _, numeric_infos = env.reset(seed=2)
    for agent, info in full_infos.items():
        assert numeric_infos[agent]["confidence"] == info["confidence"]
        assert numeric_infos[agent]["action"] == -1.0  # no action before the first round
    none = deliberation_env.parallel_env(infos="none")
    _, none_infos = none.reset(seed=0)
    assert none_infos == {a: {} for a in none.possible_agents}


@pytest.mark.parametrize("seed", range(6))
def test_aec_rewards_reach_every_agent_like_the_parallel_env(seed):
    """Summing last()'s reward per agent over the AEC episode gives the parallel env's return."""
    rng = np.random.default_rng(seed)
    aec = deliberation_env.env(invalid_action="persist", max_rounds=4)
    aec.reset(seed=seed)
    totals, actions = defaultdict(float), []
    for agent in aec.agent_iter():
        observation, reward, termination, truncation, _ = aec.last()
        totals[agent] += reward
        if termination or truncation:
            aec.step(None)
            continue
        action = int(rng.choice(np.flatnonzero(observation["action_mask"])))
        actions.append((agent, action))
        aec.step(action)
    parallel = deliberation_env.parallel_env(invalid_action="persist", max_rounds=4)
    parallel.reset(seed=seed)
    expected, queue = defaultdict(float), iter(actions)
    while parallel.agents:
        _, rewards, _, _, _ = parallel.step(dict(next(queue) for _ in parallel.agents))
        for agent, reward in rewards.items():
            expected[agent] += reward
    assert dict(totals) == dict(expected)
    assert len(actions) == 4 * 3


def test_a_masked_action_plays_persist_in_every_observation_mode_unless_raise_is_asked():
    """Learners that cannot mask and PettingZoo's own seed test sample masked actions: by default a masked CONCEDE
    becomes PERSIST in every observation mode; ``invalid_action="raise"`` rejects it."""
    for mode, lenient in (("flat", True), ("dict", True), ("masked", True), ("dict", False)):
        env = deliberation_env.parallel_env(observation=mode, max_rounds=6,
                                            **({} if lenient else {"invalid_action": "raise"}))
        assert env.invalid_action == ("persist" if lenient else "raise")
        for seed in range(10):
            observations, infos = env.reset(seed=seed)
            masked = [a for a in env.agents if not mask_of(env, observations[a], infos[a])[Action.CONCEDE]]
            if masked:
                break
        assert masked, "no state with a masked CONCEDE in 10 seeds"
        actions = {a: Action.CONCEDE for a in env.agents}
        if lenient:
            _, _, _, _, infos = env.step(actions)
            assert all(infos[a]["action"] == "PERSIST" for a in masked)
        else:
            with pytest.raises(ValueError, match="CONCEDE is masked"):
                env.step(actions)


def test_max_cycles_state_space_and_render_argument():
    env = deliberation_env.parallel_env(max_cycles=5, render_mode="ansi")
    assert env.config.max_rounds == 5
    env.reset(seed=0)
    assert env.state_space.contains(env.state())
    assert "round 0/5" in env.render("ansi") and env.render(None) == env.render()
    with pytest.raises(ValueError, match="max_cycles=5 and max_rounds=4 disagree"):
        deliberation_env.parallel_env(max_cycles=5, max_rounds=4)


def test_agent_names_replace_the_default_ids_everywhere():
    names = ["alice", "bob", "carol"]
    env = deliberation_env.parallel_env(agent_names=names, infos="full", render_mode="ansi", max_rounds=2)
    reference = deliberation_env.parallel_env(max_rounds=2)
    seen: list = []
    play(env, 5, check=lambda o, i: seen.append((o, i)))
    expected: list = []
    play(reference, 5, check=lambda o, i: expected.append((o, i)))
    assert env.possible_agents == names and all(set(o) <= set(names) for o, _ in seen)
    for (observations, infos), (ref_obs, ref_infos) in zip(seen, expected):
        for name, default in zip(names, reference.possible_agents):
            if default in ref_obs:
                np.testing.assert_array_equal(observations[name]["self"], ref_obs[default]["self"])
                target = ref_infos[default]["concede_target"]
                assert infos[name]["concede_target"] == (None if target is None else names[int(target[-1])])
    assert "alice: answer=" in env.render()
    with pytest.raises(ValueError, match="agent_names must be 3 distinct non-empty strings"):
        deliberation_env.parallel_env(agent_names=["a", "a", "b"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"observation": "box"}, r"observation must be one of \('dict', 'flat', 'masked'\)"),
        ({"infos": "numbers"}, "infos must be one of"),
        ({"action_mask": "obs"}, "action_mask must be one of"),
        ({"observation": "masked", "action_mask": "info"}, "observation='masked' puts the mask in the observation"),
        ({"observation": "masked", "observation_key": "m", "action_mask_key": "m"}, "must differ"),
        ({"action_mask_key": "self"}, "clashes with an observation key"),
    ],
)
def test_bad_format_options_name_the_problem(kwargs, message):
    with pytest.raises(ValueError, match=message):
        deliberation_env.parallel_env(**kwargs)
