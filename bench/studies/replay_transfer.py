"""Transfer: does a meta-policy trained on a replay set score live what the replay predicts?

    python bench/studies/replay_transfer.py --dataset qwen05-arith-v2 --features v2 --problems 400:500 \
        --cache runs/transfer.sqlite --backend transformers \
        --model ~/.cache/deliberation-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
        --dtype bfloat16 --batch-size 16 --backend-option converted_cache_dir=~/.cache/deliberation-models/converted

(or ``--backend openai`` against the server the set was recorded through: bench/record/llama_server.sh.)

1. Trains SoftRankPO on the set's train split with the observation of --features, as bench/benchmark/replay_benchmark.py
   does (kept in <runs>/policy-<features>: a rerun loads it).
2. Plays it and the fixed protocols (--protocols) on the set's test split: the replay's prediction.
3. Plays the same policy and protocols live, through the backend flags, on test problems outside the recording
   (--problems START:END), with the recording's own settings (task, prompts, agents, rounds, confidence, tokens,
   sampling). Problems go in waves of --wave envs, so the backend batches their requests.

With --cache the live completions land in a SQLite file: an interrupted run loses nothing (rerun the same
command), and rows share the requests they have in common (every row's round 0 is the same requests).
Reports each row's accuracy replayed and live (Wilson 95%), the live difference to the best replayed protocol
with a paired bootstrap over problems, and tokens. Writes <out>/report.md and <out>/live.csv.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

from baselines.evaluation.evaluate import episode_seed, play_episodes
from baselines.meta.evaluate import PolicyActor
from baselines.meta.policy import load_policy
from baselines.meta.train import config_class, run
from bench.common.replay_rows import play_rows
from bench.common.results import RESULTS, command_line, flag_settings, wilson_interval
from deliberation_env.analysis.metrics import paired_bootstrap
from deliberation_env.cli import ArgumentParser, add_backend_arguments, add_env_arguments, backend_settings
from deliberation_env.env import DeliberationEnv
from deliberation_env.make import replay_env
from deliberation_env.protocols import make_protocol
from deliberation_env.replay import ReplaySet, env_settings


def problem_range(text: str) -> range:
    start, _, end = text.partition(":")
    if not (start.isdigit() and end.isdigit() and int(start) < int(end)):
        raise argparse.ArgumentTypeError(f"--problems takes START:END with START < END, got {text!r}")
    return range(int(start), int(end))


def trained_policy(dataset: ReplaySet, args):
    """SoftRankPO trained on the train split (bench/benchmark/replay_benchmark.py's settings), or the one a run saved."""
    out = os.path.join(args.runs, f"policy-{args.features}")
    path = os.path.join(out, "policy.pt")
    if not os.path.exists(path):
        cfg = config_class("softrankpo")(episodes=args.episodes, seed=args.seed, out=out, progress=False,
                                          tensorboard=False, num_agents=dataset.card.settings["num_agents"],
                                          max_rounds=dataset.card.rounds)
        run("softrankpo", cfg, lambda: replay_env(dataset, split="train", features=args.features))
        with open(os.path.join(out, "trained_on.json"), "w", encoding="utf-8") as f:
            json.dump({"train_problems": len(dataset.card.splits["train"]), "episodes": args.episodes,
                       "seed": args.seed, "features": args.features}, f)
    with open(os.path.join(out, "trained_on.json"), encoding="utf-8") as f:  # the set may have grown since
        return load_policy(path), json.load(f)


def actor_for(name: str, policy):
    return PolicyActor(policy) if name == "softrankpo" else make_protocol(name)


def play_live(dataset: ReplaySet, backend, name: str, policy, problems: range, wave: int,
              features: str) -> dict[str, np.ndarray]:
    """Per live problem: correct (0/1) and tokens."""
    envs = [DeliberationEnv(backend=backend, split="test", features=features, **env_settings(dataset.card))
            for _ in range(wave)]
    episodes = [(episode_seed(0, i), i) for i in problems]
    records = play_episodes(envs, [actor_for(name, policy) for _ in envs], episodes, progress=f"live {name}")
    return {"correct": np.array([float(r["correct"]) for r in records]),
            "tokens": np.array([r["tokens"] for r in records], float)}


def wilson_text(correct: np.ndarray) -> str:
    low, high = wilson_interval(int(correct.sum()), len(correct))
    return f"{correct.mean():.3f} [{low:.3f}, {high:.3f}]"


def main(argv=None) -> None:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="qwen05-arith-v2")
    add_env_arguments(parser, ("features",))  # the one SoftRankPO learns from
    parser.add_argument("--problems", type=problem_range, default=problem_range("400:500"),
                        help="live test problems START:END (problem_index), outside the recording")
    parser.add_argument("--protocols", nargs="*", default=["self_consistency", "debate"],
                        help="fixed protocols played beside the policy, replayed and live")
    parser.add_argument("--episodes", type=int, default=4000, help="SoftRankPO training episodes on the replay")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--wave", type=int, default=16, help="live envs played together (one backend batch)")
    parser.add_argument("--out", default=os.path.join(RESULTS, "replay_transfer"), help="report and CSV")
    parser.add_argument("--runs", default=os.path.join("runs", "replay-transfer"), help="the trained policy")
    add_backend_arguments(parser, backend_default="transformers")
    args = parser.parse_args(argv)
    args.features = flag_settings(parser, args, ("features",)).features
    dataset = ReplaySet(args.dataset)
    recorded = {int(p.rsplit("-", 1)[1]) for p in dataset.card.splits["test"]}
    if recorded & set(args.problems):
        parser.error(f"--problems {args.problems.start}:{args.problems.stop} overlaps the recorded test problems "
                     f"(0..{max(recorded)}): choose problems outside the recording")
    available = len(DeliberationEnv(backend="sim", split="test", **env_settings(dataset.card)).problems)
    if args.problems.stop > available:
        parser.error(f"--problems {args.problems.start}:{args.problems.stop}: the task's test split has {available} "
                     f"problems (0..{available - 1})")
    backend = backend_settings(args).build()
    started = time.perf_counter()
    policy, trained_on = trained_policy(dataset, args)
    names = ["softrankpo", *args.protocols]
    options = {"features": args.features}
    replayed = {name: play_rows(dataset, lambda s, n=name: actor_for(n, policy), [0], options) for name in names}
    live = {name: play_live(dataset, backend, name, policy, args.problems, args.wave, args.features) for name in names}
    report(args, dataset, trained_on, names, replayed, live, backend.identity(), time.perf_counter() - started)
    close = getattr(backend, "close", None)
    if callable(close):
        close()


