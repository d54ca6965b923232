"""The asynchronous OpenAI-compatible client as a fleet sees it: replicas that die, a slow replica, 429s,
episode-sticky routing and bounded concurrency, against real loopback servers (127.0.0.1, started here)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

import deliberation_env
from deliberation_env.backends.base import Message, Request
from deliberation_env.backends.cache import cache_key
from deliberation_env.backends.openai import BackendError, OpenAICompatibleBackend
from deliberation_env.testing.servers import Inflight, LoopbackServer
from deliberation_env.vector import BatchedEnvs


def _echo(body: dict) -> str:
    return body["messages"][-1]["content"]


@pytest.fixture()
def fleet():
    """``fleet(n, **options)``: n LoopbackServers answering with the request's last message (closed after the test)."""
    servers: list[LoopbackServer] = []

    def start(n: int, **options) -> list[LoopbackServer]:
        options.setdefault("reply", _echo)
        servers.extend(LoopbackServer(**options) for _ in range(n))
        return servers[-n:]

    yield start
    for server in servers:
        server.close()


def _requests(episodes: int, per_episode: int = 3, round_: int = 0) -> list[Request]:
    return [Request((Message("system", f"Problem {e}: what is {e} + {e}?"), Message("user", f"ep{e} r{round_} a{a}")),
                    "solve", a, 1000 * e + a, max_tokens=8, temperature=0.7, episode=e)
            for e in range(episodes) for a in range(per_episode)]


def _answered_once(servers: list[LoopbackServer], count: int) -> None:
    """Every request answered by exactly one server, exactly once (the X-Request-Id counts, over the fleet)."""
    ids = [i for server in servers for i, n in server.answered.items() for _ in range(n)]
    assert len(ids) == len(set(ids)) == count


def test_a_replica_dies_mid_batch_its_requests_fail_over(fleet):
    servers = fleet(3, latency=0.3)
    backend = OpenAICompatibleBackend([s.url for s in servers], model="m", concurrency=64, backoff=0.01, cooldown=0.5)
    requests = _requests(20)

    def kill_when_busy():  # dies with requests in flight (each is answered only after 0.3 s)
        give_up = time.monotonic() + 5
        while servers[0].inflight.now < 3 and time.monotonic() < give_up:
            time.sleep(0.005)
        servers[0].die()

    killer = threading.Thread(target=kill_when_busy, daemon=True)
    killer.start()
    completions = backend.generate(requests)
    killer.join()
    assert [c.text for c in completions] == [r.messages[-1].content for r in requests]  # one each, in order
    assert servers[0].posts > 0 and not servers[0].answered and backend.failovers > 0
    _answered_once(servers, len(requests))
    # It comes back: once its cooldown is over its episodes return to it (rendezvous order), the others stay.
    servers[0].revive()
    time.sleep(0.6)
    before = {id(s): set(s.episodes) for s in servers}
    backend.generate(_requests(20, round_=1))
    back = set(servers[0].episodes) - before[id(servers[0])]
    assert back and all(not (set(s.episodes) - before[id(s)]) & back for s in servers[1:])
    backend.close()


def test_a_slow_replica_others_keep_working_and_the_deadline_bounds_it(fleet):
    slow, fast = fleet(1, latency=30.0) + fleet(1, latency=0.05)
    # timeout: a replica slower than that is set aside and its requests fail over
    backend = OpenAICompatibleBackend([slow.url, fast.url], model="m", concurrency=32, timeout=0.5, backoff=0.01)
    requests = _requests(10)
    start = time.monotonic()
    assert [c.text for c in backend.generate(requests)] == [r.messages[-1].content for r in requests]
    assert time.monotonic() - start < 3.0 and slow.posts > 0 and len(fast.answered) == len(requests)
    backend.close()
    # deadline: a request is bounded as a whole even when each read would wait longer; the others are kept
    backend = OpenAICompatibleBackend([slow.url, fast.url], model="m", concurrency=32, timeout=60, deadline=1.0)
    start = time.monotonic()
    with pytest.raises(BackendError, match="deadline=1") as error:
        backend.generate(requests)
    assert time.monotonic() - start < 2.5
    answered = error.value.completed
    assert 0 < len(answered) < len(requests)
    assert all(c.text == requests[i].messages[-1].content for i, c in answered.items())
    backend.close()


def test_429_retry_after_is_honoured_without_duplicates(fleet):
    (server,) = fleet(1)
    server.inject(429, count=5, retry_after=0.6)
    backend = OpenAICompatibleBackend(server.url, model="m", concurrency=8, backoff=0.01)
    requests = _requests(5, per_episode=1)
    start = time.monotonic()
    assert [c.text for c in backend.generate(requests)] == [r.messages[-1].content for r in requests]
    assert time.monotonic() - start >= 0.6  # not the 10 ms backoff
    assert server.posts == 10 and backend.retries == 5
    _answered_once([server], 5)
    backend.close()
    # With another replica, a 429 sends the episode there at once instead of waiting out the Retry-After.
    busy, free = fleet(2)
    busy.inject(429, count=100, retry_after=30)
    backend = OpenAICompatibleBackend([busy.url, free.url], model="m", backoff=0.01)
    start = time.monotonic()
    assert len(backend.generate(_requests(10))) == 30 and time.monotonic() - start < 2.0
    _answered_once([busy, free], 30)
    with pytest.raises(BackendError, match="asked to retry after 30"):  # one replica: the deadline cannot wait it out
        OpenAICompatibleBackend(busy.url, model="m", deadline=5, backoff=0.01).generate(_requests(1, 1))
    backend.close()


