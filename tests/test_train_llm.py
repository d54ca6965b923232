"""baselines.llm.train_llm on the real SmolLM2-135M (fp32 from the GGUF, loaded once for the module): LoRA updates,
SoftRankPO's scale invariance, checkpoints that TransformersBackend reloads, the CLI end to end and its errors."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from baselines.llm.config import LLMTrainConfig, make_text_env  # noqa: E402
from baselines.llm.policy import team_backends  # noqa: E402
from baselines.llm.rollout import advantages, collect  # noqa: E402
from baselines.llm.train_llm import make_optimizer, policy_update  # noqa: E402
from deliberation_env.backends.base import Message, Request  # noqa: E402

# Tiny episodes: round 0 only (self_consistency: a tree of one node), no critic turns, 8 tokens; on problem seed 3
# the sampled completions get distinct returns (whether an answer can be read differs). The completions are handed
# to the env with their token counts, so count_tokens=len only counts the prompts.
CONFIG = LLMTrainConfig(num_agents=2, group_size=3, max_tokens=8, meta_policy="self_consistency", credit="agent",
                        task_options={"levels": 0}, env_options={"confidence": "answer_logprobs", "count_tokens": len},
                        reward_weights={"length": 0.1, "format": 1.0}, lr=1e-3, train_agents="0", micro_batch=4)


@pytest.fixture(scope="module")
def team(lora_team):
    return lora_team


@pytest.fixture(scope="module")
def batch(team):
    with torch.inference_mode():
        return collect([make_text_env(CONFIG)], team, [3], 0, CONFIG.agents_trained(), CONFIG)


def _adapter(team, agent):
    return {n: p.detach().clone() for n, p in team.backends[0].model.named_parameters() if f".agent_{agent}." in n}


def test_lora_updates_lower_the_loss_and_change_only_the_trained_adapter(team, batch):
    samples, tree = batch
    assert {s.agent for s in samples} == {0} and len(samples) == CONFIG.group_size  # agent 1 is frozen
    _, adv, _ = advantages(samples, tree, CONFIG)
    assert np.abs(adv).max() > 0 and abs(adv.sum()) < 1e-9  # distinct returns, centred within the group
    samples = copy.deepcopy(samples)
    before = [_adapter(team, a) for a in (0, 1)]
    optimizer = make_optimizer(team, CONFIG)
    assert [g["lr"] for g in optimizer.param_groups] == [1e-3, 1e-3]  # one group (learning rate) per agent
    loss0 = policy_update(team, optimizer, samples, adv, CONFIG, step=False)["loss"]
    for _ in range(3):
        policy_update(team, optimizer, samples, adv, CONFIG)
    loss = policy_update(team, optimizer, samples, adv, CONFIG, step=False)["loss"]
    assert loss < loss0 - 1e-4, (loss0, loss)
    after = [_adapter(team, a) for a in (0, 1)]
    assert any(not torch.equal(before[0][n], after[0][n]) for n in before[0])
    assert all(torch.equal(before[1][n], after[1][n]) for n in before[1])


def test_softrankpo_updates_are_bit_identical_under_reward_scale(team, batch):
    samples, tree = batch
    start = _adapter(team, 0)

    def update(algo: str, scale: float) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            for name, parameter in team.backends[0].model.named_parameters():
                if name in start:
                    parameter.copy_(start[name])
        cfg = replace(CONFIG, algo=algo, reward_scale=scale)
        rows = copy.deepcopy(samples)
        policy_update(team, make_optimizer(team, cfg), rows, advantages(rows, tree, cfg)[1], cfg)
        return _adapter(team, 0)

    reference = update("softrankpo", 1.0)
    assert any(not torch.equal(reference[n], start[n]) for n in start)
    for scale in (0.1, 10.0):
        scaled = update("softrankpo", scale)
        assert all(torch.equal(reference[n], scaled[n]) for n in reference), scale
    # MAGRPO's advantages scale with the rewards, so its update does change (the comparison can fail)
    plain, tenfold = update("magrpo", 1.0), update("magrpo", 10.0)
    assert any(not torch.equal(plain[n], tenfold[n]) for n in plain)


def test_checkpoints_reload_in_transformers_backend_and_generate(team, batch, tmp_path):
    samples, tree = copy.deepcopy(batch)
    policy_update(team, make_optimizer(team, CONFIG), samples, advantages(samples, tree, CONFIG)[1], CONFIG)
    request = Request((Message("user", "What is 2 + 3?"),), "solve", 0, 1, max_tokens=6, temperature=0.0)
    expected = [team.samplers[a].generate([Request(request.messages, "solve", a, 1, 6, 0.0)])[0].text for a in (0, 1)]
    for merged in (False, True):
        folder = tmp_path / ("merged" if merged else "adapters")
        agents = team.save(str(folder), merged=merged)
        assert json.loads((folder / "team.json").read_text())["agents"] == agents
        backends = team_backends(str(folder), dtype="float32")
        assert len(backends) == 2 and backends[0] is not backends[1]
        texts = [backends[a].generate([Request(request.messages, "solve", a, 1, 6, 0.0)])[0].text for a in (0, 1)]
        assert texts == expected and all(texts)
        # the trained agent's weights differ from the frozen agent's (which are the base's)
        weights = [dict(b.model.named_parameters())["model.layers.0.self_attn.q_proj.weight"] for b in backends]
        assert not torch.equal(weights[0], weights[1])


def test_cli_trains_saves_and_evaluates_before_and_after(converted, tmp_path, monkeypatch):
    from baselines.llm import train_llm

    monkeypatch.chdir(tmp_path)
    train_llm.main(["--algo", "grpo", "--weights", "shared", "--num-agents", "2", "--group-size", "2", "--updates", "2",
                    "--max-tokens", "8", "--meta-policy", "self_consistency", "--task-option", "levels=0",
                    "--env-option", "confidence=answer_logprobs", "--reward-weight", "length=0.1", "--kl-coef", "0.1",
                    "--eval-problems", "1", "--converted-cache-dir", converted, "--no-progress", "--no-tensorboard",
                    "--alternate", "1", "--out", "run"])
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["trained_agents"] for r in rows] == ["0", "1"]  # alternation
    assert all("reward_length" in r and "reward_correct" in r and "loss" in r for r in rows)
    assert (tmp_path / "run" / "reward_curves.png").stat().st_size > 0
    table = (tmp_path / "run" / "eval" / "before_after.md").read_text()
    assert "| before |" in table and "| after |" in table and "Wilson" in table
    assert json.loads((tmp_path / "run" / "checkpoint" / "team.json").read_text())["agents"] == \
        {"agent_0": "model", "agent_1": "model"}


@pytest.mark.parametrize(("args", "expected"), [
    (["--model", "no-such-model"], "unknown model 'no-such-model'"),
    (["--num-agents", "2", "--train-agents", "0,2"], "agent index 2 out of range in --train-agents 0,2: the team has agents 0..1"),
    (["--num-agents", "3", "--group-size", "8"], "a rollout tree would hold 4681 states per problem (4096 leaves after 4 turns"),
])
def test_cli_mistakes_are_one_line(tmp_path, args, expected):
    done = subprocess.run([sys.executable, "-m", "baselines.llm.train_llm", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith("python -m baselines.llm.train_llm: error: ") and expected in lines[0], lines[0]
    assert not list(tmp_path.iterdir())


def test_log_probabilities_of_a_padded_batch_match_one_sequence_at_a_time(team):
    tokenizer = team.tokenizer
    prompts = [tokenizer(text)["input_ids"] for text in ("What is 2 + 2?", "Compute 7 times 8, and say why please.")]
    completions = [tokenizer(text)["input_ids"] for text in (" It is 4.", " The answer is 56: seven eights are 56.")]
    temperatures = [0.7, 1.0]
    with torch.no_grad():
        log_p, mask = team.logprobs(0, prompts, completions, temperatures)
        for row, (prompt, completion, temperature) in enumerate(zip(prompts, completions, temperatures)):
            logits = team.model(0)(input_ids=torch.tensor([prompt + completion])).logits[0].float()
            alone = torch.log_softmax(logits[len(prompt) - 1 : -1] / temperature, -1)
            alone = alone.gather(1, torch.tensor(completion)[:, None]).squeeze(1)
            assert mask[row].sum() == len(completion)
            assert torch.allclose(log_p[row, : len(completion)], alone, atol=1e-4)
            assert not log_p[row, len(completion) :].any()


def test_agents_share_generate_batches_under_their_own_adapters(team):
    start = _adapter(team, 1)
    with torch.no_grad():  # give agent 1 a different policy than agent 0 (whose adapter is still near the base)
        for name, parameter in team.backends[0].model.named_parameters():
            if ".agent_1." in name and "lora_B" in name:
                parameter.normal_(0, 0.5)
    try:
        messages = (Message("user", "Name a colour."),)
        requests = [Request(messages, "solve", agent, 1, max_tokens=8, temperature=0.0) for agent in (0, 1, 0, 1)]
        calls = team.backends[0].generate_calls
        mixed = [c.text for c in team.samplers[0].generate(requests)]
        assert team.backends[0].generate_calls == calls + 1  # one call for the whole team
        alone = []
        for request in requests:
            team.backends[0].model.set_adapter(f"agent_{request.agent}")
            alone.append(team.backends[0].generate([request])[0].text)
        assert mixed == alone and mixed[0] != mixed[1]
    finally:
        with torch.no_grad():
            for name, parameter in team.backends[0].model.named_parameters():
                if name in start:
                    parameter.copy_(start[name])


def test_cli_stops_when_the_time_budget_is_spent(converted, tmp_path, monkeypatch):
    from baselines.llm import train_llm

    monkeypatch.chdir(tmp_path)
    train_llm.main(["--num-agents", "2", "--group-size", "2", "--updates", "5", "--max-minutes", "0.0001",
                    "--max-tokens", "4", "--meta-policy", "self_consistency", "--task-option", "levels=0",
                    "--env-option", "confidence=answer_logprobs", "--no-evaluate", "--converted-cache-dir", converted,
                    "--no-progress", "--no-tensorboard", "--out", "run"])
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 1  # the first update starts inside the budget; the second would not
    metrics = json.loads(rows[0])
    assert metrics["rollout_seconds"] > 0 and metrics["update_seconds"] > 0 and metrics["rollout_tok_s"] > 0
    assert (tmp_path / "run" / "checkpoint" / "team.json").is_file()


def test_samples_hold_the_sampled_tokens_and_the_samplers_log_probabilities(team):
    """The trainer scores exactly the sampled ids (the stop token the model produced included), and the sampler's
    log-probabilities (of the logits / temperature) are the trainer's at the same weights."""
    with torch.inference_mode():
        samples, _ = collect([make_text_env(CONFIG)], team, [5], 1, [0, 1], CONFIG)
    assert len(samples) == 2 * CONFIG.group_size
    eos = team.backends[0].eos_ids
    for sample in samples:
        assert sample.sampler_is_policy and sample.old_log_p is None  # the first training pass computes them
        assert sample.stop_id is None or (sample.stop_id in eos and sample.completion_ids[-1] == sample.stop_id)
        with torch.no_grad():
            log_p, _ = team.logprobs(sample.agent, [sample.prompt_ids], [sample.completion_ids], [sample.temperature])
        assert log_p[0].tolist() == pytest.approx(sample.sampler_log_p, abs=1e-3)
