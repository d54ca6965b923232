"""Regressions reported by users: MAPPO critic identity, evaluation settings, threads, plots, budgets, logs."""

from __future__ import annotations

import csv

import gymnasium
import numpy as np
import pytest
import torch
from pettingzoo import ParallelEnv

import deliberation_env
from baselines.evaluation.evaluate import accuracy_vs_tokens_figure, evaluate_entries
from baselines.logger import read_metrics
from baselines.meta import train as train_cli
from baselines.meta.evaluate import PolicyActor, standard_entries
from baselines.meta.policy import Policy, agent_layout
from baselines.meta.sft import SFTConfig

QUIET = {"progress": False, "tensorboard": False}


class UnequalRewards(ParallelEnv):
    """One step; both agents see the same observation, but "a" always gets 1 and "b" always 0."""

    metadata = {"name": "unequal_rewards"}
    possible_agents = ["a", "b"]

    def observation_space(self, agent):
        return gymnasium.spaces.Box(0.0, 1.0, (2,), np.float32)

    def action_space(self, agent):
        return gymnasium.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        return {a: np.ones(2, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        agents, self.agents = self.agents, []
        return ({a: np.ones(2, np.float32) for a in agents}, {"a": 1.0, "b": 0.0}, dict.fromkeys(agents, True),
                dict.fromkeys(agents, False), {a: {} for a in agents})


def test_mappo_critic_knows_which_agent_it_values(tmp_path):
    cfg = train_cli.config_class("ppo")(episodes=640, episodes_per_batch=64, centralized_critic=True, lr=1e-2,
                                        out=str(tmp_path), **QUIET)
    train_cli.run("ppo", cfg, env_fn=UnequalRewards)
    # same global state, returns 1 and 0: without the agent's identity the best value is 0.5 (loss 0.25)
    assert read_metrics(str(tmp_path))[-1]["value_loss"] < 0.02


def test_post_training_evaluation_uses_the_training_env_settings(tmp_path):
    cfg = SFTConfig(num_agents=2, token_cost=0.01, max_rounds=2, episodes=16, epochs=1, out=str(tmp_path), **QUIET)
    train_cli.run("sft", cfg)
    train_cli.evaluate_run("sft", cfg, str(tmp_path), train_cli.EvalOptions(eval_problems=5, eval_seeds=1))
    with open(tmp_path / "eval" / "table.csv", encoding="utf-8") as f:
        saved = {row["name"]: row for row in csv.DictReader(f)}
    env_kwargs = {"num_agents": 2, "max_rounds": 2, "reward_weights": {"tokens": 0.01}, "split": "test"}
    for row in evaluate_entries(standard_entries({}, ["single", "debate"], env_kwargs), 5, [0]):
        assert float(saved[row["name"]]["score"]) == row["score"], row["name"]
        assert float(saved[row["name"]]["tokens"]) == row["tokens"], row["name"]
    assert float(saved["debate"]["score"]) < 0  # the token cost counts
    assert float(saved["single"]["tokens"]) < float(saved["debate"]["tokens"]) / 2  # single keeps one agent


def test_small_policy_acts_on_one_thread_and_restores_the_setting(monkeypatch):
    env = deliberation_env.parallel_env()
    policy = Policy(agent_layout(env), hidden=16)
    seen = []
    original = policy.act
    monkeypatch.setattr(policy, "act", lambda *a, **k: seen.append(torch.get_num_threads()) or original(*a, **k))
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
        obs, infos = env.reset(seed=0)
        PolicyActor(policy).act(obs, infos)
        assert seen == [1] and torch.get_num_threads() == 2
        PolicyActor(policy, threads=2).act(obs, infos)  # explicit
        monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user chose
        PolicyActor(policy).act(obs, infos)
        assert seen == [1, 2, 2]
    finally:
        torch.set_num_threads(previous)


def test_accuracy_plot_stays_in_range_with_a_legend():
    rows = [{"name": name, "accuracy": acc, "accuracy_ci": 0.3, "score": 0.0, "score_ci": 0.0, "tokens": tokens,
             "tokens_ci": 50.0} for name, acc, tokens in [("oracle", 0.95, 2000), ("sft", 0.93, 2010), ("low", 0.1, 500)]]
    fig = accuracy_vs_tokens_figure(rows)
    ax = fig.axes[0]
    assert ax.get_ylim()[0] >= 0.0 and ax.get_ylim()[1] <= 1.02
    vertical = [seg for c in ax.collections for seg in c.get_segments() if np.allclose(seg[:, 0], seg[0, 0])]
    assert vertical and all(0.0 <= y <= 1.0 for seg in vertical for y in seg[:, 1])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["oracle", "sft", "low"]
    assert not ax.texts  # no point labels to overlap


@pytest.mark.parametrize(("algo", "settings", "steps"), [
    ("grpo", {"episodes": 100, "group_size": 8, "groups_per_batch": 4}, [32, 64, 96]),
    ("ppo", {"episodes": 40, "episodes_per_batch": 16}, [16, 32, 40]),
])
def test_training_never_runs_past_its_budget(tmp_path, algo, settings, steps):
    train_cli.run(algo, train_cli.config_class(algo)(out=str(tmp_path), num_envs=8, **settings, **QUIET))
    assert [row["step"] for row in read_metrics(str(tmp_path))] == steps


def test_training_writes_tensorboard_events(tmp_path):
    pytest.importorskip("tensorboard", reason="pip install -e '.[dev]' installs tensorboard")
    train_cli.run("sft", SFTConfig(episodes=8, epochs=1, out=str(tmp_path), progress=False, tensorboard=True))
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
