"""The deliberation study on a real LLM: fixed protocols, policies learned on the default and on a
calibrated simulator, SFT, and a token-cost variant, all evaluated on the real model.

    python bench/studies/real_llm.py --start-server ~/.cache/deliberation-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \\
        --levels 0 --prompt no_code --calib-problems 30 --test-problems 40
    python bench/studies/real_llm.py --base-url http://gpu1:8000/v1 --model Qwen/Qwen2.5-7B-Instruct --task gsm8k ...

Steps (every LLM call goes through one SQLite cache, so a re-run replays what is done and
protocols that differ only after round 0 share their round-0 solutions):

1. calibration traces: ``debate`` and ``random`` on the first ``--calib-problems`` problems of the
   train split, recorded with ``trace=``;
2. the six fixed protocols on the first ``--test-problems`` of the test split, traced: ``debate``
   first and timed alone, then the other five with the cache it filled (the ratio of the two
   times is the cost of evaluating all six);
3. ``python -m deliberation_env.analysis.calibrate`` fits a ``SimConfig`` to the calibration traces;
4. SoftRankPO (SFT then RL) on the default sim and on the calibrated sim, and on the calibrated sim
   with a token cost; the SFT stage of the calibrated run is the SFT row;
5. every learned policy plays the test problems on the real model;
6. the fidelity report: the calibrated sim replays the held-out problems (``--compare``).

Results go to ``bench/results/real_llm.{md,csv,png}`` and ``bench/results/real_llm/`` (traces,
sim.json, fidelity report). The study needs a model that solves some of the task: pick levels and
prompt with ``bench/studies/llm_band.py`` (single-agent accuracy between 20% and 80%).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

import deliberation_env
from baselines.evaluation.evaluate import ACTION_NAMES, episode_seed, headless_pyplot, play_episodes
from baselines.meta.evaluate import PolicyActor
from bench.common.results import RESULTS, command_line, save_markdown, wilson_interval
from deliberation_env.analysis.traces import TraceWriter
from deliberation_env.backends.cache import cache_key
from deliberation_env.cli import OLD_TEAM_FLAGS, ArgumentParser, add_env_arguments, env_arguments
from deliberation_env.protocols import PROTOCOLS, make_protocol, protocol_agents
from deliberation_env.testing.llama_server import llama_server

ACTIONS = ACTION_NAMES


SETTINGS = ("num_agents", "max_rounds", "max_tokens", "critic_max_tokens", "confidence")
"""The env settings of the study (real and simulated envs alike), their flags from the declaration."""
OWN_DEFAULTS = {"max_rounds": 2, "max_tokens": 256, "critic_max_tokens": 24, "confidence": "critic_text"}
"""The study's own: two rounds, budgets a 0.5B model on 2 cores finishes, a critic read from text (llama.cpp's
server gives no log-probabilities unless started with them)."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--start-server", metavar="GGUF", help="start a llama.cpp server on this GGUF for the run")
    where.add_argument("--base-url", nargs="+", help="an OpenAI-compatible server (vLLM, llama.cpp, ...), ending in /v1")
    parser.add_argument("--model", default="local", help="the served model name (with --base-url)")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads (with --start-server)")
    parser.add_argument("--task", default="arithmetic")
    parser.add_argument("--levels", type=int, nargs="+", default=[0], help="arithmetic levels")
    parser.add_argument("--prompt", default="no_code", help="arithmetic prompt style (default, no_code)")
    add_env_arguments(parser, SETTINGS, defaults=OWN_DEFAULTS, aliases=OLD_TEAM_FLAGS)
    parser.add_argument("--calib-problems", type=int, default=30)
    parser.add_argument("--test-problems", type=int, default=40)
    parser.add_argument("--rl-episodes", type=int, default=12000)
    parser.add_argument("--sft-episodes", type=int, default=1500)
    parser.add_argument("--token-cost", type=float, default=2e-4, help="per-token reward weight of the cost variant")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=16, help="episodes played together (one backend call per phase)")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="requests in flight per call (default: 1 with --start-server, whose llama.cpp server "
                             "answers one at a time, so a queued request's deadline does not run out; else --batch)")
    parser.add_argument("--out", default=os.path.join(RESULTS, "real_llm"))
    args = parser.parse_args(argv)
    for name in ("agents", "rounds", "max_tokens", "calib_problems", "test_problems", "batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def task_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {"levels": tuple(args.levels), "prompt": args.prompt} if args.task == "arithmetic" else {}


def env_options(args: argparse.Namespace) -> dict[str, Any]:
    """The settings every env of the study shares, real or simulated."""
    return {"task": args.task, "task_kwargs": task_kwargs(args), **env_arguments(args, SETTINGS)}


class KeyRecorder:
    """A backend that passes requests on and records their cache keys: the distinct keys of a set of
    entries are the LLM requests those entries cost together on an empty cache, resumed run or not."""

    def __init__(self, inner):
        self.inner = inner
        self.keys: set[str] = set()
        self._identity = inner.identity()

    def generate(self, requests):
        self.keys.update(cache_key(self._identity, r) for r in requests)
        return self.inner.generate(requests)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def play(name: str, actor_fn, args, backend, split: str, problems: int, trace: TraceWriter | None,
         agents: int | None = None) -> dict[str, Any]:
    """One entry on the real model: accuracy with a 95% Wilson interval over problems, tokens, action shares."""
    options = {**env_options(args), "num_agents": agents or args.num_agents}
    recorder = KeyRecorder(backend)
    envs = [deliberation_env.parallel_env(backend=recorder, split=split, trace=trace, trace_label=name, **options)
            for _ in range(min(args.batch, problems))]
    episodes = [(episode_seed(args.seed, index), index) for index in range(problems)]
    start = time.perf_counter()
    records = play_episodes(envs, [actor_fn() for _ in envs], episodes)
    seconds = time.perf_counter() - start
    correct = sum(bool(r["correct"]) for r in records)
    low, high = wilson_interval(correct, problems)
    actions: Counter = Counter()
    for record in records:
        actions.update(record["actions"])
    total = sum(actions.values()) or 1
    return {"name": name, "accuracy": correct / problems, "ci_low": low, "ci_high": high, "problems": problems,
            "tokens": float(np.mean([r["tokens"] for r in records])), "seconds": seconds,
            "keys": recorder.keys,
            **{f"p_{a}": actions[i] / total for i, a in enumerate(ACTIONS)}}


def train_policy(args, out: str, sim_config: str | None, token_cost: float) -> tuple[str, str]:
    """SoftRankPO (SFT stage, then RL) on a sim of the study's env; returns (policy.pt, sft/policy.pt)."""
    from baselines.meta.softrankpo import SoftRankPOConfig
    from baselines.meta.train import run

    backend_kwargs = {"config": sim_config} if sim_config else {}
    options = env_options(args)
    if token_cost:
        options["reward_weights"] = {"tokens": token_cost}

    def env_fn():
        return deliberation_env.parallel_env(backend="sim", backend_kwargs=backend_kwargs, split="train", **options)

    cfg = replace(SoftRankPOConfig(), episodes=args.rl_episodes, sft_episodes=args.sft_episodes, seed=args.seed,
                  out=out, num_agents=args.num_agents, max_rounds=args.max_rounds, token_cost=token_cost, progress=False)
    run("softrankpo", cfg, env_fn)
    return os.path.join(out, "policy.pt"), os.path.join(out, "sft", "policy.pt")


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| policy | accuracy (95% CI) | tokens / problem | PERSIST | REFINE | CONCEDE | seconds |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['accuracy']:.3f} ({r['ci_low']:.2f}-{r['ci_high']:.2f}) | {r['tokens']:.0f} | "
                     f"{r['p_persist']:.2f} | {r['p_refine']:.2f} | {r['p_concede']:.2f} | {r['seconds']:.0f} |")
    return "\n".join(lines)


