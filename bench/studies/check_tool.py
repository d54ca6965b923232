"""What the checking tool (``tool="python_check"``) would say of a recorded set's round-0 solutions.

    python bench/studies/check_tool.py --dataset qwen05-arith-v2                  # both splits
    python bench/studies/check_tool.py --dataset qwen05-team-arith --splits test

For every agent's round-0 solution (stream 0) that holds a code block, its last block runs in the sandbox as
``core.tools.PythonTool`` runs it, the task's extractor reads the printed answer, and the report compares it
with the text's answer: how many solutions hold code, how often the program printed an answer and agreed, the
text answer's accuracy when the program agrees, disagrees or printed nothing, the program's own accuracy where it
disagrees, and the AUROC of agreement for "the text's answer is right" among the solutions whose program printed
an answer (bootstrap over problems). It measures the external verifier on recorded text before a set records it.
Writes results/check_tool_<set>.md.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

from bench.common.results import save_markdown
from deliberation_env.analysis.metrics import clustered_auroc, wilson_interval
from deliberation_env.cli import ArgumentParser
from deliberation_env.core.tools import OUTPUT_CHARS, program_of
from deliberation_env.make import replay_env
from deliberation_env.replay import ReplayError, ReplaySet
from deliberation_env.sandbox.runner import run_many
from deliberation_env.tasks.base import Task


def solutions(dataset: ReplaySet, split: str) -> tuple[Task, list[dict]]:
    """The set's task, and every agent's round-0 solution of ``split`` (stream 0): its problem, answer,
    correctness and program."""
    env = replay_env(dataset, split=split)
    found = []
    for index, problem in enumerate(env.problems):
        env.reset(seed=0, options={"problem_index": index})
        for agent in env.deliberation.agents:
            found.append({"problem": problem, "answer": agent.answer, "correct": bool(agent.correct),
                          "program": program_of(agent.text)})
    return env.task, found


def check(task: Task, found: list[dict], workers: int) -> None:
    """Adds ``printed`` (the program's answer or None), ``agrees`` and ``program_correct`` to each solution that
    holds a program."""
    coded = [s for s in found if s["program"] is not None]
    results = run_many([s["program"] for s in coded], workers=workers, timeout=5.0, memory_mb=512)
    for solution, result in zip(coded, results):
        output = result.stdout[-OUTPUT_CHARS:] if result.passed else ""
        try:  # odd program output must not stop the count, as in the core
            printed = task.extract_answer(output) if output.strip() else None
            right = printed is not None and bool(task.grade(solution["problem"], printed))
        except Exception:
            printed, right = None, False
        solution["printed"], solution["agrees"] = printed, printed is not None and printed == solution["answer"]
        solution["program_correct"] = right


def rate(items: list[dict], key: str = "correct") -> str:
    right = sum(bool(s[key]) for s in items)
    low, high = wilson_interval(right, len(items))
    return f"{right / len(items):.3f} [{low:.2f}, {high:.2f}] (n={len(items)})" if items else "- (n=0)"


def main(argv=None) -> None:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="qwen05-arith-v2")
    parser.add_argument("--splits", nargs="+", default=["train", "test"])
    parser.add_argument("--workers", type=int, default=2, help="sandbox processes at a time")
    args = parser.parse_args(argv)
    try:
        dataset = ReplaySet(args.dataset)
    except ReplayError as error:
        parser.error(str(error))
    found = []
    for split in args.splits:
        task, rows = solutions(dataset, split)
        found += rows
    check(task, found, args.workers)
    coded = [s for s in found if s["program"] is not None]
    printed = [s for s in coded if s["printed"] is not None]
    agree = [s for s in printed if s["agrees"]]
    disagree = [s for s in printed if not s["agrees"]]
    silent = [s for s in found if s.get("printed") is None]
    problems = sorted({s["problem"].id for s in printed})
    groups = [([float(s["agrees"]) for s in printed if s["problem"].id == p],
               [s["correct"] for s in printed if s["problem"].id == p]) for p in problems]
    value, low, high = clustered_auroc(groups)
    rows = [f"| round-0 solutions | {len(found)} |",
            f"| with a code block | {len(coded)} ({len(coded) / len(found):.0%}) |",
            f"| whose program printed an answer | {len(printed)} |",
            f"| ... that agrees with the text's answer | {len(agree)} |",
            f"| text's answer right: program agrees | {rate(agree)} |",
            f"| text's answer right: program disagrees | {rate(disagree)} |",
            f"| text's answer right: no code, or nothing printed | {rate(silent)} |",
            f"| program's answer right where it disagrees | {rate(disagree, 'program_correct')} |",
            f"| AUROC of agreement for a right text answer, where the program printed (95% CI, problems) | "
            f"{value:.3f} [{low:.3f}, {high:.3f}] |"]
    header = (f"The checking tool on `{dataset.card.name}`'s round-0 solutions (splits {', '.join(args.splits)}, "
              "stream 0)")
    table = "| quantity | value |\n|---|---|\n" + "\n".join(rows)
    save_markdown(f"check_tool_{os.path.basename(args.dataset.rstrip('/'))}", header, table)

if __name__ == "__main__":
    main()
