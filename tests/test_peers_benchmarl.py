"""BenchMARL on a replay set (``baselines.peers.benchmarl_task``): the exact score of a trained BenchMARL policy is
what playing it through the env gives, problem by problem.

BenchMARL 1.5.2 needs torchrl<0.12 and the dev extra torchrl>=0.14, so the tests marked ``benchmarl`` run only in
a virtualenv of their own (``pip install -e '.[benchmarl]' pytest``, docs/peers.md); elsewhere they skip, and
``DELIBERATION_ENV_NO_SKIP=1`` lets that one skip pass (tests/conftest.py). The import test runs everywhere.
"""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest

from deliberation_env.engine import TreeEnv, compile_tree, expected_scores

DATASET = "qwen05-arith-v2"
PROBLEMS = range(40)
"""The first 40 test problems: the compiled tree and the played episodes cover the same ones."""


def test_without_benchmarl_the_import_error_names_the_extra(monkeypatch):
    monkeypatch.delitem(sys.modules, "baselines.peers.benchmarl_task", raising=False)
    monkeypatch.setitem(sys.modules, "benchmarl", None)  # as if not installed: `import benchmarl...` fails
    with pytest.raises(ImportError, match=r"needs BenchMARL \(benchmarl is not installed\).*\.\[benchmarl\]") as error:
        importlib.import_module("baselines.peers.benchmarl_task")
    assert "virtualenv of its own" in str(error.value)


@pytest.fixture(scope="module")
def benchmarl_modules():
    pytest.importorskip("benchmarl", reason="BenchMARL is not installed: it needs a virtualenv of its own "
                                            "(pip install -e '.[benchmarl]', docs/peers.md)")
    import torch

    torch.set_num_threads(1)
    return importlib.import_module("baselines.peers.benchmarl_task")


