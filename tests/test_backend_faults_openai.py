"""OpenAICompatibleBackend against real misbehaving local servers (127.0.0.1, started by each test).

Dripping servers (a byte every 0.2 or 0.5 s, in the headers or the body), servers that cannot return
log-probabilities, and replies that are JSON but not sane chat completions.
"""

from __future__ import annotations

import json
import math
import time

import pytest

import deliberation_env
from deliberation_env.backends.base import Message, Request
from deliberation_env.backends.openai import DEADLINE_FACTOR, BackendError, OpenAICompatibleBackend
from deliberation_env.testing.servers import LoopbackServer, send_json

LLAMA_CPP_NO_LOGPROBS = json.dumps({"error": {
    "message": "logprobs is not supported for models created with logits_all=False",
    "type": "internal_server_error", "param": None, "code": None}})  # llama-cpp-python 0.3, --logits_all false


def _reply(content="The answer is 4", usage=None, logprobs=None, finish="stop") -> dict:
    choice = {"message": {"role": "assistant", "content": content}, "finish_reason": finish, "logprobs": logprobs}
    return {"choices": [choice], "usage": {"prompt_tokens": 5, "completion_tokens": 4} if usage is None else usage}


@pytest.fixture()
def serve():
    """``serve(respond)``: a LoopbackServer whose every POST is answered by ``respond(handler, server)``."""
    servers: list[LoopbackServer] = []

    def start(respond) -> LoopbackServer:
        servers.append(LoopbackServer(respond))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _json(status: int, payload):
    return lambda handler, server: send_json(handler, status, payload)


def _drip(where: str, every: float = 0.2):
    """Sends a byte every ``every`` s forever (until the client leaves), in the status line or in the body."""
    def respond(handler, server):
        try:
            if where == "body":
                handler.send_response(200)
                handler.send_header("content-length", "1000000")
                handler.end_headers()
                handler.wfile.flush()
            chunk = b"H" if where == "headers" else b" "
            while not server.stopped.wait(every):
                handler.wfile.write(chunk)
                handler.wfile.flush()
        except OSError:
            pass  # the client gave up: what the test wants
    return respond


def _request(logprobs: bool = False, content: str = "Is 2 + 2 = 4?") -> Request:
    return Request((Message("user", content),), "critic", 0, 7, max_tokens=8, temperature=0.0, logprobs=logprobs)


@pytest.mark.parametrize("where", ["headers", "body"])
def test_dripping_server_ends_at_the_deadline(serve, where):
    server = serve(_drip(where))
    backend = OpenAICompatibleBackend(server.url, model="m", timeout=1.0, deadline=1.5, backoff=0.01)
    start = time.monotonic()
    with pytest.raises(BackendError) as error:
        backend.generate([_request()])
    elapsed = time.monotonic() - start
    assert 1.4 < elapsed < 3.0  # the deadline, not 5 attempts x a never-tripping read timeout
    message = str(error.value)
    assert server.url in message and "deadline=1.5" in message and "raise deadline=" in message
    backend.close()


def test_dripping_server_ends_at_the_default_deadline_a_multiple_of_timeout(serve):
    # A byte every 0.5 s never trips timeout=1; the deadline nobody set is DEADLINE_FACTOR x timeout (5 s), not 600 s.
    server = serve(_drip("body", every=0.5))
    backend = OpenAICompatibleBackend(server.url, model="m", timeout=1.0, backoff=0.01)
    assert backend.deadline == DEADLINE_FACTOR * 1.0 == 5.0
    start = time.monotonic()
    with pytest.raises(BackendError) as error:
        backend.generate([_request()])
    elapsed = time.monotonic() - start
    assert 4.5 < elapsed < 5.0 + 2.5, elapsed  # bounded by 5 x timeout, far from the old 600 s
    message = str(error.value)
    assert "\n" not in message and server.url in message
    assert "deadline=5 s (the default: 5 x timeout=1 s)" in message and "deadline=SECONDS" in message
    backend.close()


def test_default_deadline_follows_timeout_and_an_explicit_one_wins():
    url = "http://127.0.0.1:1/v1"
    assert OpenAICompatibleBackend(url, model="m").deadline == 600.0  # 5 x the default timeout=120
    assert OpenAICompatibleBackend(url, model="m", timeout=30).deadline == 150.0
    assert OpenAICompatibleBackend(url, model="m", timeout=30, deadline=1800).deadline == 1800.0
    assert OpenAICompatibleBackend(url, model="m", timeout=30, deadline=None).deadline == 150.0
    for bad in (0, -1, float("nan"), True, "600"):
        with pytest.raises(ValueError, match=r"deadline must be a positive number of seconds.*or None: 5 x timeout"):
            OpenAICompatibleBackend(url, model="m", deadline=bad)


