"""Sampling on a server while training in-process (``baselines.llm.remote``), against the loopback server with vLLM's
runtime LoRA endpoints (``deliberation_env.testing.lora_server``) over the real SmolLM2-135M (fp32, from the GGUF): the
adapter sync, the server's refusals, the importance weights and one ``train()`` update with ``--generate-url``."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from baselines.llm.config import LLMTrainConfig  # noqa: E402
from baselines.llm.policy import resolve_model  # noqa: E402
from baselines.llm.remote import (  # noqa: E402
    AdapterSync,
    AdapterSyncError,
    ServerSampler,
    tis_advantages,
    tis_weights,
)
from baselines.llm.rollout import sampled_tokens  # noqa: E402
from deliberation_env.backends.base import Message, Request  # noqa: E402
from deliberation_env.testing.lora_server import lora_server  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.server]  # the real SmolLM2 behind a loopback server
MESSAGES = (Message("user", "Name a colour."),)


@pytest.fixture(scope="module")
def team(lora_team):
    return lora_team


@pytest.fixture(scope="module")
def base(team, converted):
    """The server's own copy of the base model (as a vLLM server loads it), read from the converted weights."""
    from deliberation_env.backends.transformers import TransformersBackend

    return TransformersBackend(resolve_model("smollm2"), dtype="float32", converted_cache_dir=converted)


def _greedy(agent: int) -> Request:
    return Request(MESSAGES, "solve", agent, 1, max_tokens=12, temperature=0.0)


def _perturb(team, agent: int) -> None:
    """A change of the agent's adapter big enough to change its greedy output (lora_B starts at zero)."""
    generator = torch.Generator().manual_seed(agent)
    with torch.no_grad():
        for name, parameter in team.backends[0].model.named_parameters():
            if f".agent_{agent}." in name and "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)


def test_synced_adapter_serves_the_trainers_greedy_output(team, base, tmp_path):
    with lora_server(base) as server:
        sync = AdapterSync([server.url], tmp_path / "adapters")
        sync.sync(team, [0, 1])
        sampler = ServerSampler([server.url], 2, team.tokenizer, team.backends[0].eos_ids)
        try:
            before = [c.text for c in sampler.generate([_greedy(0), _greedy(1)])]
            _perturb(team, 1)
            assert [c.text for c in sampler.generate([_greedy(1)])] == before[1:]  # the server has the old adapter
            sync.sync(team, [1])
            served = sampler.generate([_greedy(0), _greedy(1)])
        finally:
            sampler.close()
            sync.close()
        local = [c.text for c in team.samplers[0].generate([_greedy(0), _greedy(1)])]
        assert [c.text for c in served] == local and all(local)
        assert served[1].text != before[1] and served[0].text == before[0]
        # unload then load, agent 1 only after the update; the previous version's folder is gone
        assert [(b.get("lora_name"), "lora_path" in b) for b in server.bodies if "lora_name" in b][-2:] == \
            [("agent_1", False), ("agent_1", True)]
        assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == ["agent_0-00001", "agent_1-00002"]
        chats = [b for b in server.bodies if "messages" in b][-2:]  # the last batch; sent concurrently, any order
        assert sorted(b["model"] for b in chats) == ["agent_0", "agent_1"]
        assert all(b["return_tokens_as_token_ids"] and b["logprobs"] for b in chats)

    # the sampled ids and the server's log-probabilities are the trainer's (same fp32 numerics)
    ids, sampler_log_p, _ = sampled_tokens(served[1], team.backends[0].eos_ids)
    assert team.tokenizer.decode(ids, skip_special_tokens=True) == served[1].text
    with torch.no_grad():
        log_p, _ = team.logprobs(1, [team.encode(_greedy(1))], [ids], [0.0])
    assert torch.allclose(log_p[0], torch.tensor(sampler_log_p), atol=1e-3)
    assert served[1].token_logprobs is None  # not asked for by the request


