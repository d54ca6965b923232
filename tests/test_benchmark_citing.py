"""A row you can cite (issue: numbers you can cite): the scorer refuses what is not probabilities in every mode,
names the set it scored (digest in Scores files, row.json and the printed row), refuses to pool runs of another set,
names where a checkpoint was trained unlike the leaderboard, and scores a flat-observation (SB3) model as it is."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium
import numpy as np
import pytest

from baselines.benchmark import FlatObservations, Scores, parse_cell, policy_scores, score
from baselines.evaluation.evaluate import play_episodes
from baselines.meta.policy import Policy, agent_layout, load_policy, save_checkpoint
from deliberation_env.make import replay_env
from deliberation_env.replay import PINNED
from tests.test_benchmark import CELL, greedy_confident


def nonsense(kind: str):
    """A probability function whose answers are not probabilities (``kind``), for the first agent of every node."""
    def policy(observations, nodes):
        probabilities = greedy_confident(observations, nodes).astype(float)
        bad = {"nan": np.nan, "zero": 0.0, "negative": -0.5, "two": 2.0}[kind]
        probabilities[:, 0, :] = bad if kind != "two" else probabilities[:, 0, :] * bad
        if kind == "negative":
            probabilities[:, 0, 0] = 1.5
        return probabilities
    return policy


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("kind", ["nan", "zero", "negative", "two"])
def test_nonsense_is_refused_greedy_or_not(kind, greedy):
    with pytest.raises(ValueError, match="not probabilities: node 0, agent 0 got"):
        policy_scores(nonsense(kind), CELL, greedy=greedy)
    with pytest.raises(ValueError, match="not probabilities"):
        score(nonsense(kind), CELL, greedy=greedy)


def test_a_row_names_its_set_digest_in_every_file_and_line(tmp_path):
    report = score(greedy_confident, CELL, label="confident")
    digest = PINNED["qwen05-arith-v2"]
    assert report.digest == digest and f"set digest {digest}" in str(report)
    row = json.loads(Path(report.save(tmp_path / "row")).read_text())
    assert row["set_digest"] == digest and row["package_version"] and row["level"] == 0.95
    header = json.loads((tmp_path / "row" / "run0.csv").read_text().splitlines()[0].removeprefix("# "))
    assert header == {"label": "confident", "cell": CELL, "split": "test", "digest": digest}
    assert Scores.load(tmp_path / "row" / "run0.csv").digest == digest
    # runs scored elsewhere pool by Scores.load, and only runs of the same set do
    other = Scores.load(tmp_path / "row" / "run0.csv")
    other.digest = "0123456789abcdef"
    with pytest.raises(ValueError, match="set digest 0123456789abcdef, qwen05-arith-v2:v2 here is " + digest):
        score([Scores.load(tmp_path / "row" / "run0.csv"), other], CELL)


def trained(tmp_path, **config) -> str:
    policy = Policy(agent_layout(replay_env("qwen05-arith-v2", "test", features="v2")))
    return save_checkpoint(str(tmp_path / "policy.pt"), policy, "sft", config)


def test_a_checkpoint_records_its_game_and_score_names_each_departure(tmp_path):
    path = trained(tmp_path, replay="qwen05-arith-v2", train_split="fit", env_options={"features": "v2"})
    assert load_policy(path).trained_on == {"set": "qwen05-arith-v2", "digest": PINNED["qwen05-arith-v2"],
                                            "split": "fit", "env_options": {"features": "v2"}}
    assert score(path, CELL).departures == []  # trained as the leaderboard trains: nothing to say
    path = trained(tmp_path, replay="qwen05-team-arith", train_split="train",
                   env_options={"features": "v2", "confidence": "critic"})
    report = score(path, CELL)
    text = str(report)
    assert len(report.departures) == 3 and text.count("\n  departure: ") == 3
    assert "trained on set 'qwen05-team-arith'" in text and PINNED["qwen05-team-arith"] in text
    assert "split 'train', which holds the validation problems" in text
    assert "env options {'confidence': 'critic'}" in text


class Flat(gymnasium.Env):
    """Only the spaces of the cell's flat observation, for building an SB3 model."""

    def __init__(self, env):
        self.observation_space = env.observation_space(env.possible_agents[0])
        self.action_space = env.action_space(env.possible_agents[0])


def test_an_sb3_model_of_flat_observations_is_scored_as_it_is_and_as_it_plays():
    stable_baselines3 = pytest.importorskip("stable_baselines3")
    import torch

    cell = parse_cell(CELL)
    env = cell.env("test", observation="flat")
    stable_baselines3.common.utils.set_random_seed(3)
    model = stable_baselines3.PPO("MlpPolicy", Flat(env), device="cpu")
    exact = policy_scores(model, cell)  # no flattening by hand: the model as SB3 trained it

    class Greedy:
        def reset(self, seed=None):
            pass

        def act(self, observations, infos):
            with torch.no_grad():
                return {a: int(model.predict(o, deterministic=True)[0]) for a, o in observations.items()}

    records = play_episodes([env], [Greedy()], [(0, p) for p in range(len(env.problems))])
    assert np.array_equal(exact.accuracy, [float(r["correct"]) for r in records])
    assert 0.3 < exact.accuracy.mean() < 0.8
    wrapped = policy_scores(FlatObservations.of_sb3(model), cell)
    assert np.array_equal(wrapped.accuracy, exact.accuracy)
    with pytest.raises(ValueError, match="reads observations of shape"):
        policy_scores(model, "qwen05-arith-v2:v1")