@pytest.fixture(scope="module")
def test_tree(benchmarl_modules, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DELIBERATION_ENV_CACHE", str(cache))
        return compile_tree(DATASET, "test", features="v2", problems=PROBLEMS)


def tiny_experiment(peers, algorithm: str, folder, task=None) -> object:
    """A BenchMARL experiment of ``algorithm`` trained for 2 iterations of 100 frames on ``task`` (default: the
    train split through the PettingZoo env)."""
    from benchmarl.algorithms import IqlConfig, MappoConfig
    from benchmarl.experiment import Experiment, ExperimentConfig
    from benchmarl.models.mlp import MlpConfig

    config = ExperimentConfig.get_from_yaml()
    config.max_n_frames = 200
    config.on_policy_collected_frames_per_batch = config.off_policy_collected_frames_per_batch = 100
    config.on_policy_n_envs_per_worker = config.off_policy_n_envs_per_worker = 4
    config.on_policy_minibatch_size, config.on_policy_n_minibatch_iters = 50, 4
    config.off_policy_train_batch_size, config.off_policy_n_optimizer_steps = 50, 20
    config.lr = 0.003  # a policy that moved from its initial weights in 200 frames
    config.evaluation, config.render, config.loggers, config.create_json = False, False, [], False
    config.checkpoint_at_end, config.save_folder = False, str(folder)
    algorithms = {"mappo": MappoConfig, "iql": IqlConfig}
    experiment = Experiment(task=task or peers.ReplayTask.of(DATASET, split="train", features="v2"),
                            algorithm_config=algorithms[algorithm].get_from_yaml(),
                            model_config=MlpConfig.get_from_yaml(), seed=0, config=config)
    experiment.run()
    return experiment


def play(peers, experiment, problems) -> dict[str, np.ndarray]:
    """Each problem of the test split played once through the task's TorchRL env with the experiment's own policy
    acting deterministically (as BenchMARL's evaluation does): outcome, tokens, first actions and, for an actor
    with a distribution, its first action probabilities."""
    import torch
    from torchrl.envs.utils import ExplorationType, set_exploration_type, step_mdp

    env = peers.ReplayTask.of(DATASET, split="test", features="v2").get_env_fun(1, False, 0, "cpu")()
    actor = experiment.algorithm.get_policy_for_loss(peers.GROUP)
    played: dict[str, list] = {"accuracy": [], "tokens": [], "actions": [], "probabilities": []}
    for problem in problems:
        td = env.reset(options={"problem_index": problem})
        first = True
        with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
            while True:
                if first and hasattr(actor, "get_dist"):
                    played["probabilities"].append(actor.get_dist(td.clone()).probs.numpy())
                td = env.step(experiment.policy(td))
                if first:
                    played["actions"].append(td[peers.GROUP, "action"].numpy())
                    first = False
                if td["next", "done"].all():
                    break
                td = step_mdp(td)
        info = td["next", peers.GROUP, "info"]
        played["accuracy"].append(float(info["consensus_correct"][0]))
        played["tokens"].append(float(info["tokens_total"].sum()))
    return {key: np.array(value) for key, value in played.items()}


@pytest.mark.benchmarl
@pytest.mark.parametrize("algorithm", ["mappo", "iql"])
def test_exact_score_of_a_benchmarl_policy_is_what_playing_it_gives(benchmarl_modules, test_tree, algorithm,
                                                                    tmp_path):
    peers = benchmarl_modules
    experiment = tiny_experiment(peers, algorithm, tmp_path)
    exact = expected_scores(test_tree, peers.policy_probabilities(experiment), format=peers.MASKED)
    played = play(peers, experiment, PROBLEMS)
    np.testing.assert_array_equal(exact["accuracy"], played["accuracy"])
    np.testing.assert_allclose(exact["tokens"], played["tokens"])
    # The adapter reads the observation as BenchMARL's env lays it out: the same greedy actions at the roots, and
    # (for an actor with a distribution) the same probabilities, which an observation read in another order
    # would change.
    roots = test_tree.roots[:, 0]
    observed = TreeEnv(test_tree, 1, format=peers.MASKED).observe(roots)
    greedy = peers.policy_probabilities(experiment)(observed, roots)
    np.testing.assert_array_equal(greedy.argmax(-1), played["actions"])
    assert len(np.unique(played["actions"])) > 1, "the tiny policy plays one action everywhere: the check is blind"
    if algorithm == "mappo":
        stochastic = peers.policy_probabilities(experiment, greedy=False)(observed, roots)
        np.testing.assert_allclose(stochastic, played["probabilities"], rtol=1e-5, atol=1e-6)
        assert not np.allclose(stochastic, stochastic[:1]), "the probabilities do not depend on the observation"
    else:
        with pytest.raises(ValueError, match="greedy=True"):
            peers.policy_probabilities(experiment, greedy=False)


@pytest.mark.benchmarl
def test_the_task_checks_its_split_and_seeds_each_env_apart(benchmarl_modules):
    peers = benchmarl_modules
    with pytest.raises(ValueError, match=r"splits \['fit', 'test', 'train', 'validation'\], not 'dev'"):
        peers.ReplayTask.of(DATASET, split="dev")
    assert peers.ReplayTask.of(DATASET, split="fit").config["split"] == "fit"  # the benchmark's training split
    with pytest.raises(ValueError, match="sets \\['observation'\\] itself"):
        peers.ReplayTask.of(DATASET, observation="flat")
    # BenchMARL steps copies of one factory's env side by side: each copy must draw its own problems.
    make = peers.ReplayTask.of(DATASET, features="v2").get_env_fun(4, False, 0, "cpu")
    draws = [np.stack([env.reset()[peers.GROUP, "observation", "observation"] for _ in range(5)])
             for env in (make() for _ in range(4))]
    assert all(not np.array_equal(draws[0], other) for other in draws[1:])


@pytest.mark.benchmarl
def test_the_tree_task_is_a_batched_env_that_benchmarl_trains_on(benchmarl_modules, test_tree, tmp_path, monkeypatch):
    from torchrl.envs.utils import check_env_specs

    peers = benchmarl_modules
    monkeypatch.setenv("DELIBERATION_ENV_CACHE", str(tmp_path / "cache"))
    # persist (the default): TorchRL's check_env_specs and rollout() play random actions without the mask
    task = peers.TreeTask.of(DATASET, split="test", features="v2", problems=list(PROBLEMS))
    env = task.get_env_fun(8, False, 0, "cpu")()
    check_env_specs(env)
    assert env.batch_size == (8,)
    # What BenchMARL's algorithms read is what they read from the PettingZoo env: one policy serves both.
    wrapped = peers.ReplayTask.of(DATASET, split="test", features="v2").get_env_fun(1, False, 0, "cpu")()
    plain = peers.ReplayTask.of(DATASET, features="v2")
    for spec in ("observation_spec", "action_mask_spec", "action_spec"):
        assert getattr(task, spec)(env) == getattr(plain, spec)(wrapped), spec
    steps = env.rollout(3, break_when_any_done=False)  # 1-round episodes: every step ends them, every reset restarts
    assert steps["next", "done"].all() and steps.shape == (8, 3)

    experiment = tiny_experiment(peers, "mappo", tmp_path, task=task)
    assert experiment.env_func().batch_size == (4,)  # used as a batched env, not a SerialEnv of copies
    assert experiment.total_frames == 200
    exact = expected_scores(test_tree, peers.policy_probabilities(experiment), format=peers.MASKED)
    assert exact["accuracy"].shape == (len(PROBLEMS),)


@pytest.mark.benchmarl
def test_the_sweep_trains_on_fit_and_writes_the_suites_external_rows(benchmarl_modules, tmp_path,
                                                                   monkeypatch):
    """bench/benchmark/peers_benchmarl.py on a small recorded set: one run of BenchMARL's MAPPO (its defaults, one
    batch of frames) trained on ``fit``, scored on validation and test, saved where benchmark_suite reads it."""
    import json
    import os
    from pathlib import Path

    from baselines.benchmark import Scores, parse_cell
    from deliberation_env.record import main as record
    from tests.test_replay import SIM_FLAGS

    monkeypatch.setenv("DELIBERATION_ENV_CACHE", str(tmp_path / "cache"))
    for split, problems in (("train", "0:16"), ("test", "0:8")):
        record(["--out", str(tmp_path / "small"), "--split", split, "--problems", problems, "--chunk", "16", *SIM_FLAGS])
    cell = parse_cell(f"{tmp_path / 'small'}:v2")
    from bench.benchmark import peers_benchmarl as sweep
    from bench.common import suite
    flags = ["--algorithms", "mappo", "--seeds", "0", "--frames", "6000", "--cell", cell.name, "--out", str(tmp_path)]
    sweep.main(flags)
    paths = sweep.run_paths(str(tmp_path), cell, "mappo", 0)
    meta = json.loads(Path(paths["json"]).read_text())
    assert meta["frames"] == 6000 and meta["task"] == "tree" and meta["versions"]["benchmarl"] == "1.5.2"
    for split in ("validation", "test"):
        scores = Scores.load(paths[split])
        assert scores.problem_ids == list(cell.tree(split).problem_ids) and scores.split == split
        assert meta[f"{split}_accuracy"] == pytest.approx(scores.accuracy.mean())
    made = os.stat(paths["test"]).st_mtime_ns
    sweep.main(flags)  # done before: skipped
    assert os.stat(paths["test"]).st_mtime_ns == made
    found = suite.read(str(tmp_path / suite.folder_name(cell)))
    assert found["trainers"]["benchmarl-mappo"]["chosen"] == "default" and not found["trainers"]["benchmarl-mappo"]["grid"]
    assert found["trainers"]["benchmarl-mappo"]["frames"] == [6000]  # the report states a peer's budget
