"""The asynchronous OpenAI-compatible client against loopback servers that answer after a fixed latency.

    python bench/benchmark/async_client.py --latency 0.2

Three measurements in one run, against ``deliberation_env.testing.servers.LoopbackServer`` replicas
(127.0.0.1, threaded, keep-alive; each works on at most ``--capacity`` requests at once, the "server
limit", and queues the rest):

1. Throughput: ``--sequential`` requests one at a time (``generate([request])`` in a loop), then for each
   concurrency in ``--concurrency`` ``8 x concurrency`` requests in one ``generate`` call, on
   ``--replicas`` replicas; requests/s and the ratio to the sequential rate (target >= 50x at 64).
2. ``--episodes`` concurrent episodes (``--episodes`` envs, 3 agents, arithmetic, the env's real prompts,
   every agent REFINEs for ``--rounds`` rounds) through ``deliberation_env.vector.run_episodes``, one backend:
   every episode must end, and each request must be answered exactly once (counted on the servers by the
   client's ``X-Request-Id`` against what the envs asked).
3. The same episodes with ``routing="least_busy"``: prefix reuse per episode (on each replica, the longest
   common prefix of a request with the previous request of the same episode there) and replicas per episode.

Saves bench/results/async_client.{md,png}.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

import deliberation_env
from bench.common.results import RESULTS, Counting, save_markdown
from deliberation_env.backends.base import Message
from deliberation_env.backends.openai import OpenAICompatibleBackend
from deliberation_env.cli import OLD_TEAM_FLAGS, ArgumentParser, add_env_arguments
from deliberation_env.requests import Request
from deliberation_env.testing.servers import LoopbackServer
from deliberation_env.vector import Start, run_episodes


def fleet(n: int, latency: float, capacity: int) -> list[LoopbackServer]:
    return [LoopbackServer(latency=latency, capacity=capacity, keep_bodies=False) for _ in range(n)]


def requests(count: int, start: int) -> list[Request]:
    return [Request((Message("user", f"Request {start + i}: what is {i} + {i}?"),), "solve", 0, start + i,
                    max_tokens=16, temperature=0.0, episode=start + i) for i in range(count)]


def throughput(servers: list[LoopbackServer], sequential: int, levels: list[int]) -> list[tuple[str, int, float]]:
    """(setting, requests, requests/s): one at a time, then each concurrency level."""
    urls = [s.url for s in servers]
    backend = OpenAICompatibleBackend(urls, model="latency", concurrency=1)
    backend.generate(requests(2, 0))  # warm-up
    start = time.perf_counter()
    for request in requests(sequential, 10**6):
        backend.generate([request])
    rows = [("sequential (one call per request)", sequential, sequential / (time.perf_counter() - start))]
    backend.close()
    for level in levels:
        backend = OpenAICompatibleBackend(urls, model="latency", concurrency=level)
        backend.generate(requests(level, 0))  # warm-up: open the connections
        batch = requests(8 * level, 10**6 * (level + 1))
        start = time.perf_counter()
        assert len(backend.generate(batch)) == len(batch)
        rows.append((f"concurrency {level}", len(batch), len(batch) / (time.perf_counter() - start)))
        backend.close()
    return rows


def episodes(servers: list[LoopbackServer], count: int, rounds: int, concurrency: int, routing: str) -> dict:
    """Runs ``count`` episodes at once; what the servers counted."""
    for server in servers:
        server.answered.clear()
        server.episodes.clear()
    backend = Counting(OpenAICompatibleBackend([s.url for s in servers], model="latency", concurrency=concurrency,
                                               routing=routing, logprobs=False))
    envs = [deliberation_env.parallel_env(task="arithmetic", backend="sim", split="test", max_rounds=rounds) for _ in range(count)]
    start = time.perf_counter()
    run_episodes(envs, [Start(seed) for seed in range(count)],
                 lambda steps: [dict.fromkeys(step.env.agents, 1) for step in steps], backend=backend)
    wall = time.perf_counter() - start
    backend.inner.close()
    answered: Counter[str] = Counter()
    for server in servers:
        answered.update(server.answered)
    per_episode: dict[str, list[int]] = {}
    replicas: Counter[str] = Counter()
    for server in servers:
        for episode, stats in server.episodes.items():
            totals = per_episode.setdefault(episode, [0, 0])
            totals[0], totals[1] = totals[0] + stats.chars, totals[1] + stats.reused
            replicas[episode] += 1
    return {"wall": wall, "asked": backend.requests, "completions": backend.completions, "answered": len(answered),
            "duplicated": sum(n - 1 for n in answered.values()), "ended": sum(not env.agents for env in envs),
            "episodes": count, "reuse": sum(r for _, r in per_episode.values()) / sum(c for c, _ in per_episode.values()),
            "reuse_per_episode": sorted(r / c for c, r in per_episode.values()),
            "replicas": sum(replicas.values()) / len(replicas), "split": sum(n > 1 for n in replicas.values())}


def plot(rows: list[tuple[str, int, float]], levels: list[int], latency: float, limit: int, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(levels, [rate for _, _, rate in rows[1:]], "o-", label="async client")
    ax.plot(levels, [min(level, limit) / latency for level in levels], "k--", lw=1, label="ideal (servers' limit)")
    ax.axhline(rows[0][2], color="grey", lw=1, label="sequential calls")
    ax.set(xscale="log", yscale="log", xlabel="concurrency", ylabel="requests / s",
           title=f"{1000 * latency:.0f} ms per request, server limit {limit} in flight")
    ax.set_xticks(levels, [str(level) for level in levels])
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", type=float, default=0.2, help="seconds each server waits per request")
    parser.add_argument("--replicas", type=int, default=2, help="servers")
    parser.add_argument("--capacity", type=int, default=48, help="requests each server works on at once")
    parser.add_argument("--sequential", type=int, default=25, help="requests sent one at a time")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 16, 32, 64, 128])
    parser.add_argument("--episodes", type=int, default=1000, help="concurrent episodes (3 agents each)")
    add_env_arguments(parser, ("max_rounds",), defaults={"max_rounds": 1}, aliases=OLD_TEAM_FLAGS)
    parser.add_argument("--episode-concurrency", type=int, default=64, help="concurrency for the episodes")
    parser.add_argument("--episode-replicas", type=int, nargs="+", default=[2, 4],
                        help="replica counts for the episodes (the same total server limit split among them)")
    args = parser.parse_args()

    servers = fleet(args.replicas, args.latency, args.capacity)
    try:
        rows = throughput(servers, args.sequential, args.concurrency)
    finally:
        for server in servers:
            server.close()
    runs = {}
    for n in args.episode_replicas:
        servers = fleet(n, args.latency, args.replicas * args.capacity // n)
        try:
            for routing in ("sticky", "least_busy"):
                runs[f"{n} replicas, {routing}"] = episodes(servers, args.episodes, args.max_rounds,
                                                            args.episode_concurrency, routing)
        finally:
            for server in servers:
                server.close()

    base = rows[0][2]
    lines = ["| setting | requests | requests / s | x sequential |", "|---|---|---|---|"]
    lines += [f"| {name} | {n} | {rate:.1f} | {rate / base:.1f}x |" for name, n, rate in rows]
    at64 = next((rate for name, _, rate in rows if name == "concurrency 64"), None)
    if at64 is not None:
        lines += ["", f"**concurrency 64 / sequential: {at64 / base:.1f}x** (target >= 50x)"]
    lines += ["", f"{args.episodes} concurrent episodes (3 agents, {args.max_rounds} round(s) after the solve, every agent "
              f"REFINEs; arithmetic prompts; concurrency {args.episode_concurrency}; server limit "
              f"{args.replicas * args.capacity} in flight split among the replicas):", "",
              "| replicas, routing | wall s | requests asked | completions | answered on the servers (distinct ids) | "
              "duplicated | episodes ended | prefix reused (all prompt chars) | median per episode | "
              "replicas per episode | episodes on >1 replica |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for routing, r in runs.items():
        median = r["reuse_per_episode"][len(r["reuse_per_episode"]) // 2]
        lines.append(f"| {routing} | {r['wall']:.1f} | {r['asked']} | {r['completions']} | {r['answered']} | "
                     f"{r['duplicated']} | {r['ended']}/{r['episodes']} | {100 * r['reuse']:.1f}% | "
                     f"{100 * median:.1f}% | {r['replicas']:.2f} | {r['split']} |")
    header = (f"Async OpenAI-compatible client vs {args.replicas} loopback replicas answering after "
              f"{1000 * args.latency:.0f} ms (at most {args.capacity} requests at once each), 2-core machine, "
              "client and servers in one process")
    save_markdown("async_client", header, "\n".join(lines))
    plot(rows, args.concurrency, args.latency, args.replicas * args.capacity, os.path.join(RESULTS, "async_client.png"))


if __name__ == "__main__":
    main()
