"""BenchMARL's algorithms on a replay set with their default configs, scored exactly on the test split.

    python bench/benchmark/peers_benchmarl.py                                   # MAPPO IPPO QMIX VDN IQL, seeds 0-2, 12,000 frames
    python bench/benchmark/peers_benchmarl.py --algorithms mappo iql --seeds 0 1 --frames 6000
    python bench/benchmark/peers_benchmarl.py --report-only                     # the summary again from the saved runs

Needs the ``benchmarl`` extra in a virtualenv of its own (docs/peers.md). Each run trains one algorithm with one seed
on the set's train split through ``baselines.peers.benchmarl_task.ReplayTask`` (BenchMARL's default experiment,
algorithm and MLP configs from its YAML files; only the frame budget is ours, and BenchMARL's own evaluation is off:
it would play random episodes of the training split), then scores the greedy policy on every problem of the test
split exactly (``deliberation_env.engine.expected_scores`` over the compiled game). A run writes
``<out>/<algorithm>-seed<k>.csv`` (problem_id, accuracy, tokens) and ``.json`` (times, versions); a run whose CSV
exists is skipped, so an interrupted sweep resumes. ``<out>.md`` summarises every saved run.
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
import time

import numpy as np
from _results import command_line

from deliberation_env.cli import ArgumentParser
from deliberation_env.core.actions import Action
from deliberation_env.replay.provenance import library_versions

ALGORITHMS = ("mappo", "ippo", "qmix", "vdn", "iql")
"""BenchMARL's discrete-action algorithms run here (its ``<Name>Config`` classes)."""
LIBRARIES = ("benchmarl", "torchrl", "tensordict", "torch", "numpy", "deliberation-env")


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


def train_and_score(algorithm: str, seed: int, frames: int, dataset: str, features: str, tree) -> dict:
    """One run: train on the train split, score greedily on ``tree`` (the test split); per-problem arrays and times."""
    from benchmarl.experiment import Experiment
    from benchmarl.models.mlp import MlpConfig

    from baselines.peers.benchmarl_task import MASKED, ReplayTask, policy_probabilities
    from deliberation_env.engine import expected_scores

    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        experiment = Experiment(task=ReplayTask.of(dataset, split="train", features=features),
                                algorithm_config=algorithm_config(algorithm), model_config=MlpConfig.get_from_yaml(),
                                seed=seed, config=experiment_config(frames, folder))
        experiment.run()
        trained = time.perf_counter() - started
        started = time.perf_counter()
        scores = expected_scores(tree, policy_probabilities(experiment), format=MASKED)
        scored = time.perf_counter() - started
    return {"accuracy": scores["accuracy"], "tokens": scores["tokens"], "frames": experiment.total_frames,
            "train_seconds": round(trained, 1), "score_seconds": round(scored, 2)}


