"""Pick a team by measurement: each candidate role's round-0 accuracy, and how their errors go together.

Plays round 0 of one env whose agents are the candidate roles (``--roles``, docs/reference.md "Roles"): every
agent solves each problem once with its own seed (a program-aided role's program runs in the sandbox), with
``confidence="answer_logprobs"`` so that no critic call is made. Two agents of the same role measure how a
homogeneous team's errors go together. Reports, over the problems:

- each agent's accuracy (Wilson 95%), by level, and its completion tokens;
- the correlation of every pair of agents' errors (phi of the wrong/right indicators, bootstrap 95% over problems);
- every 3-agent team among them: its plurality vote (the env's consensus rule), a rule on observable signals where
  it holds a tool agent (the tool's answer where its program printed one, else the vote), any member right, and
  the spread of its members' accuracies.

    python bench/studies/team_band.py --model ~/.cache/deliberation-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \\
        --dtype bfloat16 --roles '["default", "default", {"name": "no_code", "prompt": "no_code"},
                  {"name": "program", "prompt": "program", "tool": "python"}]'

Measure on problems that the team set will not record (default: train problems 1900-1939).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

import deliberation_env
from bench.common.results import RESULTS, add_band_arguments, parse_band_arguments, save_markdown, wilson_interval
from deliberation_env.analysis.metrics import bootstrap_interval
from deliberation_env.cli import ArgumentParser, add_env_arguments, backend_settings
from deliberation_env.core.consensus import plurality
from deliberation_env.vector import BatchedEnvs


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    add_env_arguments(parser, ("roles",))
    add_band_arguments(parser, "team_band")
    args = parse_band_arguments(parser, argv)
    if args.roles is None:
        parser.error("--roles is required: a JSON (or Python) list of roles, one per agent")
    return args


def play_round_zero(args: argparse.Namespace) -> tuple[list[dict], float]:
    """One row per problem: each agent's answer, correctness, confidence and completion tokens."""
    backend = backend_settings(args).build()  # the request grouper sends the runs to the sandbox
    options = dict(task="arithmetic", task_kwargs={"levels": args.levels}, backend=backend, split=args.split,
                   num_agents=len(args.roles), roles=args.roles, max_rounds=1, confidence="answer_logprobs",
                   max_tokens=args.max_tokens, temperature=args.temperature)
    positions = list(range(args.start, args.start + args.problems))
    envs = [deliberation_env.parallel_env(**options) for _ in positions]
    began = time.perf_counter()
    results = BatchedEnvs(envs, backend=backend).reset(seeds=[args.seed * 100_003 + p for p in positions],
                                                      options=[{"problem_index": p} for p in positions])
    seconds = time.perf_counter() - began
    rows = []
    for env, (_, infos) in zip(envs, results):
        core = env.deliberation
        rows.append({"id": core.problem.id, "level": core.problem.metadata.get("level"),
                     "answers": [a.answer for a in core.agents], "correct": [bool(a.correct) for a in core.agents],
                     "confidence": [float(a.confidence) for a in core.agents],
                     "tokens": [int(info["tokens"]) for info in infos.values()],
                     "tool_ran": [bool(a.tool_ran) for a in core.agents]})
    return rows, seconds


