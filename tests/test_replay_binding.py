"""Every path to a replay set runs its integrity check: wrappers, caches and fallbacks of another model."""

from __future__ import annotations

import pytest

import deliberation_env
from deliberation_env.backends.sim import SimBackend
from deliberation_env.make import replay_env
from deliberation_env.record import main as record
from deliberation_env.replay import ReplayBackend, ReplayError, ReplaySet
from deliberation_env.replay.dataset import read_records
from tests.test_replay import SIM_FLAGS, sim_live


@pytest.fixture(scope="module")
def sim_set(tmp_path_factory):
    """A small 1-round sim set: 4 test problems, 2 streams."""
    out = tmp_path_factory.mktemp("sets") / "sim-small"
    record(["--out", str(out), "--split", "test", "--problems", "0:4", "--streams", "2", "--rounds", "1",
            "--concede-targets", "rule", *SIM_FLAGS])
    return out


class Counting:
    """A wrapper that counts requests and exposes what it wraps as ``inner``."""

    def __init__(self, inner):
        self.inner, self.requests = inner, 0

    def identity(self) -> str:
        return self.inner.identity()

    def generate(self, requests):
        self.requests += len(requests)
        return self.inner.generate(requests)


class Hiding(Counting):
    """The same wrapper, but its backend is private: the env cannot see the replay set inside."""

    def __init__(self, inner):
        super().__init__(inner)
        self._hidden = self.__dict__.pop("inner")

    def identity(self) -> str:
        return self._hidden.identity()

    def generate(self, requests):
        return self._hidden.generate(requests)


def test_a_cache_over_a_replay_set_is_refused(sim_set, tmp_path):
    with pytest.raises(ReplayError, match="drop cache="):
        replay_env(sim_set, split="test", cache=str(tmp_path / "c.sqlite"))


def test_replay_binds_through_a_wrapper_that_exposes_it(sim_set):
    card = ReplaySet(sim_set).card
    wrapper = Counting(ReplayBackend(sim_set))
    env = deliberation_env.parallel_env(backend=wrapper, split="test", **{**deliberation_env.replay.env_settings(card),
                                                                          "invalid_action": "persist"})
    assert [p.id for p in env.problems] == card.splits["test"]  # the set's problems, not the task's 500
    assert env.config.streams == card.streams
    for seed in range(8):
        env.reset(seed=seed)
        env.step({agent: 1 for agent in env.agents})
    assert wrapper.requests > 0 and wrapper.inner.misses == 0
    with pytest.raises(ReplayError, match="max_tokens=64"):  # the check runs through the wrapper
        deliberation_env.parallel_env(backend=Counting(ReplayBackend(sim_set)), split="test", **{
            **deliberation_env.replay.env_settings(card), "max_tokens": 128})


def test_a_hidden_replay_set_refuses_to_answer(sim_set):
    card = ReplaySet(sim_set).card
    env = deliberation_env.parallel_env(backend=Hiding(ReplayBackend(sim_set)), split="test",
                                        **deliberation_env.replay.env_settings(card))
    with pytest.raises(ReplayError, match="before an env bound it"):
        env.reset(seed=0)


def test_a_fallback_of_another_model_is_refused_unless_named(sim_set, tmp_path):
    other = SimBackend(skills=(0.3,))
    assert other.identity() != ReplaySet(sim_set).card.model
    with pytest.raises(ReplayError, match="fallback_model="):
        replay_env(sim_set, split="test", fallback=other)
    with pytest.raises(ReplayError, match="fallback_model="):
        ReplayBackend(sim_set, fallback=other, write_back=True)
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(sim_set, copy)
    backend = ReplayBackend(copy, fallback=other, write_back=True, fallback_model=other.identity())
    env = sim_live(rounds=1)
    backend.bind(env.task, env.config, "test")
    env.begin_episode(seed=0, options={"problem_index": 7})  # not in the set: the fallback answers
    backend.generate(env.pending_requests())
    written = [r for r in read_records(copy) if r["problem"] == "arithmetic-test-7"]
    card = ReplaySet(copy).card
    fallback_files = [entry for name, entry in card.files.items() if "fallback" in name]
    assert len(written) == 3 and len(fallback_files) == 1  # one file for the one write
    assert fallback_files[0]["model"] == other.identity() != card.model
    assert other.identity() in (copy / "README.md").read_text()


def test_train_and_test_envs_on_one_replay_backend_play_interleaved_without_misses():
    """The split belongs to each env's binding, not to the backend: two splits on one backend do not interfere."""
    import numpy as np

    from deliberation_env.replay import env_settings

    backend = ReplayBackend("qwen05-arith-v2")
    settings = env_settings(backend.set.card)
    train = deliberation_env.parallel_env(backend=backend, split="train", **settings)
    test = deliberation_env.parallel_env(backend=backend, split="test", **settings)
    assert {p.id for p in train.problems}.isdisjoint(p.id for p in test.problems)
    rng = np.random.default_rng(0)
    episodes = 0
    for index in range(max(len(train.problems), len(test.problems))):
        playing = [env for env in (train, test) if index < len(env.problems)]
        observations = [env.reset(seed=index, options={"problem_index": index})[0] for env in playing]
        while any(env.agents for env in playing):  # one round of each env in turn
            for i, env in enumerate(playing):
                if env.agents:
                    actions = {a: int(rng.choice(np.flatnonzero(o["action_mask"]))) for a, o in observations[i].items()}
                    observations[i] = env.step(actions)[0]
        episodes += len(playing)
    assert episodes == len(train.problems) + len(test.problems) and backend.hits > 0 and backend.misses == 0


def test_the_integrity_check_runs_once_per_split_and_settings():
    replay = ReplaySet("qwen05-arith-v2")
    backend = ReplayBackend(replay)
    settings = deliberation_env.replay.env_settings(replay.card)
    for _ in range(3):
        deliberation_env.parallel_env(backend=backend, split="test", **settings)
    assert replay.checks_run == 1  # remembered: later envs on the same set, split and settings skip it
    deliberation_env.parallel_env(backend=backend, split="train", **settings)
    deliberation_env.parallel_env(backend=backend, split="train", observation="flat", **settings)  # no request setting
    assert replay.checks_run == 2
    deliberation_env.replay_env(replay, split="test", max_rounds=1)
    assert replay.checks_run == 2  # replay_env on a loaded set shares its memory
    with pytest.raises(ReplayError, match="max_tokens"):  # the comparisons with the card run every time
        deliberation_env.parallel_env(backend=backend, split="test", **{**settings, "max_tokens": 7})
    with pytest.raises(ReplayError, match="max_tokens"):
        deliberation_env.parallel_env(backend=backend, split="test", **{**settings, "max_tokens": 7})
