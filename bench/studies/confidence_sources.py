"""Confidence sources on a real model, side by side on the same round-0 answers.

For each source the env's round 0 (three agents solve, then each gets a confidence) runs on the
same problems and seeds:

- ``critic``: a critic call per agent, confidence from its Yes/No verdict's log-probabilities;
- ``critic_text``: the same critic call, confidence read from its text;
- ``answer_logprobs``: no critic call, confidence from the solution's own answer-token probabilities.

It reports the AUROC of confidence for right vs wrong answers, the requests and tokens each source
sends, and the seconds. The server must return log-probabilities (``--start-server`` starts
llama.cpp with ``logits_all``). One SQLite cache serves the run: identical requests (the solves of
``critic`` and ``critic_text``) are generated once, and a re-run replays.

    python bench/studies/confidence_sources.py --start-server MODEL.gguf --levels 0 1 --problems 16
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

import deliberation_env
from bench.common.results import RESULTS, Counting, command_line, flag_settings, save_markdown
from deliberation_env.analysis.metrics import auroc
from deliberation_env.backends.cache import CachedBackend
from deliberation_env.backends.openai import OpenAICompatibleBackend
from deliberation_env.cli import OLD_TEAM_FLAGS, ArgumentParser, add_env_arguments, env_arguments
from deliberation_env.requests import Request
from deliberation_env.testing.llama_server import llama_server
from deliberation_env.vector import BatchedEnvs

SOURCES = ("answer_logprobs", "critic", "critic_text")
SETTINGS = ("num_agents", "max_tokens")
"""The env settings this study takes flags for (one round, each confidence source in turn)."""


def measure(source: str, backend, args: argparse.Namespace) -> dict:
    counter_before = (backend.inner.requests, backend.inner.prompt_tokens, backend.inner.completion_tokens)
    envs = [deliberation_env.parallel_env(task="arithmetic", task_kwargs={"levels": tuple(args.levels), "prompt": args.prompt},
                                          backend=backend, split="test", max_rounds=1, confidence=source,
                                          **env_arguments(args, SETTINGS)) for _ in range(args.problems)]
    start = time.perf_counter()
    results = BatchedEnvs(envs).reset(list(range(args.problems)), [{"problem_index": i} for i in range(args.problems)])
    seconds = time.perf_counter() - start
    right, wrong, answers = [], [], []
    for _, infos in results:
        for info in infos.values():
            (right if info["correct"] else wrong).append(info["confidence"])
            answers.append(info["answer"])
    requests, prompt, completion = (now - before for now, before in zip(
        (backend.inner.requests, backend.inner.prompt_tokens, backend.inner.completion_tokens), counter_before))
    return {"source": source, "answers": len(answers), "right": len(right), "auroc": auroc(right, wrong),
            "generated": requests, "prompt_tokens": prompt, "completion_tokens": completion, "seconds": seconds,
            "answer_list": answers}


def logprob_overhead(backend, max_tokens: int = 32, repeats: int = 2) -> tuple[float, float]:
    """Seconds per completion token of one solve request without and with every token's log-probability
    (no cache; the same request, seed and length each time), the best of ``repeats``."""
    task = deliberation_env.TASKS.make("arithmetic", levels=(0,))
    messages = task.solve_messages(task.problems("test")[0])
    timings = []
    for token_logprobs in (False, True):
        request = Request(tuple(messages), "solve", 0, 1, max_tokens=max_tokens, temperature=0.0,
                          token_logprobs=token_logprobs)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            completion = backend.generate([request])[0]
            best = min(best, (time.perf_counter() - start) / max(1, completion.completion_tokens))
        timings.append(best)
    return timings[0], timings[1]


def main(argv: Sequence[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--start-server", metavar="GGUF", required=True, help="a GGUF file (llama.cpp, logits_all on)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--levels", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--prompt", default="default")
    parser.add_argument("--problems", type=int, default=16)
    add_env_arguments(parser, SETTINGS, defaults={"max_tokens": 256}, aliases=OLD_TEAM_FLAGS)
    parser.add_argument("--sources", nargs="*", choices=SOURCES, default=list(SOURCES),
                        help="sources to compare (none: only the log-probability overhead)")
    parser.add_argument("--out", default=os.path.join(RESULTS, "confidence_sources"))
    args = parser.parse_args(argv)
    agents = flag_settings(parser, args, SETTINGS).num_agents
    os.makedirs(args.out, exist_ok=True)
    with llama_server(args.start_server, args.threads, logits_all=True) as urls:
        inner = Counting(OpenAICompatibleBackend(urls, model="local", concurrency=1, deadline=1800))
        plain, with_logprobs = logprob_overhead(inner.inner)
        overhead = (f"One solve request, {plain:.2f} s per completion token without log-probabilities and "
                    f"{with_logprobs:.2f} s with every token's ({with_logprobs / plain:.1f}x).")
        print(overhead, flush=True)
        backend = CachedBackend(inner, os.path.join(args.out, "cache.sqlite"))
        rows = []
        for source in args.sources:
            rows.append(measure(source, backend, args))
            print(f"{source}: AUROC {rows[-1]['auroc']:.3f}, {rows[-1]['seconds']:.0f} s", flush=True)
        backend.close()
    if not rows:
        print(save_markdown("confidence_sources", f"{overhead}\n\n`{command_line()}`", ""))
        return
    same = all(r["answer_list"] == rows[0]["answer_list"] for r in rows)
    table = "\n".join(
        ["| source | answers (right) | AUROC | requests generated | prompt tokens | completion tokens | seconds |",
         "|---|---|---|---|---|---|---|"]
        + [f"| {r['source']} | {r['answers']} ({r['right']}) | {r['auroc']:.3f} | {r['generated']} | "
           f"{r['prompt_tokens']} | {r['completion_tokens']} | {r['seconds']:.0f} |" for r in rows])
    header = (f"Round-0 confidence on a real model ({os.path.basename(args.start_server)}, llama.cpp with logits_all, "
              f"{args.threads} threads), arithmetic levels {args.levels} prompt {args.prompt}, {agents} agents x "
              f"{args.problems} problems; the same answers under every source: {same}. A source that sends the same "
              f"solve requests as one before it (`critic_text` after `critic`) reuses them from the cache, so its "
              f"row counts only its critic calls. {overhead}\n\n"
              f"`{command_line()}`")
    print(save_markdown("confidence_sources", header, table))


if __name__ == "__main__":
    main()
