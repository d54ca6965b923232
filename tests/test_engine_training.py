"""Training on a replay set's compiled tree (``--engine tree``, the default) is training on the env: every meta
trainer ends with the same weights and logs the same metrics either way, and the tree's rollouts equal the env's
row for row."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from baselines.meta.policy import Policy, agent_layout
from baselines.meta.rollout import EpisodeSpec, collect, sampling_key
from baselines.meta.train import main as train
from baselines.meta.tree_rollout import collect_tree
from deliberation_env.engine import compile_tree
from deliberation_env.make import replay_env

SET = "qwen05-arith-v2"
BUDGETS = {  # one or two batches each
    "softrankpo": ["--sft-episodes", "48", "--sft-epochs", "2", "--episodes", "64", "--group-size", "4",
                   "--groups-per-batch", "8"],
    "grpo": ["--episodes", "64", "--group-size", "4", "--groups-per-batch", "8"],
    "magrpo": ["--episodes", "64", "--group-size", "4", "--groups-per-batch", "8"],
    "ppo": ["--episodes", "64", "--episodes-per-batch", "32"],
    "mappo": ["--episodes", "64", "--episodes-per-batch", "32", "--centralized-critic"],
    "sft": ["--episodes", "64", "--epochs", "2"],
}
VOLATILE = ("time", "seconds", "episodes_per_s", "steps_per_s", "wall")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("engine-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DELIBERATION_ENV_CACHE", str(path))
        yield path


def metrics(run) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not any(word in k for word in VOLATILE)} for row in rows]


@pytest.mark.parametrize("algo", list(BUDGETS))
def test_every_trainer_learns_the_same_on_the_tree_as_on_the_env(algo, cache, tmp_path):
    runs = {}
    for engine in ("env", "tree"):
        out = tmp_path / engine
        flags = ["--algo", "ppo" if algo == "mappo" else algo, "--replay", SET, "--env-option", "features=v2",
                 "--engine", engine, "--no-evaluate", "--seed", "3", "--out", str(out), *BUDGETS[algo]]
        train(flags)
        runs[engine] = out
    assert list((cache / "trees").glob(f"{SET}-train-*.npz")), "the tree run compiled nothing: it played the env"
    weights = {engine: torch.load(run / "policy.pt", weights_only=True)["state_dict"] for engine, run in runs.items()}
    assert weights["env"].keys() == weights["tree"].keys()
    for name in weights["env"]:
        assert torch.equal(weights["env"][name], weights["tree"][name]), name
    assert metrics(runs["env"]) == metrics(runs["tree"])
    initial = Policy(agent_layout(replay_env(SET, "train", features="v2")))
    assert any(not torch.equal(initial.state_dict()[k], weights["tree"][k]) for k in weights["tree"]), "nothing trained"


def test_tree_rollouts_equal_the_env_s_row_for_row(cache):
    env_options = {"features": "v3", "concede_to_peer": True}
    envs = [replay_env("qwen05-team-arith", "test", **env_options) for _ in range(6)]
    tree = compile_tree("qwen05-team-arith", "test", problems=range(50), **env_options)  # indices 0-49 as the env's
    layout = agent_layout(envs[0])
    torch.manual_seed(1)
    policy = Policy(layout)
    specs = [EpisodeSpec(seed=s // 3, group=s // 3, options={"problem_index": (7 * s) % 50}) for s in range(40)]
    key = sampling_key(5, "check")
    played = collect(envs, layout, policy, specs, key, reward_scale=2.0, label_key="oracle_action", want_state=True)
    replayed = collect_tree(tree, envs[0].format, len(envs), layout, policy, specs, key, reward_scale=2.0,
                            label_key="oracle_action", want_state=True)
    for name in ("obs", "mask", "actions", "logp", "rewards", "episode", "group", "agent", "step", "labels", "state"):
        assert np.array_equal(getattr(played, name), getattr(replayed, name)), name
    assert played.episodes == replayed.episodes
    assert (played.labels >= 0).all() and len(set(played.actions.tolist())) > 3  # labels read, peer concedes played
