"""Every trainer through the real CLI entry point, checkpoints, bad configs, reward-scale invariance."""

from __future__ import annotations

import os

import gymnasium
import numpy as np
import pytest
import torch
from pettingzoo import ParallelEnv

import deliberation_env
from baselines.logger import read_metrics
from baselines.meta import train as train_cli
from baselines.meta.policy import encode, load_policy, stack
from baselines.meta.softrankpo import SoftRankPOConfig
from deliberation_env.core.features import FEATURE_FORMAT

TINY = ["--episodes", "32", "--num-envs", "8", "--no-progress", "--no-tensorboard", "--no-evaluate"]
GROUP = ["--group-size", "4", "--groups-per-batch", "4"]


@pytest.mark.parametrize(("algo", "extra"), [
    ("softrankpo", GROUP + ["--sft-episodes", "16", "--sft-epochs", "2"]),
    ("softrankpo", GROUP + ["--sft-episodes", "0", "--credit-span", "round"]),
    ("grpo", GROUP + ["--no-std-normalize"]),
    ("magrpo", GROUP + ["--credit-span", "round", "--std-normalize"]),
    ("ppo", ["--episodes-per-batch", "16"]),
    ("ppo", ["--episodes-per-batch", "16", "--centralized-critic", "--credit-span", "episode"]),
    ("sft", ["--epochs", "2"]),
])
def test_each_trainer_smoke_through_cli(tmp_path, algo, extra):
    out = tmp_path / algo
    policy = train_cli.main(["--algo", algo, "--out", str(out), *TINY, *extra])
    assert (out / "policy.pt").exists() and (out / "metrics.jsonl").exists() and (out / "metrics.csv").exists()
    rows = read_metrics(str(out))
    assert rows and all(np.isfinite(v) for r in rows for v in r.values() if isinstance(v, float))
    assert load_policy(str(out / "policy.pt")).layout == policy.layout


def test_cli_evaluation_table_and_plots(tmp_path, capsys):
    out = tmp_path / "run"
    train_cli.main(["--algo", "softrankpo", "--out", str(out), "--episodes", "16", "--num-envs", "8", *GROUP,
                    "--sft-episodes", "16", "--sft-epochs", "2", "--no-progress", "--no-tensorboard",
                    "--eval-problems", "6", "--eval-seeds", "2"])
    printed = capsys.readouterr().out
    for name in ("softrankpo", "sft", "debate", "threshold", "oracle", "single"):
        assert f"| {name} |" in printed
    for name in ("table.md", "table.csv", "accuracy_vs_tokens.png", "learning_curves.png"):
        assert (out / "eval" / name).stat().st_size > 0


def test_checkpoint_round_trip_gives_same_logits(tmp_path):
    policy = train_cli.main(["--algo", "grpo", "--out", str(tmp_path), *TINY, *GROUP])
    loaded = load_policy(str(tmp_path / "policy.pt"))
    env = deliberation_env.parallel_env(split="test")
    obs, _ = env.reset(seed=3)
    x, mask = stack([encode(policy.layout, obs[a]) for a in env.agents])
    with torch.no_grad():
        torch.testing.assert_close(policy.eval()(x, mask), loaded(x, mask), rtol=0, atol=0)
    assert set(loaded.act(obs)) == set(env.agents)
    data = torch.load(tmp_path / "policy.pt", weights_only=True)
    assert data["feature_format"] == FEATURE_FORMAT
    del data["feature_format"]  # a checkpoint from before the field: trained on feature format 1
    torch.save(data, tmp_path / "old.pt")
    with pytest.warns(UserWarning, match="feature format 1; this version computes format 2"):
        load_policy(str(tmp_path / "old.pt"))


def test_missing_or_foreign_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"does not exist; train one first.*baselines.meta.train"):
        load_policy(str(tmp_path / "nowhere" / "policy.pt"))
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(2)}, foreign)
    with pytest.raises(ValueError, match="is not a baselines checkpoint"):
        load_policy(str(foreign))


def test_softrankpo_reward_scale_invariance(tmp_path):
    args = ["--algo", "softrankpo", *TINY, *GROUP, "--episodes", "48", "--sft-episodes", "16", "--sft-epochs", "2",
            "--seed", "3"]
    policies = [train_cli.main([*args, "--reward-scale", scale, "--out", str(tmp_path / scale)]) for scale in ("1", "10")]
    for (name, p1), (_, p10) in zip(policies[0].state_dict().items(), policies[1].state_dict().items()):
        assert torch.equal(p1, p10), name
    ppo = [train_cli.main(["--algo", "ppo", *TINY, "--episodes-per-batch", "16", "--reward-scale", s, "--ent-coef", "0",
                           "--no-normalize-advantages", "--out", str(tmp_path / f"ppo{s}")]) for s in ("1", "10")]
    assert not all(torch.equal(a, b) for a, b in zip(ppo[0].state_dict().values(), ppo[1].state_dict().values()))


