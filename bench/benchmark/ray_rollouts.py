"""Rollout rounds/s with 1 vs 2 Ray workers against a server that answers every request after a fixed latency.

    python bench/benchmark/ray_rollouts.py --latency 0.2 --batches 3

A loopback OpenAI-compatible server (``deliberation_env.testing.servers.LoopbackServer``) sleeps ``--latency`` seconds per request, then replies
with a fixed answer; the envs use the real ``openai`` backend (no cache) through ``baselines.meta.distributed``'s
``RayCollector``, as ``python -m baselines.meta.train --num-workers N`` does. One batch is ``--waves`` waves of
``--num-envs`` envs (3 agents, 3 rounds) played by the (untrained) policy; the same batches are timed with 1 and
with 2 workers in this one run (after one warm-up batch each). A round is one ``env.step`` of one env.

Per-worker overhead: the same batches once more with the server's latency set to 0, so what is left of a worker's
time is everything but waiting on the server (encoding, the forward pass, env logic, HTTP on loopback); plus Ray's
own cost per batch (the learner's wall time minus the slowest worker's collecting time). Saves
bench/results/ray_rollouts.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import ray

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

from baselines.meta.config import BaseConfig, make_env_fn
from baselines.meta.distributed import RayCollector
from baselines.meta.policy import Policy, agent_layout
from baselines.meta.rollout import EpisodeSpec, sampling_key
from bench.common.results import save_markdown
from deliberation_env.cli import ArgumentParser
from deliberation_env.testing.servers import LoopbackServer


def measure(collector: RayCollector, policy: Policy, batches: list[list[EpisodeSpec]]) -> dict[str, float]:
    """Rounds/s over ``batches`` (after a warm-up batch), and per batch the slowest worker's collecting time."""
    layout = agent_layout(collector.env)
    collector.collect(layout, policy, batches[0], sampling_key(0, "bench"))  # warm-up: connections, first imports
    rounds, wave_rounds, wall, busy = 0, 0, 0.0, 0.0
    for specs in batches[1:]:
        start = time.perf_counter()
        ro = collector.collect(layout, policy, specs, sampling_key(0, "bench"))
        wall += time.perf_counter() - start
        busy += max(collector.worker_seconds)
        lengths = [episode["length"] for episode in ro.episodes]
        rounds += sum(lengths)
        wave_rounds += sum(max(lengths[i:i + collector.wave]) for i in range(0, len(lengths), collector.wave))
    return {"rounds": rounds, "wave_rounds": wave_rounds, "wall": wall, "rate": rounds / wall, "busy": busy,
            "batches": len(batches) - 1}


def main() -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", type=float, default=0.2, help="seconds the server waits per request")
    parser.add_argument("--num-envs", type=int, default=8, help="envs per worker (one wave)")
    parser.add_argument("--waves", type=int, default=4, help="waves per batch (split between the workers)")
    parser.add_argument("--batches", type=int, default=3, help="timed batches per setting (plus one warm-up)")
    args = parser.parse_args()

    server = LoopbackServer(latency=args.latency, keep_bodies=False)
    cfg = BaseConfig(backend="openai", base_url=[server.url], model="latency", backend_options={"logprobs": False},
                     num_envs=args.num_envs)
    env_fn = make_env_fn(cfg)
    episodes = args.num_envs * args.waves
    batches = [[EpisodeSpec(seed=1000 * b + i, group=i // 4, stream=b * episodes + i) for i in range(episodes)]
               for b in range(args.batches + 1)]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    results: dict[str, dict[str, float]] = {}
    try:
        for workers in (1, 2):
            collector = RayCollector(env_fn, args.num_envs, workers)
            policy = Policy(agent_layout(collector.env))
            server.latency = args.latency
            results[f"{workers} worker{'s' * (workers > 1)}"] = measure(collector, policy, batches)
            server.latency = 0.0
            results[f"{workers} worker{'s' * (workers > 1)}, latency 0"] = measure(collector, policy, batches)
            collector.close()
    finally:
        ray.shutdown()
        server.close()

    one, two = results["1 worker"], results["2 workers"]
    lines = ["| setting | rounds | wall s | rounds / s | worker busy s (slowest, per batch) | Ray overhead s / batch |",
             "|---|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['rounds']} | {r['wall']:.2f} | {r['rate']:.1f} | {r['busy'] / r['batches']:.3f} | "
                     f"{(r['wall'] - r['busy']) / r['batches']:.3f} |")
    free = results["1 worker, latency 0"]
    lines += ["", f"**2 workers / 1 worker: {two['rate'] / one['rate']:.2f}x** rounds/s (target >= 1.8x)",
              f"per-worker overhead (time not waiting on the server, latency 0, 1 worker): "
              f"{1000 * free['busy'] / free['rounds']:.2f} ms per env round, "
              f"{1000 * free['busy'] / free['wave_rounds']:.1f} ms per lockstep round of a wave ({args.num_envs} envs); "
              f"Ray's cost per batch (learner wall - slowest worker): {1000 * (one['wall'] - one['busy']) / one['batches']:.0f} ms"]
    header = (f"Ray rollout workers vs a {1000 * args.latency:.0f} ms-latency loopback server: {args.waves} waves x "
              f"{args.num_envs} envs per batch, 3 agents, 3 rounds, {args.batches} timed batches per setting, "
              f"untrained policy, 2-core machine")
    save_markdown("ray_rollouts", header, "\n".join(lines))


if __name__ == "__main__":
    main()
