"""BenchMARL's algorithms on a benchmark cell with their default configs, as external rows of the leaderboard.

    python bench/benchmark/peers_benchmarl.py                                   # MAPPO IPPO QMIX VDN IQL, seeds 0-9
    python bench/benchmark/peers_benchmarl.py --algorithms mappo iql --seeds 0 1 --frames 6000
    python bench/benchmark/benchmark_suite.py --report-only                     # the leaderboard, these rows in it

Needs the ``benchmarl`` extra in a virtualenv of its own (docs/peers.md). The benchmark's protocol
(docs/benchmark.md) with BenchMARL's own configs: each run trains one algorithm with one seed on the cell's ``fit``
split (BenchMARL's default experiment, algorithm and MLP configs from its YAML files; only the frame budget is ours,
and BenchMARL's own evaluation is off: it would play random episodes of the training split), through
``baselines.peers.benchmarl_task.TreeTask`` (the batched env over the compiled tree; ``--task replay``: the
PettingZoo env in TorchRL's wrapper, the same game and specs, slower); then its greedy policy is scored exactly on
every problem of the validation and test splits. Nothing is tuned or chosen (BenchMARL's defaults are the row), so
the test scores are read once, as the suite's. A run writes the suite's files,
``<out>/<cell>/benchmarl-<algorithm>/final-default-seed<k>-<split>.csv`` (``baselines.benchmark.Scores``) and
``.json`` (frames, times, versions); a run whose test CSV exists is skipped, so an interrupted sweep resumes, and
``benchmark_suite.py`` reports these rows beside ours.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

from baselines.benchmark import Scores, parse_cell
from bench.common.results import RESULTS, command_line
from bench.common.suite import EXTERNAL, folder_name
from deliberation_env.cli import ArgumentParser
from deliberation_env.replay import load_card
from deliberation_env.replay.provenance import library_versions

ALGORITHMS = ("mappo", "ippo", "qmix", "vdn", "iql")
"""BenchMARL's discrete-action algorithms run here (its ``<Name>Config`` classes)."""
LIBRARIES = ("benchmarl", "torchrl", "tensordict", "torch", "numpy", "deliberation-env")
SPLITS = ("validation", "test")


def algorithm_config(name: str):
    """BenchMARL's default config of algorithm ``name`` (its YAML file)."""
    import benchmarl.algorithms as algorithms

    return getattr(algorithms, {"mappo": "MappoConfig", "ippo": "IppoConfig", "qmix": "QmixConfig",
                                "vdn": "VdnConfig", "iql": "IqlConfig"}[name]).get_from_yaml()


def experiment_config(frames: int, folder: str):
    """BenchMARL's default experiment config with our frame budget; its evaluation, loggers and files off."""
    from benchmarl.experiment import ExperimentConfig

    config = ExperimentConfig.get_from_yaml()
    config.max_n_frames = frames
    config.evaluation, config.render, config.loggers, config.create_json = False, False, [], False
    config.checkpoint_at_end, config.checkpoint_interval, config.save_folder = False, 0, folder
    return config


def train_and_score(algorithm: str, seed: int, frames: int, cell, task: str) -> dict:
    """One run: train on ``fit``, score greedily on every problem of ``SPLITS``; the Scores per split and times."""
    from benchmarl.experiment import Experiment
    from benchmarl.models.mlp import MlpConfig

    from baselines.peers.benchmarl_task import MASKED, ReplayTask, TreeTask, policy_probabilities
    from deliberation_env.engine import expected_scores

    kind = {"tree": TreeTask, "replay": ReplayTask}[task]
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        experiment = Experiment(task=kind.of(cell.dataset, split="fit", **cell.options),
                                algorithm_config=algorithm_config(algorithm), model_config=MlpConfig.get_from_yaml(),
                                seed=seed, config=experiment_config(frames, folder))
        experiment.run()
        trained = time.perf_counter() - started
        started = time.perf_counter()
        probabilities, scores = policy_probabilities(experiment), {}
        for split in SPLITS:
            tree = cell.tree(split)
            exact = expected_scores(tree, probabilities, format=MASKED)
            scores[split] = Scores(f"{EXTERNAL}{algorithm}", cell.name, split, list(tree.problem_ids),
                                   exact["accuracy"], exact["tokens"], cell.digest)
        scored = time.perf_counter() - started
    return {"scores": scores, "frames": experiment.total_frames, "train_seconds": round(trained, 1),
            "score_seconds": round(scored, 2)}