def test_unknown_algorithm_is_a_clear_error(capsys):
    with pytest.raises(SystemExit):
        train_cli.main(["--algo", "dqn"])
    assert "invalid choice: 'dqn'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown algorithm 'dqn'"):
        train_cli.config_class("dqn")


def test_group_size_below_two_is_a_clear_error(capsys):
    with pytest.raises(SystemExit):
        train_cli.main(["--algo", "softrankpo", "--group-size", "1", *TINY])
    assert "group_size (K) must be >= 2" in capsys.readouterr().err
    with pytest.raises(ValueError, match="group_size"):
        train_cli.run("grpo", train_cli.config_class("grpo")(group_size=1))


class BoxActionGame(ParallelEnv):
    """A one-step game with continuous actions: not supported by the baselines."""

    metadata = {"name": "box_action_game"}
    possible_agents = ["a", "b"]

    def observation_space(self, agent):
        return gymnasium.spaces.Box(0, 1, (2,), np.float32)

    def action_space(self, agent):
        return gymnasium.spaces.Box(-1, 1, (1,), np.float32)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        return {a: np.zeros(2, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        raise AssertionError("never reached")


def test_non_discrete_action_space_is_a_clear_error(tmp_path):
    cfg = SoftRankPOConfig(episodes=8, sft_episodes=0, out=str(tmp_path), progress=False, tensorboard=False)
    with pytest.raises(ValueError, match="Discrete action spaces"):
        train_cli.run("softrankpo", cfg, env_fn=BoxActionGame)
    assert not os.path.exists(tmp_path / "policy.pt")


def test_help_documents_every_field(capsys):
    with pytest.raises(SystemExit):
        train_cli.main(["--algo", "softrankpo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for phrase in ("--tau", "Phi^-1(p) / tau", "--group-size", "rollouts per problem", "--reward-scale",
                   "multiplied by this", "--credit-span", "--sft-episodes", "--kl-coef"):
        assert phrase in text


def test_softrankpo_sft_init_skips_stage_one_and_starts_from_the_checkpoint(tmp_path):
    sft = train_cli.main(["--algo", "sft", "--out", str(tmp_path / "sft"), *TINY, "--epochs", "2"])
    args = ["--algo", "softrankpo", *TINY, *GROUP, "--sft-init", str(tmp_path / "sft" / "policy.pt")]
    untouched = train_cli.main([*args, "--episodes", "0", "--out", str(tmp_path / "rl0")])
    for a, b in zip(sft.state_dict().values(), untouched.state_dict().values()):
        assert torch.equal(a, b)
    assert not (tmp_path / "rl0" / "sft").exists()
    trained = train_cli.main([*args, "--out", str(tmp_path / "rl")])
    assert not all(torch.equal(a, b) for a, b in zip(sft.state_dict().values(), trained.state_dict().values()))


@pytest.mark.parametrize("module", ["baselines.meta.train", "baselines.meta.evaluate", "baselines.llm.train_llm"])
def test_the_documented_entry_points_are_the_programs(module, capsys):
    """The README's commands name the real modules: each is its own program, and its usage says so."""
    import importlib

    with pytest.raises(SystemExit) as exited:
        importlib.import_module(module).main(["--help"])
    assert exited.value.code == 0 and f"python -m {module}" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["structured", "flat"])
def test_a_float64_policy_takes_the_float32_observations_and_computes_in_float64(kind):
    """Weights built under ``torch.set_default_dtype(torch.float64)`` (bench/studies/kernel_divergence.py trains so)
    act on the env's float32 observations, in float64, with the float32 policy's decisions up to rounding."""
    from baselines.meta.policy import Policy, make_layout

    env = deliberation_env.parallel_env(**({"observation": "flat"} if kind == "flat" else {}))
    obs, _ = env.reset(seed=0)
    agent = env.agents[0]
    layout = make_layout(env.observation_space(agent), env.action_space(agent))
    assert layout.kind == kind
    x, mask = stack([encode(layout, obs[a]) for a in env.agents])
    assert x.dtype == torch.float32
    torch.manual_seed(0)
    single = Policy(layout)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        double = Policy(layout)
    finally:
        torch.set_default_dtype(previous)
    double.load_state_dict(single.state_dict())
    logits = double(x, mask)
    assert logits.dtype == torch.float64
    torch.testing.assert_close(logits.float(), single(x, mask), rtol=1e-5, atol=1e-5)