def phi(a: np.ndarray, b: np.ndarray) -> float:
    """The correlation of two 0/1 vectors (NaN when one is constant)."""
    if a.std() == 0 or b.std() == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def phi_interval(a: np.ndarray, b: np.ndarray, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    draws = [phi(a[idx], b[idx]) for idx in rng.integers(0, len(a), size=(resamples, len(a)))]
    draws = np.array([d for d in draws if np.isfinite(d)])
    return (float(np.quantile(draws, 0.025)), float(np.quantile(draws, 0.975))) if len(draws) else (np.nan, np.nan)


def report(rows: list[dict], args: argparse.Namespace, seconds: float) -> str:
    names = [role if isinstance(role, str) else role["name"] for role in args.roles]
    labels = [f"{k}:{name}" for k, name in enumerate(names)]
    correct = np.array([row["correct"] for row in rows], dtype=float)
    n = len(rows)
    lines = ["| agent | role | accuracy | 95% CI | " + " | ".join(f"level {lv}" for lv in args.levels)
             + " | completion tokens | program ran |", "|---" * (6 + len(args.levels)) + "|"]
    for k in range(len(labels)):
        low, high = wilson_interval(int(correct[:, k].sum()), n)
        by_level = [correct[[r["level"] == lv for r in rows], k] for lv in args.levels]
        lines.append(f"| {k} | {json.dumps(args.roles[k])} | {correct[:, k].mean():.3f} | [{low:.3f}, {high:.3f}] | "
                     + " | ".join(f"{v.mean():.3f} (n={len(v)})" for v in by_level)
                     + f" | {np.mean([r['tokens'][k] for r in rows]):.0f} | "
                     + f"{np.mean([r['tool_ran'][k] for r in rows]):.2f} |")
    lines += ["", "Error correlation (phi of the wrong indicators; bootstrap 95% over problems):", "",
              "| pair | phi | 95% CI | both wrong | one wrong |", "|---|---|---|---|---|"]
    wrong = 1 - correct
    for i, j in itertools.combinations(range(len(labels)), 2):
        low, high = phi_interval(wrong[:, i], wrong[:, j])
        lines.append(f"| {labels[i]} x {labels[j]} | {phi(wrong[:, i], wrong[:, j]):.2f} | [{low:.2f}, {high:.2f}] | "
                     f"{np.mean(wrong[:, i] * wrong[:, j]):.2f} | {np.mean(np.abs(wrong[:, i] - wrong[:, j])):.2f} |")
    lines += ["", "Every 3-agent team: its vote (the env's plurality rule over the three answers); with a tool agent, "
              "a rule on observable signals (the tool's answer where its program printed one, else the vote); any "
              "member right (the round-0 oracle):", "",
              "| team | vote | 95% CI | tool rule | any right | best member | accuracy spread |",
              "|---|---|---|---|---|---|---|"]
    tools = [k for k, role in enumerate(args.roles) if isinstance(role, dict) and role.get("tool")]
    for team in itertools.combinations(range(len(labels)), 3):
        vote = np.array([_vote_correct(row, team) for row in rows], dtype=float)
        low, high = bootstrap_interval(vote)
        accuracies = correct[:, list(team)].mean(0)
        tool = next((k for k in team if k in tools), None)
        rule = "" if tool is None else f"{np.mean([r['correct'][tool] if r['tool_ran'][tool] else v for r, v in zip(rows, vote)]):.3f}"
        lines.append(f"| {' + '.join(labels[k] for k in team)} | {vote.mean():.3f} | [{low:.3f}, {high:.3f}] | "
                     f"{rule} | {correct[:, list(team)].max(1).mean():.3f} | {accuracies.max():.3f} | "
                     f"{accuracies.max() - accuracies.min():.3f} |")
    took = "" if np.isnan(seconds) else f", {seconds / 60:.1f} minutes of generation"
    return "\n".join(lines) + f"\n\n{n} problems{took}."


def _vote_correct(row: dict, team: tuple[int, ...]) -> bool:
    answers = [row["answers"][k] for k in team]
    chosen = plurality(answers, [row["confidence"][k] for k in team])
    return chosen is not None and any(row["answers"][k] == chosen and row["correct"][k] for k in team)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    header = (f"Round-0 accuracy of candidate roles on arithmetic levels {args.levels}, {args.split} problems "
              f"{args.start}-{args.start + args.problems - 1}, temperature {args.temperature}, max_tokens "
              f"{args.max_tokens}, backend {args.backend}{', ' + args.dtype if args.dtype else ''}; per-problem rows in {args.out}.jsonl")
    if args.report_only:
        with open(os.path.join(RESULTS, f"{args.out}.jsonl"), encoding="utf-8") as stream:
            rows = [json.loads(line) for line in stream]
        save_markdown(args.out, header + " (reported again from those rows)", report(rows, args, float("nan")))
        return
    rows, seconds = play_round_zero(args)
    with open(os.path.join(RESULTS, f"{args.out}.jsonl"), "w", encoding="utf-8") as stream:
        stream.writelines(json.dumps(row) + "\n" for row in rows)
    save_markdown(args.out, header, report(rows, args, seconds))


if __name__ == "__main__":
    main()
