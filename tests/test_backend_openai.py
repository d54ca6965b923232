"""OpenAICompatibleBackend against a real llama.cpp server and a real misbehaving local server."""

from __future__ import annotations

import json
import time

import pytest

import deliberation_env
from deliberation_env.backends.base import Message, Request
from deliberation_env.backends.openai import BackendError, OpenAICompatibleBackend
from deliberation_env.testing.llama_server import free_port, llama_server
from deliberation_env.testing.servers import LoopbackServer, send_json

OK = {"choices": [{"message": {"role": "assistant", "content": "The answer is 4"}, "finish_reason": "stop"}],
      "usage": {"prompt_tokens": 5, "completion_tokens": 4}}




def _request(**kw) -> Request:
    return Request((Message("user", "Is 2 + 2 = 4? Reply Yes or No."),), "critic", 0, 7, max_tokens=8, temperature=0.0, **kw)


def test_real_episode_failover_and_logprobs(llama_url):
    dead = f"http://127.0.0.1:{free_port()}/v1"
    backend = OpenAICompatibleBackend([dead, llama_url], model="smol", backoff=0.01)
    env = deliberation_env.parallel_env(task="arithmetic", backend=backend, split="test", max_rounds=1, max_tokens=24, critic_max_tokens=8)
    observations, infos = env.reset(seed=0)
    observations, _, _, _, infos = env.step({agent: 1 for agent in env.agents})
    assert all(env.observation_space(a).contains(o) for a, o in observations.items())
    assert {info["confidence_source"] for info in infos.values()} == {"logprobs"}
    assert backend.generate([_request(logprobs=True)])[0].top_logprobs


def test_answer_logprobs_on_a_real_server_make_no_critic_call(llama_url):
    backend = OpenAICompatibleBackend(llama_url, model="smol")
    env = deliberation_env.parallel_env(task="arithmetic", backend=backend, split="test", max_rounds=1, max_tokens=24,
                                        confidence="answer_logprobs")
    requests = []
    generate = backend.generate
    backend.generate = lambda batch: requests.extend(batch) or generate(batch)
    _, infos = env.reset(seed=0)
    assert {r.kind for r in requests} == {"solve"} and all(r.token_logprobs for r in requests)
    answered = [info for info in infos.values() if info["answer"] is not None]
    # llama-cpp-python sends no log-probabilities unless top_logprobs is named: the source would be "default"
    assert answered and all(info["confidence_source"] == "answer_logprobs" for info in answered)
    assert all(0.0 < info["confidence"] <= 1.0 for info in answered)


def test_server_stopped_mid_episode_names_url(llama_threads):
    pytest.importorskip("llama_cpp.server")
    from deliberation_env.backends.models import smollm2_gguf_path

    with llama_server(smollm2_gguf_path(), threads=llama_threads, n_ctx=2048, logits_all=True) as url:
        backend = OpenAICompatibleBackend(url, model="smol", max_retries=1, backoff=0.01)
        env = deliberation_env.parallel_env(task="arithmetic", backend=backend, max_rounds=2, max_tokens=16,
                                            critic_max_tokens=8)
        env.reset(seed=1)
    with pytest.raises(BackendError, match=url.removesuffix("/v1")):  # the server is stopped when the block ends
        env.step({agent: 1 for agent in env.agents})


@pytest.fixture()
def faulty():
    """A LoopbackServer that plays ``script`` (status and body, "close" or "stall"), then answers OK."""
    script: list = []

    def respond(handler, server):
        status, body = script.pop(0) if script else (200, json.dumps(OK))
        if status == "close":
            handler.close_connection = True
            return
        if status == "stall":
            time.sleep(1.5)
            status, body = 200, json.dumps(OK)
        send_json(handler, status, body)

    server = LoopbackServer(respond)
    yield server.url, script
    server.close()


@pytest.mark.parametrize("fault", [(500, "oops"), (429, "slow down"), (200, "{not json"), "close", "stall"])
def test_transient_faults_are_retried(faulty, fault):
    url, script = faulty
    script.append(fault if isinstance(fault, tuple) else (fault, ""))
    backend = OpenAICompatibleBackend(url, model="m", backoff=0.01, timeout=0.5)
    assert backend.generate([_request()])[0].text == "The answer is 4"
    assert backend.retries == 1


def test_wrong_model_and_empty_completion(faulty, monkeypatch):
    url, script = faulty
    monkeypatch.setenv("TEST_KEY", "sk-secret-123")
    script.append((404, '{"error": "model nope not found, key sk-secret-123"}'))
    backend = OpenAICompatibleBackend(url, model="nope", api_key_env="TEST_KEY")
    with pytest.raises(BackendError) as error:
        backend.generate([_request()])
    assert "404" in str(error.value) and url in str(error.value) and "sk-secret-123" not in str(error.value)
    assert "sk-secret" not in repr(backend) + backend.identity()
    script.append((200, json.dumps({"choices": [{"message": {"content": ""}}]})))
    empty = backend.generate([_request()])[0]
    assert empty.text == "" and empty.completion_tokens == 0


def test_a_real_server_without_logprobs_fails_at_once_and_critic_text_works(tmp_path, llama_threads):
    pytest.importorskip("llama_cpp.server", reason="llama-cpp-python[server] is not installed: bash scripts/setup-tests.sh")
    import time

    from deliberation_env.backends.models import smollm2_gguf_path

    with pytest.raises(FileNotFoundError, match="does not exist"), llama_server(tmp_path / "missing.gguf"):
        pass
    with llama_server(smollm2_gguf_path(), threads=llama_threads, n_ctx=2048, logits_all=False) as url:
        backend = OpenAICompatibleBackend(url, model="smol", backoff=0.5)
        start = time.monotonic()
        with pytest.raises(BackendError, match="logits_all.*critic_text"):
            backend.generate([_request(logprobs=True)])
        assert time.monotonic() - start < 20 and backend.retries == 0  # no retries of a request that cannot succeed
        env = deliberation_env.parallel_env(task="arithmetic", backend=backend, max_rounds=1, max_tokens=16,
                                            critic_max_tokens=8, confidence="critic_text")
        observations, infos = env.reset(seed=0)
        assert {info["confidence_source"] for info in infos.values()} <= {"verbalized", "verdict", "default"}
