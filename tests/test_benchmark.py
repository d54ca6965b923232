"""The benchmark's protocol: derived splits, scoring any policy form the leaderboard's way, saved outcomes, the CLI,
and an algorithm written outside ``baselines`` getting its row with one call."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from baselines.benchmark import (
    PROTOCOL_ROWS,
    Cell,
    Scores,
    describe,
    main,
    parse_cell,
    policy_scores,
    protocol_scores,
    resolve,
    score,
    shipped_cells,
)
from baselines.meta.policy import Policy, agent_layout, save_checkpoint
from deliberation_env.make import replay_env
from deliberation_env.protocols import make_protocol
from deliberation_env.replay import ReplayError, load_card
from deliberation_env.replay.dataset import problem_strata, split_problem_ids

ROOT = Path(__file__).resolve().parents[1]
CELL = "qwen05-arith-v2:v2"


def test_validation_is_a_third_of_the_train_problems_stratified_by_level_like_test():
    card = load_card("qwen05-arith-v2")
    validation, fit = split_problem_ids(card, "validation"), split_problem_ids(card, "fit")
    assert sorted(validation + fit) == sorted(card.splits["train"]) and not set(validation) & set(fit)
    assert abs(len(validation) / len(card.splits["train"]) - 1 / 3) < 0.01
    assert [p.id for p in replay_env("qwen05-arith-v2", "validation").problems] == validation
    assert not set(validation) & set(card.splits["test"])
    test_levels = [p.metadata["level"] for p in replay_env("qwen05-arith-v2", "test").problems]
    levels = problem_strata(card)
    for level in (0, 1):  # the same mix of levels as test, within a point
        share = np.mean([levels[pid] == level for pid in validation])
        assert abs(share - np.mean([found == level for found in test_levels])) < 0.01
        within = [pid for pid in card.splits["train"] if levels[pid] == level]
        assert sum(levels[pid] == level for pid in validation) == round(len(within) / 3)
    # the same ids carve the same way in every set that recorded them
    assert split_problem_ids(load_card("qwen05-team-arith"), "validation") == validation
    with pytest.raises(ReplayError, match="carved from them"):
        replay_env("qwen05-arith-v2", "dev")


def greedy_confident(observations, nodes):
    """PERSIST when confident, else REFINE: a deterministic policy over the batched dict observation."""
    prefer = np.where(observations["self"][..., 3] >= 0.6, 0, 1)
    return np.eye(observations["action_mask"].shape[-1])[prefer]


class ConfidentActor:
    """The same policy as an actor of the PettingZoo dict API."""

    def reset(self, seed=None):
        pass

    def act(self, observations, infos):
        return {agent: 0 if obs["self"][3] >= 0.6 else 1 for agent, obs in observations.items()}


def make_actor():
    return ConfidentActor()


def test_a_probabilities_function_and_the_same_actor_score_alike():
    exact = policy_scores(greedy_confident, CELL, "test")
    played = policy_scores(ConfidentActor(), CELL, "test")
    assert exact.problem_ids == played.problem_ids and len(exact.problem_ids) == 400
    assert np.array_equal(exact.accuracy, played.accuracy)
    assert np.allclose(exact.tokens, played.tokens)


def test_score_gives_the_row_against_the_protocol_chosen_on_validation(tmp_path):
    report = score([greedy_confident, ConfidentActor()], CELL, label="confident")
    validation = protocol_scores(CELL, "validation", PROTOCOL_ROWS)  # the best protocol on validation, not on test
    assert report.protocol == max(PROTOCOL_ROWS, key=lambda name: validation[name].accuracy.mean()) == "debate"
    assert report.protocol_scores.split == "test" and len(report.runs) == 2
    diff, low, high = report.difference
    assert diff == pytest.approx(report.accuracy - report.protocol_scores.accuracy.mean()) and low <= diff <= high
    assert "confident on qwen05-arith-v2:v2" in str(report) and "points" in str(report)
    report.save(tmp_path / "row")
    again = Scores.load(tmp_path / "row" / "run0.csv")
    assert again.problem_ids == report.runs[0].problem_ids and np.array_equal(again.accuracy, report.runs[0].accuracy)
    # saved scores score again, the same row, without the policy
    assert score([Scores.load(tmp_path / "row" / f"run{k}.csv") for k in (0, 1)], CELL).difference == report.difference


def test_a_checkpoint_and_a_module_spec_resolve_and_a_policy_of_another_game_is_refused(tmp_path):
    env = replay_env("qwen05-arith-v2", "test", features="v2")
    policy = Policy(agent_layout(env))
    path = save_checkpoint(str(tmp_path / "policy.pt"), policy, "sft", {})
    from_path = policy_scores(path, CELL)
    assert np.array_equal(from_path.accuracy, policy_scores(policy, CELL).accuracy)
    assert isinstance(resolve(f"{__name__}:make_actor"), ConfidentActor)  # a factory without arguments is called
    spec = policy_scores(f"{__name__}:make_actor", CELL)
    assert np.array_equal(spec.accuracy, policy_scores(ConfidentActor(), CELL).accuracy)
    debate = policy_scores(make_protocol("debate"), CELL)  # a protocol is an actor too
    assert not np.array_equal(debate.accuracy, spec.accuracy)
    with pytest.raises(ValueError, match="another observation"):
        policy_scores(path, "qwen05-arith-v2:v1")


def test_cells_and_cli_errors(capsys):
    names = [cell.name for cell in shipped_cells()]
    assert "qwen05-team-arith:chosen-v3" in names and "qwen05-arith:chosen-v3" not in names  # rule-only concedes
    assert {"qwen05-arith:v2-r2", "qwen05-arith-v2:chosen-v3-r2", "qwen05-team-arith:chosen-v3-r2"} <= set(names)
    assert "2 decisions (round 2: PERSIST and CONCEDE only, past the 1 recorded)" in describe("qwen05-team-arith:v2-r2")
    with pytest.raises(ValueError, match="rule's peer only"):
        parse_cell("qwen05-arith:chosen-v3")
    assert parse_cell(CELL) == Cell("qwen05-arith-v2", "v2")
    assert main(["score", "no_such_module:policy", "--cell", CELL]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("python -m baselines.benchmark: error: cannot load policy") and "\n" not in error
    assert main(["score", "x.pt", "--cell", "nowhere"]) == 2
    assert "a cell is '<set>:<game>'" in capsys.readouterr().err


def test_an_algorithm_written_outside_baselines_gets_its_row_in_one_call():
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "own_algorithm.py"), "--episodes", "16384"],
                            capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("reinforce on qwen05-arith-v2:v2 (test, 400 problems, 1 run(s)): accuracy ")
    assert "vs debate" in result.stdout  # the best protocol on validation