@pytest.mark.parametrize("routing", ["sticky", "least_busy"])
def test_sticky_routing_keeps_each_episode_on_one_replica(fleet, routing):
    servers = fleet(3, latency=0.02)
    backend = OpenAICompatibleBackend([s.url for s in servers], model="m", concurrency=16, routing=routing)
    for round_ in range(3):  # three calls, as the rounds of an episode
        backend.generate(_requests(30, round_=round_))
    homes = [set(s.episodes) for s in servers]
    on_several = sum(sum(str(e) in h for h in homes) > 1 for e in range(30))
    if routing == "sticky":
        assert on_several == 0 and all(homes)  # one replica each, and every replica has some
        reused, sent = (sum(s.prefix_totals()[i] for s in servers) for i in (1, 0))
        assert reused > 0.5 * sent  # after the first request, an episode's prompts share the problem text
    else:
        assert on_several > 0  # least-busy scatters episodes (what sticky routing is for)
    backend.close()


def test_concurrency_is_bounded_per_replica_and_in_total(fleet):
    # 40 episodes of one request, spread over both replicas: the total bound is the one reached
    total = Inflight()
    servers = fleet(2, latency=0.15, total=total)
    backend = OpenAICompatibleBackend([s.url for s in servers], model="m", concurrency=6, per_replica=4)
    assert len(backend.generate(_requests(40, per_episode=1))) == 40
    assert total.peak == 6 and max(s.inflight.peak for s in servers) <= 4
    backend.close()
    # one episode of 20 requests, all on its replica: the per-replica bound is the one reached
    total = Inflight()
    servers = fleet(2, latency=0.15, total=total)
    backend = OpenAICompatibleBackend([s.url for s in servers], model="m", concurrency=6, per_replica=4)
    assert len(backend.generate(_requests(1, per_episode=20))) == 20
    assert total.peak == 4 and sorted(s.inflight.peak for s in servers) == [0, 4]
    backend.close()
    with pytest.raises(ValueError, match="per_replica"):
        OpenAICompatibleBackend(servers[0].url, model="m", per_replica=0)
    with pytest.raises(ValueError, match="routing"):
        OpenAICompatibleBackend(servers[0].url, model="m", routing="random")


def test_agenerate_from_the_callers_event_loop(fleet):
    (server,) = fleet(1, latency=1.0)
    backend = OpenAICompatibleBackend(server.url, model="m", concurrency=64)

    async def main():
        return await asyncio.gather(*(backend.agenerate(_requests(5, round_=k)) for k in range(4)))

    start = time.monotonic()
    batches = asyncio.run(main())
    # The four batches overlap: one after another they take 4 s. (With 0.4 s of latency and a 1.2 s bound, a
    # loaded 2-core machine once took 1.4 s.)
    assert time.monotonic() - start < 2.5
    assert [c.text for c in batches[3]] == [r.messages[-1].content for r in _requests(5, round_=3)]
    backend.close()


def _seeded(body: dict) -> str:
    seed = body["seed"]
    return f"The answer is {seed % 4 + 2}. Confidence: {seed % 90 + 5}%"


def test_routing_and_concurrency_do_not_change_episodes(fleet):
    """The same completions give the same episodes, whatever the replicas, routing and concurrency."""
    servers = fleet(3, reply=_seeded, latency=0.01)
    runs = []
    for urls, concurrency in (([servers[0].url], 1), ([s.url for s in servers], 64)):
        backend = OpenAICompatibleBackend(urls, model="m", concurrency=concurrency, logprobs=False)
        envs = [deliberation_env.parallel_env(task="arithmetic", backend=backend, max_rounds=2) for _ in range(6)]
        batch = BatchedEnvs(envs)
        resets = batch.reset(seeds=list(range(6)))
        steps = batch.step([{agent: (i + k) % 3 for k, agent in enumerate(env.agents)} for i, env in enumerate(envs)])
        runs.append(repr([(sorted(o.items()), sorted(r.items())) for (o, _), (_, r, *_) in zip(resets, steps)]))
        backend.close()
    assert runs[0] == runs[1]
    request = _requests(1, 1)[0]
    assert cache_key("m", request) == cache_key("m", replace(request, episode=12345))  # not in the cache key
    assert request == replace(request, episode=None)


EXIT_SCRIPT = """
import json
from deliberation_env.backends.openai import OpenAICompatibleBackend
from deliberation_env.testing.servers import LoopbackServer
import deliberation_env

server = LoopbackServer()
backend = OpenAICompatibleBackend(server.url, "m")
deliberation_env.parallel_env(backend=backend).reset(seed=0)   # a clean run: its event loop is running
json.kept = backend   # dropped only when json's module is torn down at interpreter exit, after asyncio's
half = OpenAICompatibleBackend.__new__(OpenAICompatibleBackend)   # an object whose __init__ never ran
try:
    OpenAICompatibleBackend("ftp://nowhere", "m")   # one whose __init__ failed
except ValueError:
    pass
print("ran")
"""


def test_a_backend_left_open_exits_without_a_traceback():
    """A backend never closed, still referenced at interpreter exit (when asyncio's modules are already torn down),
    a half-constructed one and one whose ``__init__`` failed: the process exits cleanly, nothing on stderr."""
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ran", done.stderr
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr
