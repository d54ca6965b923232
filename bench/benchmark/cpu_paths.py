"""The fastest CPU path for a real-model study: the same GGUF model and the same solve requests through
(a) a llama.cpp server behind ``OpenAICompatibleBackend`` and (b) ``TransformersBackend`` (float32,
bfloat16), measured in one run: completion tokens per second and seconds per request; then the same paths
through the env (``--episodes`` debate episodes of 3 agents in one batch, env and evaluation loop included).

    python bench/benchmark/cpu_paths.py --gguf '~/.cache/deliberation-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf'

Each path gets one warm-up request before it is timed. Load time (server start; GGUF dequantisation,
or the converted copy in ``--converted-cache-dir`` when one exists) is reported apart. The table goes to
``bench/results/<--out>.md``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

from bench.common.results import Counting, flag_settings, save_markdown
from deliberation_env.backends.base import Backend
from deliberation_env.cli import SAMPLING_FLAGS, ArgumentParser, add_env_arguments
from deliberation_env.requests import Request
from deliberation_env.tasks.arithmetic import ArithmeticTask
from deliberation_env.testing.llama_server import llama_server


def solve_requests(args: argparse.Namespace) -> tuple[ArithmeticTask, list, list[Request]]:
    """The first ``--requests`` arithmetic test problems (levels ``--levels``) as round-0 solve requests."""
    task = ArithmeticTask(levels=tuple(args.levels), prompt=args.prompt)
    problems = list(task.problems("test")[: args.requests])
    requests = [Request(task.solve_messages(p), kind="solve", agent=0, seed=args.seed * 1_000_003 + i,
                        max_tokens=args.max_tokens, temperature=args.temperature) for i, p in enumerate(problems)]
    return task, problems, requests


def time_path(name: str, backend: Backend, load_seconds: float, task: ArithmeticTask, problems: list,
              requests: list[Request]) -> dict:
    """Warm up with one request, then answer all ``requests`` in one ``generate`` call."""
    backend.generate([requests[0]])
    began = time.perf_counter()
    completions = backend.generate(requests)
    seconds = time.perf_counter() - began
    tokens = sum(c.completion_tokens for c in completions)
    correct = sum(task.grade(p, task.extract_answer(c.text)) for p, c in zip(problems, completions))
    result = {"path": name, "load": load_seconds, "seconds": seconds, "tokens": tokens,
              "tok_s": tokens / seconds, "s_request": seconds / len(requests), "correct": correct}
    print(f"  {name}: {tokens} tokens in {seconds:.1f} s = {result['tok_s']:.1f} tok/s (load {load_seconds:.1f} s)",
          flush=True)
    return result


def time_env(name: str, backend: Backend, args: argparse.Namespace) -> dict:
    """``--episodes`` debate episodes (3 agents, 1 round: solve, critic, refine, critic) through the meta-action env,
    all in one batch (``baselines.evaluation.evaluate``): completion tokens per second of the whole loop, env included."""
    import deliberation_env
    from baselines.evaluation.evaluate import evaluate_entries
    from deliberation_env.protocols import make_protocol

    counted = Counting(backend)

    def make_env():
        # critic_text: the critics state their confidence in words (the server runs without log-probabilities)
        return deliberation_env.parallel_env(task="arithmetic", backend=counted, split="test", num_agents=3, max_rounds=1,
                                             confidence="critic_text",
                                             max_tokens=args.max_tokens, temperature=args.temperature, task_kwargs={"levels": tuple(args.levels),
                                                                                      "prompt": args.prompt})

    began = time.perf_counter()
    row = evaluate_entries([(name, lambda: make_protocol("debate"), make_env)], args.episodes, [args.seed],
                           batch_size=args.episodes)[0]
    seconds = time.perf_counter() - began
    result = {"path": name, "seconds": seconds, "requests": counted.requests, "tokens": counted.completion_tokens,
              "tok_s": counted.completion_tokens / seconds, "accuracy": row["accuracy"]}
    print(f"  {name} through the env: {counted.completion_tokens} tokens in {seconds:.1f} s = "
          f"{result['tok_s']:.1f} tok/s", flush=True)
    return result


def measure_llama(args: argparse.Namespace, task, problems, requests) -> dict:
    from deliberation_env.backends.openai import OpenAICompatibleBackend

    began = time.perf_counter()
    with llama_server(args.gguf, args.threads) as url:
        load = time.perf_counter() - began
        backend = OpenAICompatibleBackend(url, model=Path(args.gguf).stem, timeout=900.0, concurrency=len(requests))
        try:
            name = "llama.cpp server + OpenAICompatibleBackend"
            return {**time_path(name, backend, load, task, problems, requests), "env": time_env(name, backend, args)}
        finally:
            backend.close()


def measure_transformers(args: argparse.Namespace, dtype: str, task, problems, requests) -> dict:
    from deliberation_env.backends.transformers import TransformersBackend

    began = time.perf_counter()
    backend = TransformersBackend(str(Path(args.gguf).expanduser()), dtype=dtype, batch_size=args.batch_size,
                                  num_threads=args.threads, converted_cache_dir=args.converted_cache_dir)
    load = time.perf_counter() - began
    name = f"TransformersBackend {dtype}, batches of {args.batch_size}"
    return {**time_path(name, backend, load, task, problems, requests), "env": time_env(name, backend, args)}


def main(argv: Sequence[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", required=True, help="the GGUF model file (both paths load it)")
    parser.add_argument("--requests", type=int, default=16)
    add_env_arguments(parser, SAMPLING_FLAGS, defaults={"max_tokens": 128})
    parser.add_argument("--levels", nargs="+", type=int, default=[0, 1, 2], help="arithmetic levels of the problems")
    parser.add_argument("--prompt", default="no_code", help="arithmetic prompt style")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp server threads and torch threads")
    parser.add_argument("--dtypes", nargs="*", default=["bfloat16", "float32"],
                        help="TransformersBackend dtypes (bfloat16 is fast only on CPUs with AVX512-BF16 or AMX)")
    parser.add_argument("--batch-size", type=int, default=16, help="TransformersBackend batch size")
    parser.add_argument("--episodes", type=int, default=8, help="debate episodes through the env per path")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--converted-cache-dir", default=os.path.join(tempfile.gettempdir(), "deliberation_env_converted"))
    parser.add_argument("--out", default="cpu_paths", help="results file stem under bench/results/")
    args = parser.parse_args(argv)
    settings = flag_settings(parser, args, SAMPLING_FLAGS)  # the requests sample as the env would
    args.max_tokens, args.temperature = settings.max_tokens, settings.temperature
    if not Path(args.gguf).expanduser().is_file():
        parser.error(f"--gguf: {args.gguf!r} is not a file")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind, so the started server is stopped too
    print("config:", vars(args), flush=True)
    task, problems, requests = solve_requests(args)
    results = [measure_llama(args, task, problems, requests)]
    for dtype in args.dtypes:
        try:
            results.append(measure_transformers(args, dtype, task, problems, requests))
        except (RuntimeError, ValueError, OSError, MemoryError) as error:  # measure what loads, say what did not
            print(f"  TransformersBackend {dtype} failed: {type(error).__name__}: {error}", flush=True)
            results.append({"path": f"TransformersBackend {dtype}", "error": f"{type(error).__name__}: {error}"[:200]})
    base = results[0]
    rows = ["| path | load s | timed s | completion tokens | tok/s | s/request | tok/s vs llama.cpp | correct |",
            "|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            rows.append(f"| {r['path']} | failed: {r['error']} | | | | | | |")
            continue
        rows.append(f"| {r['path']} | {r['load']:.1f} | {r['seconds']:.1f} | {r['tokens']} | {r['tok_s']:.1f} | "
                    f"{r['s_request']:.2f} | {r['tok_s'] / base['tok_s']:.2f}x | {r['correct']}/{len(requests)} |")
    rows += ["", f"Through the env: {args.episodes} debate episodes (3 agents, 1 round) in one batch, the same seeds on "
             "every path:", "",
             "| path | seconds | requests | completion tokens | tok/s | tok/s vs llama.cpp | team accuracy |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" not in r:
            env = r["env"]
            rows.append(f"| {r['path']} | {env['seconds']:.1f} | {env['requests']} | {env['tokens']} | "
                        f"{env['tok_s']:.1f} | {env['tok_s'] / base['env']['tok_s']:.2f}x | {env['accuracy']:.2f} |")
    fastest = max((r for r in results if "error" not in r), key=lambda r: r["tok_s"])
    header = (f"CPU paths for {Path(args.gguf).name}: the same {len(requests)} arithmetic solve requests (levels "
              f"{args.levels}, prompt {args.prompt}, max_tokens {args.max_tokens}, temperature {args.temperature}, "
              f"seed {args.seed}), {args.threads} threads on a {os.cpu_count()}-core CPU; fastest: {fastest['path']}")
    print(f"saved {save_markdown(args.out, header, chr(10).join(rows))}")


if __name__ == "__main__":
    main()