def test_deadline_fails_over_to_a_healthy_replica_next_time(serve):
    slow, healthy = serve(_drip("body")), serve(_json(200, _reply()))
    backend = OpenAICompatibleBackend([slow.url, healthy.url], model="m", timeout=1.0, deadline=1.0, backoff=0.01)
    answers = []
    for _ in range(2):  # whichever replica the first request meets, the dripping one is set aside afterwards
        try:
            answers.append(backend.generate([_request()])[0].text)
        except BackendError as error:
            assert slow.url in str(error)
    assert backend.generate([_request()])[0].text == "The answer is 4"
    backend.close()


def test_server_without_logprobs_fails_at_once_naming_the_fix(serve):
    server = serve(_json(500, LLAMA_CPP_NO_LOGPROBS))
    backend = OpenAICompatibleBackend(server.url, model="m", backoff=1.0)
    start = time.monotonic()
    with pytest.raises(BackendError) as error:
        backend.generate([_request(logprobs=True)])
    assert time.monotonic() - start < 1.0 and len(server.bodies) == 1 and backend.retries == 0
    message = str(error.value)
    assert "\n" not in message and server.url in message and "logits_all=False" in message
    assert "--logits_all true" in message and "confidence='critic_text'" in message and "logprobs=False" in message


def test_logprobs_false_never_asks_and_the_episode_runs(serve):
    def respond(handler, server):
        asked = "logprobs" in server.bodies[-1]
        _json(500, LLAMA_CPP_NO_LOGPROBS)(handler, server) if asked else _json(200, _reply("Yes. Confidence: 80%"))(
            handler, server)

    server = serve(respond)
    backend = OpenAICompatibleBackend(server.url, model="m", logprobs=False)
    assert backend.identity() != OpenAICompatibleBackend(server.url, model="m").identity()  # not one cache entry
    env = deliberation_env.parallel_env(task="arithmetic", backend=backend, max_rounds=1)
    _, infos = env.reset(seed=0)
    assert {info["confidence_source"] for info in infos.values()} == {"verbalized"}
    assert not any("logprobs" in body for body in server.bodies)
    backend.close()


def test_a_500_about_something_else_is_still_retried(serve):
    server = serve(_json(500, {"error": "out of memory"}))
    backend = OpenAICompatibleBackend(server.url, model="m", max_retries=1, backoff=0.01)
    with pytest.raises(BackendError, match="after 2 attempts"):
        backend.generate([_request(logprobs=True)])
    assert len(server.bodies) == 2


BAD_LOGPROBS = [
    "not a dict", {"content": "abc"}, {"content": [5]}, {"content": [{"top_logprobs": 5}]},
    {"content": [{"top_logprobs": [{"token": 1, "logprob": -0.1}, {"token": "Yes", "logprob": "high"}]}]},
    {"content": [{"top_logprobs": [{"token": "Yes", "logprob": True}, {"token": "No", "logprob": 1e308}]}]},
    {"content": [{"top_logprobs": [{"token": "Yes", "logprob": 10**400}, {"token": "No", "logprob": None}]}]},
    {"top_logprobs": [[1, 2]]}, {"top_logprobs": [{"Yes": "x"}]}, {"top_logprobs": "Yes"},
]


@pytest.mark.parametrize("logprobs", BAD_LOGPROBS, ids=range(len(BAD_LOGPROBS)))
def test_unusable_logprobs_become_none(serve, logprobs):
    server = serve(_json(200, _reply("Yes", logprobs=logprobs)))
    completion = OpenAICompatibleBackend(server.url, model="m").generate([_request(logprobs=True)])[0]
    assert completion.text == "Yes" and completion.top_logprobs is None


def test_logprob_entries_are_filtered_and_merged_stably(serve):
    items = [{"token": "Yes", "logprob": -1000.0}, {"token": "Yes", "logprob": -1000.0},  # exp() underflows to 0
             {"token": "No", "logprob": float("nan")}, {"token": "No", "logprob": float("-inf")},
             {"token": "Maybe", "logprob": 1e-9}, {"token": "Later", "logprob": 0.5}]
    payload = json.dumps(_reply("Yes", logprobs={"content": [{"top_logprobs": items}]}))  # NaN/-Infinity literals
    server = serve(_json(200, payload))
    top = OpenAICompatibleBackend(server.url, model="m").generate([_request(logprobs=True)])[0].top_logprobs
    assert top is not None and set(top) == {"Yes", "Maybe"} and top["Maybe"] == 0.0
    assert math.isclose(top["Yes"], -1000.0 + math.log(2))


BAD_USAGE = [{"prompt_tokens": -5, "completion_tokens": -3}, {"prompt_tokens": "5", "completion_tokens": "x"},
             {"prompt_tokens": True, "completion_tokens": False}, {"prompt_tokens": 1e400, "completion_tokens": 10**30},
             "many", [1, 2], {"prompt_tokens": None, "completion_tokens": float("nan")}]


