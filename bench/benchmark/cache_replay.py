"""Cache replay generations/s: the cache-replay row of bench/benchmark/backend_batching.py, without the real model.

    python bench/benchmark/cache_replay.py                   # the sim fills the cache (seconds)
    python bench/benchmark/cache_replay.py --backend smollm2  # SmolLM2 on the transformers backend fills it, as backend_batching does

Same measurement as backend_batching.py: ``--episodes`` envs (arithmetic, ``--rounds`` rounds, every agent
REFINEs, max_tokens 32, critic_max_tokens 8) play one batched episode each through a ``CachedBackend`` to fill
it, then replay those episodes for ``--seconds``; every request is a hit (checked), and the rate is cache hits
per second of replay (full env episodes: the env's own work is included).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

import deliberation_env
from deliberation_env.backends.cache import CachedBackend
from deliberation_env.cli import OLD_TEAM_FLAGS, ArgumentParser, add_env_arguments
from deliberation_env.vector import run_batched


def policy(index, observations):
    return {agent: 1 for agent in observations}


def make_backend(name: str):
    if name == "sim":
        return deliberation_env.backends.SimBackend()
    from deliberation_env.backends.models import smollm2_gguf_path
    from deliberation_env.backends.transformers import TransformersBackend

    return TransformersBackend(smollm2_gguf_path(), dtype="bfloat16", batch_size=32,
                               converted_cache_dir=tempfile.gettempdir() + "/deliberation_env_converted")


def replay_rate(backend, episodes: int, rounds: int, max_tokens: int, seconds: float) -> tuple[float, int]:
    """(cache hits per second of replay, replays), measured as in bench/benchmark/backend_batching.py."""
    with tempfile.TemporaryDirectory() as tmp:
        cache = CachedBackend(backend, tmp + "/bench.sqlite")
        envs = [deliberation_env.parallel_env(task="arithmetic", backend=cache, split="test", max_rounds=rounds,
                                              max_tokens=max_tokens, critic_max_tokens=8) for _ in range(episodes)]
        run_batched(envs, policy, list(range(episodes)))
        misses = cache.stats.misses
        start = time.perf_counter()
        replays = 0
        while time.perf_counter() - start < seconds:
            run_batched(envs, policy, list(range(episodes)))
            replays += 1
        elapsed = time.perf_counter() - start
        assert cache.stats.misses == misses, "replay produced misses"
        cache.close()
        return cache.stats.hits / elapsed, replays


def main() -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("sim", "smollm2"), default="sim", help="what fills the cache")
    parser.add_argument("--episodes", type=int, default=8)
    add_env_arguments(parser, ("max_rounds", "max_tokens"), defaults={"max_rounds": 1, "max_tokens": 32},
                      aliases=OLD_TEAM_FLAGS)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    print("config:", vars(args))
    rate, replays = replay_rate(make_backend(args.backend), args.episodes, args.max_rounds, args.max_tokens, args.seconds)
    print(f"cache replay (full env episodes, all hits): {rate:,.0f} generations/s over {replays} replays")


if __name__ == "__main__":
    main()
