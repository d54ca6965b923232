"""What a factory does with what it is not given: a given ``config=`` keeps its fields, a replay set's recorded game
is the default of an env on it, and no default plays the test split."""

from __future__ import annotations

import pettingzoo
import pytest

import deliberation_env
from deliberation_env.core.deliberation import DeliberationConfig
from deliberation_env.replay import ReplayBackend, ReplaySet, env_settings

CONFIG = DeliberationConfig(num_agents=2, max_rounds=1, max_tokens=100, confidence="critic_text")
SET = "qwen05-arith-v2"


def config_of(env):
    """The ``DeliberationConfig`` an env of any form plays (the AEC form's through its wrappers)."""
    return env.unwrapped.config


FACTORIES = {
    "parallel_env": lambda **kw: deliberation_env.parallel_env(**kw),
    "env (AEC)": lambda **kw: deliberation_env.env(**kw),
    "text_env": lambda **kw: deliberation_env.text_env(**kw),
    "TextDeliberationEnv": lambda **kw: deliberation_env.TextDeliberationEnv(**kw),
    "DeliberationEnv": lambda **kw: deliberation_env.DeliberationEnv(**kw),
    "pettingzoo.make parallel": lambda **kw: pettingzoo.make("parallel", deliberation_env.ENV_ID, **kw),
    "pettingzoo.make aec": lambda **kw: pettingzoo.make("aec", deliberation_env.ENV_ID, **kw),
}


@pytest.mark.parametrize("factory", FACTORIES)
def test_a_given_config_keeps_its_agents_and_rounds_in_every_factory(factory):
    env = FACTORIES[factory](task="arithmetic", config=CONFIG)
    assert config_of(env) == CONFIG
    assert len(env.possible_agents) == 2


@pytest.mark.parametrize("factory", FACTORIES)
def test_a_keyword_given_beside_a_config_replaces_that_field_only(factory):
    env = FACTORIES[factory](config=CONFIG, max_rounds=2)
    assert config_of(env).max_rounds == 2 and config_of(env).num_agents == 2 and config_of(env).max_tokens == 100


@pytest.mark.parametrize("factory", FACTORIES)
def test_without_config_the_defaults_are_the_configs_own(factory):
    assert config_of(FACTORIES[factory]()) == DeliberationConfig()


def test_replay_env_keeps_a_given_config():
    recorded = env_settings(ReplaySet(SET).card)
    config = DeliberationConfig(**{k: v for k, v in recorded.items() if k not in ("task", "task_kwargs")})
    env = deliberation_env.replay_env(SET, config=DeliberationConfig(**{**vars(config), "max_rounds": 1}))
    assert env.config.max_rounds == 1 and env.config.confidence == recorded["confidence"]


def test_max_cycles_is_max_rounds_and_may_not_contradict_it():
    assert deliberation_env.parallel_env(max_cycles=5).config.max_rounds == 5
    assert deliberation_env.parallel_env(max_cycles=3, max_rounds=3).config.max_rounds == 3
    with pytest.raises(ValueError, match="max_cycles=5 and max_rounds=3 disagree"):
        deliberation_env.parallel_env(max_cycles=5, max_rounds=3)


# ------------------------------------------------------------------ a replay backend plays the set's recorded game
REPLAY_FORMS = {
    "parallel_env": lambda **kw: deliberation_env.parallel_env(backend="replay", backend_kwargs={"dataset": SET}, **kw),
    "parallel_env(ReplayBackend)": lambda **kw: deliberation_env.parallel_env(backend=ReplayBackend(SET), **kw),
    "env (AEC)": lambda **kw: deliberation_env.env(backend="replay", backend_kwargs={"dataset": SET}, **kw),
    "pettingzoo.make": lambda **kw: pettingzoo.make("parallel", deliberation_env.ENV_ID, backend="replay",
                                                    backend_kwargs={"dataset": SET}, **kw),
    "DeliberationEnv": lambda **kw: deliberation_env.DeliberationEnv(backend="replay", backend_kwargs={"dataset": SET},
                                                                    **kw),
    "replay_env": lambda **kw: deliberation_env.replay_env(SET, **kw),
}


@pytest.mark.parametrize("form", REPLAY_FORMS)
def test_an_env_on_a_replay_set_plays_its_recorded_game_by_default(form):
    """Before, these forms played DeliberationConfig's defaults: max_tokens 512 and the default task levels were
    refused one at a time, and the confidence source silently became "critic" (the set records critic_text)."""
    card = ReplaySet(SET).card
    env = REPLAY_FORMS[form]().unwrapped
    recorded = env_settings(card)
    assert env.task.name == card.task and env.config.confidence == card.confidence == "critic_text"
    for name in ("num_agents", "max_rounds", "max_tokens", "critic_max_tokens", "temperature", "concede_target"):
        assert getattr(env.config, name) == recorded[name], name
    assert env.split == "train" and [p.id for p in env.problems] == card.splits["train"]
    env.reset(seed=0)
    env.step({agent: 1 for agent in env.agents})  # REFINE: every request is in the set
    assert env.backends[0].misses == 0


def test_a_replay_set_keeps_what_is_given():
    env = REPLAY_FORMS["parallel_env"](confidence="critic", max_rounds=1, split="test")
    assert env.config.confidence == "critic" and env.config.max_rounds == 1 and env.split == "test"
    with pytest.raises(deliberation_env.replay.ReplayError, match="max_tokens=256"):
        REPLAY_FORMS["parallel_env"](max_tokens=128)


# ------------------------------------------------------------------ no default plays the test split
@pytest.mark.parametrize("factory", FACTORIES)
def test_the_default_split_is_train_in_every_factory(factory):
    env = FACTORIES[factory]().unwrapped
    env = getattr(env, "meta", env)  # the text env's meta-action env holds the split
    assert env.split == "train" and all(p.id.startswith("arithmetic-train-") for p in env.problems)


def test_the_test_split_is_played_when_asked():
    env = deliberation_env.parallel_env(split="test")
    assert len(env.problems) == 500 and env.problems[0].id == "arithmetic-test-0"