def report(args, dataset, trained_on: dict, names, replayed, live, live_model: str, seconds: float) -> None:
    best = max(args.protocols, key=lambda n: replayed[n]["correct"].mean()) if args.protocols else None
    lines = [f"# Replay to live transfer: {dataset.card.name}", "", f"`{command_line()}`", "",
             f"SoftRankPO trained on the replay set's train split ({trained_on['train_problems']} problems, "
             f"{trained_on['episodes']} episodes, seed {trained_on['seed']}, features {trained_on.get('features', 'v1')}); replayed on its {len(dataset.card.splits['test'])} "
             f"recorded test problems, live on test problems {args.problems.start}-{args.problems.stop - 1} "
             f"({len(args.problems)}, outside the recording). Recorded with {dataset.card.model}; live on {live_model}. Accuracy with Wilson 95% "
             f"intervals; the live difference to {best} (the best protocol on the replay) is paired over the live "
             f"problems (bootstrap 95%). {seconds / 60:.0f} min.", "",
             "| policy | replay accuracy | live accuracy | live - replay | live vs " + f"{best} [95% CI] | "
             "replay tokens | live tokens |", "|---|---|---|---|---|---|---|"]
    for name in names:
        gap = live[name]["correct"].mean() - replayed[name]["correct"].mean()
        if best is None or name == best:
            versus = "-"
        else:
            diff, low, high = paired_bootstrap(live[name]["correct"], live[best]["correct"])
            versus = f"{diff:+.3f} [{low:+.3f}, {high:+.3f}]"
        lines.append(f"| {name} | {wilson_text(replayed[name]['correct'])} | {wilson_text(live[name]['correct'])} | "
                     f"{gap:+.3f} | {versus} | {replayed[name]['tokens'].mean():.0f} | {live[name]['tokens'].mean():.0f} |")
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "report.md"), "w", encoding="utf-8") as f:
        f.write(text)
    with open(os.path.join(args.out, "live.csv"), "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["policy", "problem_index", "correct", "tokens"])
        for name in names:
            for index, correct, tokens in zip(args.problems, live[name]["correct"], live[name]["tokens"]):
                writer.writerow([name, index, int(correct), int(tokens)])


if __name__ == "__main__":
    main()
