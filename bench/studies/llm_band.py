"""Single-agent accuracy of a real model by task, level and prompt, with 95% Wilson intervals.

Single-agent accuracy is the env's round-0 solve: the task's ``solve_messages`` sent to the backend
(in batches), the reply read with the task's ``extract_answer`` and graded with ``grade``. The study
of deliberation on a real model needs cells where this is between 20% and 80%.

    python bench/studies/llm_band.py --start-server MODEL.gguf --task arithmetic --levels 0 1 2 --prompt default no_code
    python bench/studies/llm_band.py --backend openai --base-url http://127.0.0.1:8000/v1 --model qwen --task gsm8k
    python bench/studies/llm_band.py --backend transformers --model MODEL.gguf --task arithmetic --levels 0

``--start-server GGUF`` starts ``python -m llama_cpp.server`` on a free local port for the run and
stops it at the end (also on errors and Ctrl-C). The table goes to ``bench/results/<--out>.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

import deliberation_env
from bench.common.results import RESULTS, flag_settings, save_markdown, wilson_interval
from deliberation_env.backends.base import Backend
from deliberation_env.cli import SAMPLING_FLAGS, ArgumentParser, add_env_arguments
from deliberation_env.requests import Request
from deliberation_env.testing.llama_server import llama_server

BAND = (0.2, 0.8)


@dataclass
class Cell:
    """One (task, level, prompt) measurement."""

    task: str
    level: str
    prompt: str
    n: int = 0
    correct: int = 0
    no_answer: int = 0
    truncated: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0

    def row(self) -> str:
        low, high = wilson_interval(self.correct, self.n)
        accuracy = self.correct / self.n if self.n else float("nan")
        band = "yes" if BAND[0] <= accuracy <= BAND[1] else "no"
        return (f"| {self.task} | {self.level} | {self.prompt} | {self.n} | {accuracy:.3f} | [{low:.3f}, {high:.3f}] | "
                f"{band} | {self.no_answer / max(1, self.n):.2f} | {self.truncated / max(1, self.n):.2f} | "
                f"{self.completion_tokens / max(1, self.n):.0f} | {self.seconds:.0f} |")


TABLE_HEAD = ("| task | level | prompt | n | accuracy | 95% CI (Wilson) | in 20-80% | no answer | hit max_tokens "
              "| mean completion tokens | seconds |\n|---|---|---|---|---|---|---|---|---|---|---|")


def make_task(name: str, level: int | None, prompt: str, data_dir: str | None) -> Any:
    """The task of one cell: arithmetic takes ``levels=(level,)`` and ``prompt``; others have one prompt."""
    if name == "arithmetic":
        return deliberation_env.TASKS.make(name, levels=(level,), prompt=prompt)
    return deliberation_env.TASKS.make(name, data_dir=data_dir)


def measure(backend: Backend, task: Any, cell: Cell, args: argparse.Namespace, samples: list[dict]) -> Cell:
    """Solve the first ``args.problems`` problems of the split once each and grade them into ``cell``."""
    problems = list(task.problems(args.split))[: args.problems]
    for start in range(0, len(problems), args.batch_size):
        batch = problems[start : start + args.batch_size]
        requests = [Request(task.solve_messages(problem), kind="solve", agent=0, seed=args.seed * 1_000_003 + start + i,
                            max_tokens=args.max_tokens, temperature=args.temperature)
                    for i, problem in enumerate(batch)]
        began = time.perf_counter()
        completions = backend.generate(requests)
        cell.seconds += time.perf_counter() - began
        for problem, completion in zip(batch, completions):
            answer = task.extract_answer(completion.text)
            correct = task.grade(problem, answer)
            cell.n += 1
            cell.correct += correct
            cell.no_answer += answer is None
            cell.truncated += completion.finish_reason == "length"
            cell.completion_tokens += completion.completion_tokens
            samples.append({"task": cell.task, "level": cell.level, "prompt": cell.prompt, "id": problem.id,
                            "gold": problem.answer, "answer": answer, "correct": correct, "text": completion.text,
                            "completion_tokens": completion.completion_tokens})
        print(f"  {cell.task} level {cell.level} {cell.prompt}: {cell.correct}/{cell.n} after {cell.seconds:.0f} s",
              flush=True)
    return cell


def run_cells(backend: Backend, args: argparse.Namespace) -> tuple[list[Cell], list[dict], str]:
    """Every (task, level, prompt) cell; stops at the first backend error, keeping the cells done so far."""
    cells: list[Cell] = []
    samples: list[dict] = []
    for name in args.task:
        levels: Sequence[int | None] = args.levels if name == "arithmetic" else [None]
        for prompt in args.prompt:
            for level in levels:
                task = make_task(name, level, prompt, args.data_dir)
                cell = Cell(name, "all" if level is None else str(level), prompt)
                try:
                    cells.append(measure(backend, task, cell, args, samples))
                except Exception as error:  # keep what is done; the caller saves it, then reports the error
                    if cell.n:
                        cells.append(cell)
                    return cells, samples, f"stopped at {name} level {cell.level} {prompt}: {type(error).__name__}: {error}"
    return cells, samples, ""


def make_backend(args: argparse.Namespace, base_url: str | None) -> tuple[Backend, str]:
    if args.backend == "transformers":
        from deliberation_env.backends.transformers import TransformersBackend

        backend = TransformersBackend(args.model, dtype=args.dtype, batch_size=args.batch_size, num_threads=args.threads,
                                      converted_cache_dir=args.converted_cache_dir)
        return backend, backend.identity()
    from deliberation_env.backends.openai import OpenAICompatibleBackend

    if not base_url:
        raise SystemExit("--backend openai needs --base-url URL (ending in /v1) or --start-server GGUF")
    backend = OpenAICompatibleBackend(base_url, model=args.model or "local", timeout=args.request_timeout,
                                      concurrency=args.batch_size, max_retries=1)
    return backend, f"{backend.identity()} at {'llama.cpp server (--start-server)' if args.start_server else base_url}"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("openai", "transformers"), default="openai")
    parser.add_argument("--base-url", help="an OpenAI-compatible server's URL, ending in /v1")
    parser.add_argument("--model", help="openai: the served model name; transformers: a model folder or .gguf file")
    parser.add_argument("--start-server", metavar="GGUF", help="start a llama.cpp server on this GGUF for the run")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of the started server / of torch")
    parser.add_argument("--task", nargs="+", default=["arithmetic"])
    parser.add_argument("--levels", nargs="+", type=int, default=[0, 1, 2], help="arithmetic levels (0-5)")
    parser.add_argument("--prompt", nargs="+", default=["default"], help="arithmetic prompt styles: default no_code")
    parser.add_argument("--problems", type=int, default=40, help="problems per cell (the first N of the split)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--data-dir", default=None, help="benchmark data (default: $DELIBERATION_ENV_DATA)")
    add_env_arguments(parser, SAMPLING_FLAGS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=8, help="requests per generate call")
    parser.add_argument("--request-timeout", type=float, default=900.0, help="openai: seconds per request, queue included")
    parser.add_argument("--dtype", default="bfloat16", help="transformers: bfloat16, float32, ...")
    parser.add_argument("--converted-cache-dir", default=os.path.join(tempfile.gettempdir(), "deliberation_env_converted"))
    parser.add_argument("--out", default="llm_band", help="results file stem under bench/results/")
    parser.add_argument("--save-completions", action="store_true", help="also write <out>_completions.jsonl")
    args = parser.parse_args(argv)
    settings = flag_settings(parser, args, SAMPLING_FLAGS)  # the requests sample as the env would
    args.max_tokens, args.temperature = settings.max_tokens, settings.temperature
    if args.problems < 1 or args.batch_size < 1:
        parser.error("--problems and --batch-size must be >= 1")
    if args.start_server and args.backend != "openai":
        parser.error("--start-server serves the openai backend; drop --backend transformers")
    if args.backend == "transformers" and not args.model:
        parser.error("--backend transformers needs --model (a model folder or a .gguf file)")
    others = [name for name in args.task if name != "arithmetic"]
    if others and args.prompt != ["default"]:
        parser.error(f"--prompt {' '.join(args.prompt)}: only the arithmetic task has prompt styles; run "
                     f"{', '.join(others)} separately with --prompt default")
    for level in args.levels:
        if not 0 <= level <= 5:
            parser.error(f"--levels: arithmetic levels are 0-5, got {level}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind, so a started server is stopped too
    print("config:", vars(args), flush=True)
    with contextlib.ExitStack() as stack:
        base_url = stack.enter_context(llama_server(args.start_server, args.threads)) if args.start_server else args.base_url
        backend, identity = make_backend(args, base_url)
        stack.callback(getattr(backend, "close", lambda: None))
        cells, samples, failure = run_cells(backend, args)
    header = (f"Single-agent accuracy (round-0 solve) of {identity}; {args.problems} problems per cell from the "
              f"{args.split} split, temperature {args.temperature}, max_tokens {args.max_tokens}, seed {args.seed}, "
              f"batches of {args.batch_size}, {args.threads} threads on a {os.cpu_count()}-core CPU")
    if failure:
        header += f". INCOMPLETE: {failure}"
    path = save_markdown(args.out, header, TABLE_HEAD + "\n" + "\n".join(cell.row() for cell in cells))
    print(f"saved {path}")
    if args.save_completions:
        with open(os.path.join(RESULTS, f"{args.out}_completions.jsonl"), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(sample) + "\n" for sample in samples)
    if failure:
        raise SystemExit(failure)


if __name__ == "__main__":
    main()