def save_run(out: str, algorithm: str, seed: int, run: dict, problem_ids: list[str], settings: dict) -> None:
    """The run's JSON, then its CSV (the CSV marks the run done), each written whole under a temporary name."""
    stem = os.path.join(out, f"{algorithm}-seed{seed}")
    meta = {"algorithm": algorithm, "seed": seed, **{k: run[k] for k in ("frames", "train_seconds", "score_seconds")},
            **settings, "test_accuracy": float(np.mean(run["accuracy"])), "versions": versions()}
    with open(stem + ".json.tmp", "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)
    os.replace(stem + ".json.tmp", stem + ".json")
    with open(stem + ".csv.tmp", "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["problem_id", "accuracy", "tokens"])
        writer.writerows((pid, f"{a:.6g}", f"{t:.6g}") for pid, a, t in zip(problem_ids, run["accuracy"], run["tokens"]))
    os.replace(stem + ".csv.tmp", stem + ".csv")


def versions() -> dict[str, str]:
    return library_versions(LIBRARIES)


def reference_rows(tree) -> dict[str, float]:
    """Exact test accuracy of fixed policies on the same tree: always PERSIST (the round-0 vote), always REFINE
    (debate) and uniformly random legal actions."""
    from deliberation_env.engine import expected_scores

    def constant(action: int):
        return lambda observations, nodes: np.eye(tree.num_actions)[np.full(observations["action_mask"].shape[:2],
                                                                           action)]

    def random_legal(observations, nodes):
        mask = observations["action_mask"].astype(np.float64)
        return mask / mask.sum(-1, keepdims=True)

    policies = {"always PERSIST": constant(Action.PERSIST), "always REFINE": constant(Action.REFINE),
                "random legal": random_legal}
    return {name: float(expected_scores(tree, policy)["accuracy"].mean()) for name, policy in policies.items()}


def read_runs(out: str) -> list[dict]:
    """Every finished run under ``out`` (a CSV and its JSON), its per-problem accuracy and tokens added."""
    runs = []
    for name in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        if not name.endswith(".csv"):
            continue
        with open(os.path.join(out, name[:-4] + ".json"), encoding="utf-8") as f:
            meta = json.load(f)
        with open(os.path.join(out, name), encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        meta["accuracy"] = np.array([float(r["accuracy"]) for r in rows])
        meta["tokens"] = np.array([float(r["tokens"]) for r in rows])
        runs.append(meta)
    return runs


def summary(runs: list[dict], references: dict[str, float] | None) -> str:
    """The Markdown summary of ``runs`` (one row per algorithm) and, when given, the fixed policies' rows."""
    if not runs:
        return "No finished runs yet.\n"
    first = runs[0]
    lines = [f"BenchMARL {first['versions'].get('benchmarl', '?')} on `{first['dataset']}` (observation `masked`, "
             f"features `{first['features']}`): each run trains on the {first['train_problems']} train problems for "
             f"{first['frames']:,} frames with BenchMARL's default experiment, algorithm and MLP configs (its own "
             "evaluation off), then its greedy policy is scored exactly on all "
             f"{first['test_problems']} test problems (`deliberation_env.engine.expected_scores`; one recorded "
             "stream, so each problem scores 0 or 1). Frames are env steps of the 3-agent team; an episode here is "
             "1 step.", "", "Commands: " + "; ".join(f"`{command}`" for command in sorted({r["command"] for r in runs})), "",
             "| algorithm | seeds | mean test accuracy | per seed | mean tokens / problem | train time per run (s) |",
             "|---|---|---|---|---|---|"]
    by_algorithm: dict[str, list[dict]] = {}
    for run in runs:
        by_algorithm.setdefault(run["algorithm"], []).append(run)
    for algorithm in [a for a in ALGORITHMS if a in by_algorithm] + sorted(set(by_algorithm) - set(ALGORITHMS)):
        group = sorted(by_algorithm[algorithm], key=lambda r: r["seed"])
        accuracy = [float(r["accuracy"].mean()) for r in group]
        per_seed = ", ".join(f"{r['seed']}: {a:.3f}" for r, a in zip(group, accuracy))
        times = [r["train_seconds"] for r in group]
        lines.append(f"| {algorithm.upper()} | {len(group)} | {np.mean(accuracy):.3f} | {per_seed} | "
                     f"{np.mean([r['tokens'].mean() for r in group]):,.0f} | {np.mean(times):.0f} "
                     f"({min(times):.0f}-{max(times):.0f}) |")
    if references:
        lines += ["", "Fixed policies, exact on the same test problems:", "", "| policy | test accuracy |", "|---|---|"]
        lines += [f"| {name} | {value:.3f} |" for name, value in references.items()]
    versions_line = ", ".join(f"{k} {v}" for k, v in first["versions"].items())
    lines += ["", f"Versions: {versions_line}. Times are wall-clock on a 2-core machine shared with other jobs "
              f"(torch on {first['threads']} thread(s)), so they are loose. Per-problem outcomes: `bench/results/peers_benchmarl/"
              "<algorithm>-seed<k>.csv`; what BenchMARL's API allows beyond this: docs/peers.md."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=ALGORITHMS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--frames", type=int, default=12_000, help="training frames per run (env steps)")
    parser.add_argument("--dataset", default="qwen05-arith-v2", help="a replay set's name or folder")
    parser.add_argument("--features", default="v2", help="the env's feature set (deliberation_env.core.features)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", default="bench/results/peers_benchmarl", help="folder of per-run files; <out>.md")
    parser.add_argument("--report-only", action="store_true", help="write <out>.md from the saved runs, train nothing")
    args = parser.parse_args(argv)
    if args.frames < 1:
        parser.error(f"--frames must be >= 1, got {args.frames}")

    from deliberation_env.engine import compile_tree

    tree = compile_tree(args.dataset, "test", features=args.features)
    if not args.report_only:
        import torch

        torch.set_num_threads(args.threads)
        from deliberation_env.replay import ReplaySet

        card = ReplaySet(args.dataset).card
        settings = {"dataset": args.dataset, "features": args.features, "threads": args.threads, "command": command_line(),
                    "train_problems": len(card.splits["train"]), "test_problems": len(tree.problem_ids)}
        os.makedirs(args.out, exist_ok=True)
        for seed in args.seeds:  # every algorithm's seed k before any seed k+1: a cut-short sweep stays balanced
            for algorithm in args.algorithms:
                if os.path.exists(os.path.join(args.out, f"{algorithm}-seed{seed}.csv")):
                    print(f"{algorithm} seed {seed}: done before, skipped")
                    continue
                run = train_and_score(algorithm, seed, args.frames, args.dataset, args.features, tree)
                save_run(args.out, algorithm, seed, run, tree.problem_ids, settings)
                print(f"{algorithm} seed {seed}: test accuracy {run['accuracy'].mean():.3f}, trained "
                      f"{run['train_seconds']:.0f} s, scored {run['score_seconds']:.2f} s", flush=True)
                write_summary(args.out, tree)
    write_summary(args.out, tree)


def write_summary(out: str, tree) -> None:
    text = summary(read_runs(out), reference_rows(tree))
    with open(out + ".md", "w", encoding="utf-8") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