def run_paths(out: str, cell, algorithm: str, seed: int, episodes: int | None = None) -> dict[str, str]:
    """A run's files: the leaderboard's (``final-default-seed<k>``) or, with ``episodes``, the sample-efficiency
    track's (``budget-<episodes>-seed<k>``, bench/benchmark/tracks.py)."""
    name = f"final-default-seed{seed}" if episodes is None else f"budget-{episodes}-seed{seed}"
    stem = os.path.join(out, folder_name(cell), f"{EXTERNAL}{algorithm}", name)
    return {"json": stem + ".json", **{split: f"{stem}-{split}.csv" for split in SPLITS}}


def save_run(paths: dict[str, str], algorithm: str, seed: int, run: dict, settings: dict) -> None:
    """The run's JSON and validation scores, then its test scores (whose file marks the run done)."""
    meta = {"algorithm": algorithm, "seed": seed, **{k: run[k] for k in ("frames", "train_seconds", "score_seconds")},
            **settings, **{f"{split}_accuracy": float(run["scores"][split].accuracy.mean()) for split in SPLITS},
            "versions": library_versions(LIBRARIES)}
    os.makedirs(os.path.dirname(paths["json"]), exist_ok=True)
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)
    for split in SPLITS:  # test last: a run is done when its test file is there
        run["scores"][split].save(paths[split] + ".tmp")
        os.replace(paths[split] + ".tmp", paths[split])


def main(argv=None) -> None:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=ALGORITHMS)
    parser.add_argument("--seeds", nargs="+", type=int, default=list(range(10)))
    parser.add_argument("--frames", type=int, default=12_000, help="training frames per run (env steps)")
    parser.add_argument("--episodes", type=int, default=None,
                        help="a sample-efficiency track run instead (bench/benchmark/tracks.py): this many episodes, "
                        "that is episodes x the game's rounds frames, written as budget-<episodes>-seed<k>")
    parser.add_argument("--cell", default="qwen05-arith-v2:v2", help="'<set>:<game>' (python -m baselines.benchmark cells)")
    parser.add_argument("--task", choices=("tree", "replay"), default="tree",
                        help="BenchMARL's env: the batched tree (TreeTask) or the PettingZoo env (ReplayTask)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", default=os.path.join(RESULTS, "leaderboard"), help="the leaderboard's folder")
    args = parser.parse_args(argv)
    if args.frames < 1 or (args.episodes is not None and args.episodes < 1):
        parser.error(f"--frames and --episodes must be >= 1, got {args.frames} and {args.episodes}")
    try:
        cell = parse_cell(args.cell)
    except ValueError as error:
        parser.error(str(error))
    if args.episodes is not None:  # a frame is one step of the game: a round
        args.frames = args.episodes * (cell.options.get("max_rounds") or load_card(cell.dataset).rounds)
    import torch

    torch.set_num_threads(args.threads)
    settings = {"cell": cell.name, "task": args.task, "threads": args.threads, "command": command_line()}
    for seed in args.seeds:  # every algorithm's seed k before any seed k+1: a cut-short sweep stays balanced
        for algorithm in args.algorithms:
            paths = run_paths(args.out, cell, algorithm, seed, args.episodes)
            if os.path.exists(paths["test"]):
                print(f"{algorithm} seed {seed}: done before, skipped")
                continue
            run = train_and_score(algorithm, seed, args.frames, cell, args.task)
            save_run(paths, algorithm, seed, run, settings)
            print(f"{algorithm} seed {seed}: validation {run['scores']['validation'].accuracy.mean():.3f}, test "
                  f"{run['scores']['test'].accuracy.mean():.3f}, trained {run['train_seconds']:.0f} s", flush=True)
    print(f"the leaderboard with these rows: python bench/benchmark/benchmark_suite.py --report-only --cells {cell.name}")


if __name__ == "__main__":
    main()