@pytest.mark.parametrize("usage", BAD_USAGE, ids=range(len(BAD_USAGE)))
def test_unusable_usage_is_estimated_from_the_text(serve, usage):
    server = serve(_json(200, json.dumps(_reply("x" * 40, usage=usage))))
    completion = OpenAICompatibleBackend(server.url, model="m").generate([_request()])[0]
    assert type(completion.prompt_tokens) is int and type(completion.completion_tokens) is int
    assert completion.prompt_tokens == 4 and completion.completion_tokens == 10  # ~4 characters a token


def test_float_usage_counts_become_ints(serve):
    server = serve(_json(200, _reply(usage={"prompt_tokens": 12.0, "completion_tokens": 3.0})))
    completion = OpenAICompatibleBackend(server.url, model="m").generate([_request()])[0]
    assert (completion.prompt_tokens, completion.completion_tokens) == (12, 3)
    assert type(completion.prompt_tokens) is int and type(completion.completion_tokens) is int


@pytest.mark.parametrize("content", [42, {"text": "hi"}, ["a", "b"], [{"type": "image"}]])
def test_content_that_is_not_text_is_a_backend_error(serve, content):
    server = serve(_json(200, _reply(content)))
    backend = OpenAICompatibleBackend(server.url, model="m", max_retries=1, backoff=0.01)
    with pytest.raises(BackendError) as error:
        backend.generate([_request()])
    assert server.url in str(error.value) and "message content is a" in str(error.value)


def test_text_parts_and_other_malformed_shapes(serve):
    parts = serve(_json(200, _reply([{"type": "text", "text": "The answer "}, {"type": "text", "text": "is 4"}])))
    assert OpenAICompatibleBackend(parts.url, model="m").generate([_request()])[0].text == "The answer is 4"
    for payload in ({"choices": "none"}, {"choices": [{"message": "hi"}]}, [1, 2], "[" * 100_000 + "]" * 100_000):
        server = serve(_json(200, payload))
        with pytest.raises(BackendError, match="malformed response"):
            OpenAICompatibleBackend(server.url, model="m", max_retries=0).generate([_request()])


def test_prompt_with_lone_surrogates_is_sent(serve):
    server = serve(_json(200, _reply("fine")))
    backend = OpenAICompatibleBackend(server.url, model="m")
    assert backend.generate([_request(content="peer wrote \ud800 here")])[0].text == "fine"
    assert server.bodies[0]["messages"][0]["content"] == "peer wrote \ufffd\ufffd\ufffd here"


def test_bad_options_are_refused_clearly():
    with pytest.raises(ValueError, match="http://"):
        OpenAICompatibleBackend("localhost:8000/v1", model="m")
    with pytest.raises(ValueError, match="deadline"):
        OpenAICompatibleBackend("http://127.0.0.1:1/v1", model="m", deadline=0)



def test_every_token_logprobs_when_asked(serve):
    tokens = [{"token": "The", "logprob": -0.1, "top_logprobs": []}, {"token": " answer", "logprob": -0.25},
              {"token": " is 4", "logprob": 0.0}]
    good = serve(_json(200, _reply("The answer is 4", logprobs={"content": tokens})))
    request = Request((Message("user", "2 + 2?"),), "solve", 0, 1, 64, 0.7, token_logprobs=True)
    completion = OpenAICompatibleBackend(good.url, model="m").generate([request])[0]
    assert completion.token_logprobs == (("The", -0.1), (" answer", -0.25), (" is 4", 0.0))
    assert completion.top_logprobs is None
    assert good.bodies[0]["logprobs"] is True and good.bodies[0]["top_logprobs"] == 1  # llama.cpp needs it >= 1
    gap = serve(_json(200, _reply("The answer", logprobs={"content": [tokens[0], {"token": " answer", "logprob": "x"}]})))
    assert OpenAICompatibleBackend(gap.url, model="m").generate([request])[0].token_logprobs is None


def test_a_failed_batch_keeps_its_answered_requests_in_the_cache(serve, tmp_path):
    from deliberation_env.backends.cache import CachedBackend

    def respond(handler, server):
        failing = "FAIL" in server.bodies[-1]["messages"][-1]["content"]
        _json(400, {"error": "bad request"})(handler, server) if failing else _json(200, _reply())(handler, server)

    server = serve(respond)
    cache = CachedBackend(OpenAICompatibleBackend(server.url, model="m", backoff=0.01), tmp_path / "cache.sqlite")
    good = [_request(content=f"Is {n} + {n} = {2 * n}?") for n in range(4)]
    with pytest.raises(BackendError) as error:
        cache.generate([*good[:2], _request(content="FAIL"), *good[2:]])
    assert sorted(error.value.completed) == [0, 1, 3, 4]  # positions in the failed batch
    posts = len(server.bodies)
    assert [c.text for c in cache.generate(good)] == ["The answer is 4"] * 4
    assert len(server.bodies) == posts and cache.stats.hits == 4  # nothing generated twice
    cache.close()