def test_refusals_name_the_environment_variable_and_flags(base, tmp_path):
    folder = tmp_path / "agent_0-00001"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8}))
    with lora_server(base, runtime_updates=False) as server:
        sync = AdapterSync([server.url], tmp_path)
        with pytest.raises(AdapterSyncError, match="no runtime LoRA endpoints") as error:
            sync.reload(server.url, "agent_0", str(folder))
        assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in str(error.value)
        assert "--enable-lora --max-lora-rank 8" in str(error.value)
    with lora_server(base, enable_lora=False) as server:
        sync = AdapterSync([server.url], tmp_path)
        with pytest.raises(AdapterSyncError, match=r"LoRA is not enabled on the server \(start it with --enable-lora\)"):
            sync.reload(server.url, "agent_0", str(folder))
    with lora_server(base) as server:
        sync = AdapterSync([server.url], tmp_path)
        with pytest.raises(AdapterSyncError, match="cannot read '/elsewhere/agent_0-00001'.*--sync-server-dir"):
            sync.reload(server.url, "agent_0", "/elsewhere/agent_0-00001")
    with pytest.raises(AdapterSyncError, match="cannot reach the server"):
        AdapterSync([server.url], tmp_path).reload(server.url, "agent_0", str(folder))  # stopped


def test_truncated_importance_weights():
    old = torch.tensor([[-1.0, -2.0, -0.5, 0.0]])
    sampler = torch.tensor([[-1.5, -1.0, math.nan, 0.0]])
    weights = tis_weights(old, sampler, cap=1.5)
    assert torch.allclose(weights, torch.tensor([[1.5, math.exp(-1.0), 1.0, 1.0]]))  # capped, below 1, unknown, equal
    assert torch.equal(tis_weights(old, sampler, cap=0.0), torch.ones_like(old))
    advantages = torch.tensor([2.0, -1.0])
    old2 = torch.zeros(2, 3)
    per_token = tis_advantages(advantages, old2, [None, torch.tensor([0.0, math.log(2.0)])], cap=2.0)
    assert torch.allclose(per_token, torch.tensor([[2.0, 2.0, 2.0], [-1.0, -0.5, -1.0]]))
    assert tis_advantages(advantages, old2, [None, None], cap=2.0) is advantages


def test_train_samples_on_the_server_and_syncs_after_each_update(team, base, converted, tmp_path):
    from baselines.llm.train_llm import train

    with lora_server(base) as server:
        cfg = LLMTrainConfig(num_agents=2, group_size=2, problems_per_update=1, updates=1, max_tokens=8,
                             meta_policy="self_consistency", credit="agent", task_options={"levels": 0},
                             env_options={"confidence": "answer_logprobs", "count_tokens": len}, reward_weights={"length": 0.1, "format": 1.0},
                             lr=1e-2, train_agents="1", evaluate=False, progress=False, tensorboard=False,
                             converted_cache_dir=converted, out=str(tmp_path / "run"), generate_url=[server.url])
        train(cfg, team=team)
        chats = [b for b in server.bodies if "messages" in b]
        loads = [b["lora_name"] for b in server.bodies if "lora_path" in b]
        served = server.adapters["agent_1"]
    assert len(chats) == 4 and {b["model"] for b in chats} == {"agent_0", "agent_1"}  # 2 agents x 2 rollouts
    assert all(b["logprobs"] and b["return_tokens_as_token_ids"] for b in chats)
    assert loads == ["agent_0", "agent_1", "agent_1"]  # every agent before the first rollout, the trained one after
    metrics = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["sampler_token_frac"] == 1.0 and metrics["sync_seconds"] > 0
    assert abs(metrics["sampler_logp_gap"]) < 1e-3 and abs(metrics["tis_weight_mean"] - 1.0) < 1e-3  # same numerics
    # the server's last agent_1 is the trained adapter
    from safetensors.torch import load_file

    weights = load_file(f"{served}/adapter_model.safetensors")
    mine = {n.replace(".agent_1", ""): p for n, p in team.backends[0].model.named_parameters() if ".agent_1." in n}
    assert weights.keys() == mine.keys() and all(torch.equal(weights[n], mine[n].detach()) for n in weights)