def plot(rows: Sequence[dict[str, Any]], path: str) -> None:
    plt = headless_pyplot()
    fig, ax = plt.subplots(figsize=(7, 5.5))
    for r in rows:
        learned = r["name"] not in PROTOCOLS
        ax.errorbar(r["tokens"], r["accuracy"], yerr=[[r["accuracy"] - r["ci_low"]], [r["ci_high"] - r["accuracy"]]],
                    fmt="s" if learned else "o", capsize=3, label=r["name"])
    ax.set_xlabel("tokens per problem")
    ax.set_ylabel("accuracy of the final consensus")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7, loc="upper center", ncol=3, bbox_to_anchor=(0.5, -0.14))  # below the axes: covers no point
    ax.grid(alpha=0.3)
    ax.set_title("real model: protocols and learned policies (95% Wilson intervals)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    from deliberation_env.backends.cache import CachedBackend
    from deliberation_env.backends.openai import OpenAICompatibleBackend

    # llama.cpp computes logits for every prompt token only when log-probabilities are needed (much slower)
    logits_all = args.confidence != "critic_text"
    server = (llama_server(args.start_server, args.threads, logits_all=logits_all) if args.start_server
              else contextlib.nullcontext(args.base_url))
    started = time.perf_counter()
    with server as urls:
        concurrency = args.concurrency or (1 if args.start_server else args.batch)
        inner = OpenAICompatibleBackend(urls, model=args.model, concurrency=concurrency,
                                        logprobs=args.confidence == "critic")
        backend = CachedBackend(inner, os.path.join(args.out, "cache.sqlite"))
        calib_path, heldout_path = os.path.join(args.out, "calib.jsonl"), os.path.join(args.out, "heldout.jsonl")
        for path in (calib_path, heldout_path):
            if os.path.exists(path):
                os.remove(path)  # traces are rewritten from the cache on a re-run
        print("1/6 calibration traces (train split)", flush=True)
        with TraceWriter(calib_path) as trace:
            for name in ("debate", "random"):
                row = play(name, lambda n=name: make_protocol(n), args, backend, "train", args.calib_problems, trace)
                print(f"  {name}: {row['accuracy']:.3f}, {row['seconds']:.0f} s", flush=True)

        print("2/6 fixed protocols (test split)", flush=True)
        rows = []
        with TraceWriter(heldout_path) as trace:
            for name in ["debate", *[p for p in PROTOCOLS if p != "debate"]]:
                row = play(name, lambda n=name: make_protocol(n), args, backend, "test", args.test_problems, trace,
                           agents=protocol_agents(name))
                rows.append(row)
                print(f"  {name}: {row['accuracy']:.3f}, {row['tokens']:.0f} tokens, {row['seconds']:.0f} s", flush=True)
        debate_seconds = rows[0]["seconds"]
        others_seconds = sum(r["seconds"] for r in rows[1:])
        # What the six cost together against debate alone, in distinct LLM requests (what each would
        # generate on an empty cache): the shared cache makes the union far smaller than the sum.
        debate_requests = len(rows[0]["keys"])
        six_requests = len(set().union(*(r["keys"] for r in rows[:6])))

        print("3/6 calibrating the sim", flush=True)
        from deliberation_env.analysis import calibrate

        sim_path = os.path.join(args.out, "sim.json")
        if calibrate.main([calib_path, "-o", sim_path]) != 0:
            raise SystemExit("calibration failed (see above): record more calibration episodes (--calib-problems)")

        print("4/6 training on the default and the calibrated sim", flush=True)
        runs = os.path.join(args.out, "runs")
        default_policy, _ = train_policy(args, os.path.join(runs, "default-sim"), None, 0.0)
        calibrated_policy, sft_policy = train_policy(args, os.path.join(runs, "calibrated-sim"), sim_path, 0.0)
        cost_policy, _ = train_policy(args, os.path.join(runs, "calibrated-sim-cost"), sim_path, args.token_cost)

        print("5/6 learned policies on the real model", flush=True)
        from baselines.meta.policy import load_policy

        learned = {"sft (calibrated sim)": sft_policy, "softrankpo (default sim)": default_policy,
                   "softrankpo (calibrated sim)": calibrated_policy,
                   f"softrankpo (calibrated sim, token cost {args.token_cost:g})": cost_policy}
        with TraceWriter(os.path.join(args.out, "learned.jsonl")) as trace:
            for name, path in learned.items():
                policy = load_policy(path)
                row = play(name, lambda p=policy: PolicyActor(p), args, backend, "test", args.test_problems, trace)
                rows.append(row)
                print(f"  {name}: {row['accuracy']:.3f}, {row['tokens']:.0f} tokens", flush=True)
        stats = backend.stats
        backend.close()

    print("6/6 fidelity of the calibrated sim on the held-out problems", flush=True)
    if calibrate.main(["--compare", heldout_path, sim_path, "-o", os.path.join(args.out, "fidelity")]) != 0:
        raise SystemExit("the fidelity report failed (see above)")
    summary(args, rows, (debate_seconds, others_seconds, debate_requests, six_requests), stats,
            time.perf_counter() - started)


def summary(args, rows, costs: tuple[float, float, int, int], stats, total_seconds: float) -> None:
    debate_seconds, others_seconds, debate_requests, six_requests = costs
    rows = [{k: v for k, v in row.items() if k != "keys"} for row in rows]
    table = markdown(rows)
    protocols = [r for r in rows if r["name"] in PROTOCOLS and r["name"] != "oracle"]
    best = max(protocols, key=lambda r: r["accuracy"])
    debate = next(r for r in rows if r["name"] == "debate")
    calibrated = next(r for r in rows if r["name"] == "softrankpo (calibrated sim)")
    notes = [
        f"- best fixed protocol (oracle excluded): {best['name']} {best['accuracy']:.3f}; SoftRankPO on the calibrated sim "
        f"{calibrated['accuracy']:.3f} with {calibrated['tokens'] / debate['tokens']:.2f}x debate's tokens "
        f"(target: >= the best protocol with <= 0.5x): "
        f"{'met' if calibrated['accuracy'] >= best['accuracy'] and calibrated['tokens'] <= 0.5 * debate['tokens'] else 'not met'}",
        f"- the six protocols need {six_requests} LLM requests with the shared cache, debate alone {debate_requests}: "
        f"{six_requests / max(1, debate_requests):.2f}x (target <= 1.5x); wall time in this run "
        f"{debate_seconds + others_seconds:.0f} s vs {debate_seconds:.0f} s for debate (a resumed run replays "
        "from the cache, so only the request count is comparable across runs)",
        f"- cache: {stats.hits} hits, {stats.misses} misses; whole study {total_seconds / 60:.1f} min",
    ]
    header = (f"Real model, {args.task} levels {args.levels} prompt {args.prompt}, {args.num_agents} agents x {args.max_rounds} "
              f"rounds, confidence {args.confidence}, {args.test_problems} test problems (seed {args.seed})")
    save_markdown("real_llm", header, table + "\n\n" + "\n".join(notes))
    with open(os.path.join(RESULTS, "real_llm.csv"), "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump({"command": command_line(), "rows": rows, "debate_seconds": debate_seconds,
                   "others_seconds": others_seconds, "debate_requests": debate_requests, "six_requests": six_requests,
                   "cache_hits": stats.hits, "cache_misses": stats.misses}, f, indent=1)
    plot(rows, os.path.join(RESULTS, "real_llm.png"))


if __name__ == "__main__":
    main()
