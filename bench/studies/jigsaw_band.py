"""Does the jigsaw task need cooperation? A team split across views against the same team seeing every count.

Plays one round of ``task="jigsaw"`` (``deliberation_env.tasks.jigsaw``) with every agent REFINEing (debate),
once with each agent seeing one person's count (``roles=JIGSAW_TEAM``) and once with every count shown to all
(``prompt="full"``), on the same problems and seeds, with ``confidence="answer_logprobs"`` (no critic call).
Reports per arm: each turn's accuracy per agent, the team's answer after the refine turn (the env's consensus),
how often an agent's first solution states its own count (the number its peers need), and, in the split arm,
the refine turn's accuracy where the peer's first solution stated its count and where it did not.

    python bench/studies/jigsaw_band.py --backend openai --base-url http://127.0.0.1:8091/v1 --model qwen \\
        --backend-option deadline=7200 --problems 24 --levels 0 1

(On a server that shares its cores with other jobs one answer can take longer than the backend's default deadline of
600 s, so raise it.)

Measure before training on the task: a split team far below the full team, and a refine turn that lifts it where
the peer wrote its count, say that the task needs cooperation and that the model can cooperate a little.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

import deliberation_env
from bench.common.results import RESULTS, add_band_arguments, parse_band_arguments, save_markdown, wilson_interval
from deliberation_env.cli import ArgumentParser, backend_settings
from deliberation_env.core.actions import Action
from deliberation_env.tasks.base import short_rationale
from deliberation_env.tasks.jigsaw import JIGSAW_TEAM
from deliberation_env.vector import Start, Step, run_episodes

ARMS = {"split": list(JIGSAW_TEAM), "full": None}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS), help="which arms to play")
    add_band_arguments(parser, "jigsaw_band")
    return parse_band_arguments(parser, argv)


def states_count(text: str, count: int) -> bool:
    """Whether ``text`` holds the number ``count`` (as a whole number)."""
    return re.search(rf"(?<![\d.]){count}(?![\d])", text) is not None


def play(args: argparse.Namespace, backend, arm: str) -> list[dict]:
    """One row per problem: each agent's first and refined answer, and what its first solution stated."""
    options = dict(task="jigsaw", task_kwargs={"levels": args.levels}, backend=backend, split=args.split,
                   num_agents=2, roles=ARMS[arm], max_rounds=1, confidence="answer_logprobs",
                   max_tokens=args.max_tokens, temperature=args.temperature)
    positions = list(range(args.start, args.start + args.problems))
    envs = [deliberation_env.parallel_env(**options) for _ in positions]
    seen = envs[0].task.rationale_chars  # a peer's refine prompt shows the end of a solution, this long
    first: dict[int, list[tuple]] = {}
    rows = []

    def on_step(step: Step) -> None:
        core = step.env.deliberation
        if step.actions is None:  # the first turn's answers, before the refine turn
            first[step.episode] = [(a.answer, bool(a.correct), short_rationale(a.text, seen)) for a in core.agents]
            return
        before, counts = first[step.episode], core.problem.metadata["counts"]
        rows.append({"id": core.problem.id, "level": core.problem.metadata["level"], "arm": arm,
                     "first_correct": [c for _, c, _ in before],
                     "refined_correct": [bool(a.correct) for a in core.agents],
                     "team_correct": bool(core.grade(core.consensus())),
                     "shows_own_count": [states_count(text, counts[k]) for k, (_, _, text) in enumerate(before)]})

    run_episodes(envs, [Start(args.seed * 100_003 + p, {"problem_index": p}) for p in positions],
                 lambda steps: [{agent: int(Action.REFINE) for agent in step.env.agents} for step in steps], on_step,
                 backend)
    return rows


def rate(values: Sequence[bool]) -> str:
    if not values:
        return "- (n=0)"
    low, high = wilson_interval(int(sum(values)), len(values))
    return f"{np.mean(values):.3f} [{low:.2f}, {high:.2f}] (n={len(values)})"


def report(rows: list[dict], seconds: dict[str, float]) -> str:
    lines = ["| arm | first turn, per agent | refine turn, per agent | team after refine | the end of the first "
             "solution (what peers see) shows its own count |", "|---|---|---|---|---|"]
    for arm in dict.fromkeys(r["arm"] for r in rows):
        mine = [r for r in rows if r["arm"] == arm]
        lines.append(f"| {arm} | {rate([c for r in mine for c in r['first_correct']])} | "
                     f"{rate([c for r in mine for c in r['refined_correct']])} | {rate([r['team_correct'] for r in mine])} | "
                     f"{rate([s for r in mine for s in r['shows_own_count']])} |")
    split = [r for r in rows if r["arm"] == "split"]
    told = [r["refined_correct"][k] for r in split for k in range(2) if r["shows_own_count"][1 - k]]
    untold = [r["refined_correct"][k] for r in split for k in range(2) if not r["shows_own_count"][1 - k]]
    lines += ["", "Split arm, the refine turn's accuracy by whether the part of the peer's first solution that the "
              "refine prompt shows held the peer's count (the number this agent lacks):", "",
              "| the peer showed its count | refine turn accuracy |", "|---|---|",
              f"| yes | {rate(told)} |", f"| no | {rate(untold)} |"]
    took = ", ".join(f"{arm} {s / 60:.1f} min" for arm, s in seconds.items() if np.isfinite(s))
    return "\n".join(lines) + f"\n\n{len(split)} problems per arm" + (f"; generation: {took}." if took else ".")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    header = (f"Jigsaw arithmetic (2 parts, levels {args.levels}), {args.split} problems {args.start}-"
              f"{args.start + args.problems - 1}, 2 agents, one round of debate (both REFINE), temperature "
              f"{args.temperature}, max_tokens {args.max_tokens}, model {args.model or '(as in the run)'} "
              f"({args.backend}); Wilson 95% "
              f"intervals; per-problem rows in {args.out}.jsonl")
    path = os.path.join(RESULTS, f"{args.out}.jsonl")
    seconds: dict[str, float] = {}
    if args.report_only:
        with open(path, encoding="utf-8") as stream:
            rows = [json.loads(line) for line in stream]
    else:
        backend = backend_settings(args).build()
        rows = []
        for arm in args.arms:
            began = time.perf_counter()
            rows += play(args, backend, arm)
            seconds[arm] = time.perf_counter() - began
            with open(path, "w", encoding="utf-8") as stream:  # after each arm: a failed second arm keeps the first
                stream.writelines(json.dumps(row) + "\n" for row in rows)
    save_markdown(args.out, header, report(rows, seconds))


if __name__ == "__main__":
    main()
