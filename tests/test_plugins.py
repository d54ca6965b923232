"""A plugin is one file: a toy feature set, a toy tool and a toy trainer, each written to a module of its own outside
the packages (a declaration and one register call, nothing else), then imported as a user would, work end to end: the
feature set's columns in an env's observation, the tool in a role, the trainer listed by the benchmark suite, trained
and scored on a cell by it and trained by ``python -m baselines.meta.train``."""

from __future__ import annotations

import importlib
import os
import textwrap

import numpy as np
import pytest

import deliberation_env
from baselines.benchmark import Scores
from baselines.meta.policy import load_checkpoint
from baselines.meta.trainers import TRAINERS, leaderboard_rows
from deliberation_env.core import features, tools
from deliberation_env.record import main as record
from tests.test_replay import SIM_FLAGS

pytest.importorskip("torch")

FEATURE_SET = '''
from deliberation_env.core.features import FeatureSet, register_feature_set


def fill(team, rows):
    """One column: 1 where the agent holds no answer yet or a one-digit one."""
    for i, agent in enumerate(team.agents):
        rows[i, 0] = float(len(agent.answer or "") <= 1)


register_feature_set(FeatureSet("toy_short", ("short_answer",), fill, extends="v1", summary="a short answer"))
'''

TOOL = '''
from deliberation_env.backends.base import Completion
from deliberation_env.chat import Message
from deliberation_env.core.tools import Tool, register_tool


class Constant(Tool):
    """Answers 42 to every solution that states a number: its agent's answer becomes 42."""

    name = kind = "toy_constant"
    answers = True
    summary = "answers 42"

    def request(self, text):
        return (Message("user", text),) if any(c.isdigit() for c in text) else None

    def run(self, requests):
        return [Completion("42", 0, 0) for _ in requests]


register_tool(Constant())
'''

TRAINER = '''
import os
from dataclasses import asdict, dataclass

import torch

from baselines.meta.config import BaseConfig, make_env_fn
from baselines.meta.policy import Policy, agent_layout, save_checkpoint
from baselines.meta.rollout import EpisodeSpec, collect, sampling_key
from baselines.meta.trainers import Trainer, register_trainer


@dataclass
class PersistConfig(BaseConfig):
    episodes: int = 16
    """Episodes of its one batch."""


def train(cfg, env_fn=None):
    """Plays one batch with the untrained policy, then raises PERSIST's logit wherever PERSIST is legal."""
    cfg.validate()
    env_fn = env_fn or make_env_fn(cfg)
    env = env_fn()
    policy = Policy(agent_layout(env), cfg.hidden)
    specs = [EpisodeSpec(seed, seed) for seed in range(cfg.episodes)]
    rollouts = collect([env_fn() for _ in range(4)], agent_layout(env), policy, specs, sampling_key(cfg.seed, "toy"))
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    loss = -torch.log_softmax(policy(torch.from_numpy(rollouts.obs), torch.from_numpy(rollouts.mask)), -1)[:, 0].mean()
    loss.backward()
    optimizer.step()
    save_checkpoint(os.path.join(cfg.out or "runs/toy", "policy.pt"), policy, "toy_persist", asdict(cfg))
    return policy.eval()


register_trainer(Trainer("toy_persist", PersistConfig, train))
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """Write a plugin's one file, import it as a module of the user's; its registrations are undone afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    added: list[str] = []

    def load(name: str, source: str):
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
        added.append(name)
        return importlib.import_module(name)

    yield load
    features.FEATURE_SETS.pop("toy_short", None)
    tools.TOOLS.pop("toy_constant", None)
    TRAINERS.pop("toy_persist", None)
    for name in added:
        monkeypatch.delitem("sys.modules", name, raising=False)


def test_a_feature_set_in_one_file_is_in_the_env_s_observation(plugin):
    plugin("toy_features", FEATURE_SET)
    env = deliberation_env.parallel_env(task="arithmetic", backend="sim", features="toy_short")
    assert env.observation_space("agent_0")["self"].shape == (features.NUM_FEATURES + 1,)
    seen = set()
    for seed in range(4):
        observations, _ = env.reset(seed=seed)
        for i, name in enumerate(env.possible_agents):
            short = float(len(env.deliberation.agents[i].answer or "") <= 1)
            assert observations[name]["self"][-1] == short
            np.testing.assert_array_equal(observations[name]["peers"][:, -1],
                                          env.state().reshape(3, -1)[env.deliberation.peer_indices(i), -1])
            seen.add(short)
    assert seen == {0.0, 1.0}  # answers of both kinds


def test_a_tool_in_one_file_answers_for_the_role_that_names_it(plugin):
    plugin("toy_tool", TOOL)
    env = deliberation_env.parallel_env(task="arithmetic", backend="sim", features="v3",
                                        roles=["plain", {"name": "asks", "tool": "toy_constant"}, "plain"])
    for seed in range(4):
        env.reset(seed=seed)
        agents = env.deliberation.agents
        assert agents[1].tool_ran and agents[1].answer == "42"
        assert not agents[0].tool_ran and not agents[2].tool_ran
        assert env.state().reshape(3, -1)[1, features.TOOL_OFFSET] == 1.0
    assert "toy_constant" in tools.tool_table()


@pytest.fixture(scope="module")
def cell(tmp_path_factory):
    """A small recorded sim set's v1 cell (a fit/validation split carved from train)."""
    out = tmp_path_factory.mktemp("plugin-sets") / "small"
    for split, problems in (("train", "0:16"), ("test", "0:8")):
        record(["--out", str(out), "--split", split, "--problems", problems, "--chunk", "16", *SIM_FLAGS])
    return f"{out}:v1"


def test_a_trainer_in_one_file_is_listed_run_and_scored_by_the_suite_and_trained_by_the_cli(plugin, cell, tmp_path,
                                                                                              monkeypatch):
    from baselines.meta import train
    from bench.benchmark import benchmark_suite

    plugin("toy_trainer", TRAINER)
    assert leaderboard_rows()["toy_persist"] == ("toy_persist", {})
    assert list(leaderboard_rows())[:6] == ["softrankpo", "grpo", "ppo", "mappo", "magrpo", "sft"]
    monkeypatch.chdir(tmp_path)  # the suite keeps its runs under runs/
    benchmark_suite.main(["--cells", cell, "--trainers", "toy_persist", "--seeds", "1", "--episodes", "16",
                          "--out", str(tmp_path / "suite")])
    folder = tmp_path / "suite" / "small-v1" / "toy_persist"
    finals = sorted(folder.glob("final-*-seed0-test.csv"))
    assert len(finals) == 1 and Scores.load(finals[0]).accuracy.shape == (8,)  # every recorded test problem
    assert "toy_persist" in (tmp_path / "suite.md").read_text(encoding="utf-8")

    out = tmp_path / "cli"
    train.main(["--algo", "toy_persist", "--task", "arithmetic", "--backend", "sim", "--episodes", "8",
                "--no-evaluate", "--out", str(out), "--no-progress"])
    checkpoint = load_checkpoint(os.path.join(out, "policy.pt"))
    assert checkpoint["algo"] == "toy_persist" and checkpoint["config"]["episodes"] == 8
