"""Generated tokens/s of SmolLM2 on the transformers backend: (a) one request at a time,
(b) batched within each env, (c) batched across envs; (c) again with every row prefilling its own prompt
(``share_prefill=False``: what sharing the prefill of the prompts' common starts saves) and with ``transformers``'
``generate`` decoding every row until the batch's longest ends (``drop_finished=False``); plus cache replay
generations/s."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

import deliberation_env
from bench.common.results import Counting
from deliberation_env.backends.cache import CachedBackend
from deliberation_env.backends.models import smollm2_gguf_path
from deliberation_env.backends.transformers import TransformersBackend
from deliberation_env.cli import OLD_TEAM_FLAGS, ArgumentParser, add_env_arguments, env_arguments
from deliberation_env.vector import run_batched


class OneAtATime:
    def __init__(self, inner):
        self.inner = inner

    def identity(self):
        return self.inner.identity()

    def generate(self, requests):
        return [self.inner.generate([r])[0] for r in requests]

SETTINGS = ("max_rounds", "max_tokens")
"""The env settings this measurement takes flags for."""


def policy(index, observations):
    return {agent: 1 for agent in observations}


def run(backend, episodes, args, across: bool) -> float:
    counter = Counting(backend)
    envs = [deliberation_env.parallel_env(task="arithmetic", backend=counter, split="test", critic_max_tokens=8,
                                          **env_arguments(args, SETTINGS)) for _ in range(episodes)]
    start = time.perf_counter()
    if across:
        run_batched(envs, policy, list(range(episodes)))
    else:
        for i, env in enumerate(envs):
            run_batched([env], policy, [i])
    return counter.completion_tokens / (time.perf_counter() - start)


def main() -> None:
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("--episodes", type=int, default=8)
    add_env_arguments(parser, SETTINGS, defaults={"max_rounds": 1, "max_tokens": 32}, aliases=OLD_TEAM_FLAGS)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--converted-cache-dir", default=tempfile.gettempdir() + "/deliberation_env_converted")
    args = parser.parse_args()
    print("config:", vars(args))
    backend = TransformersBackend(smollm2_gguf_path(), dtype=args.dtype, batch_size=args.batch_size,
                                  converted_cache_dir=args.converted_cache_dir)
    a = run(OneAtATime(backend), args.episodes, args, across=False)
    b = run(backend, args.episodes, args, across=False)
    c = run(backend, args.episodes, args, across=True)
    backend.share_prefill = False
    c_unshared = run(backend, args.episodes, args, across=True)
    backend.share_prefill, backend.drop_finished = True, False
    c_generate = run(backend, args.episodes, args, across=True)
    backend.drop_finished = True
    print(f"(a) one request at a time: {a:8.1f} tok/s")
    print(f"(b) batched within env:    {b:8.1f} tok/s  ({b / a:.2f}x a)")
    print(f"(c) batched across envs:   {c:8.1f} tok/s  ({c / a:.2f}x a)")
    print(f"(c) without shared prefill: {c_unshared:7.1f} tok/s  ({c_unshared / a:.2f}x a)")
    print(f"(c) with generate():        {c_generate:7.1f} tok/s  ({c_generate / a:.2f}x a)")
    with tempfile.TemporaryDirectory() as tmp:
        cache = CachedBackend(backend, tmp + "/bench.sqlite")
        envs = [deliberation_env.parallel_env(task="arithmetic", backend=cache, split="test", critic_max_tokens=8,
                                              **env_arguments(args, SETTINGS)) for _ in range(args.episodes)]
        run_batched(envs, policy, list(range(args.episodes)))
        misses = cache.stats.misses
        start = time.perf_counter()
        replays = 0
        while time.perf_counter() - start < 2.0:
            run_batched(envs, policy, list(range(args.episodes)))
            replays += 1
        elapsed = time.perf_counter() - start
        assert cache.stats.misses == misses, "replay produced misses"
        print(f"cache replay (full env episodes, all hits): {cache.stats.hits / elapsed:,.0f} generations/s over {replays} replays")


if __name__ == "__main__":
    main()
