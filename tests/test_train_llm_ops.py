"""Operations of ``baselines.llm.train_llm``: the loss's normalisers and clip-higher on hand-computed tensors, the
learning-rate schedule, the problem shares of data-parallel processes, --agent-devices' validation, the token
entropy, and (on the real SmolLM2-135M) resuming a saved training state with --eval-every's best team."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from baselines.llm.config import LLMTrainConfig  # noqa: E402
from baselines.llm.parallel import DataParallel  # noqa: E402
from baselines.llm.policy import row_normalizers, token_loss  # noqa: E402
from baselines.llm.train_llm import lr_factor  # noqa: E402

# ----------------------------------------------------------------------------- the loss, by hand
# Two completions: row 0 has 2 tokens with ratios 1.5 and 0.5 and advantage +1; row 1 has 1 token with ratio 1.25
# and advantage -2 (a padded third column). Per-token terms -min(r A, clip(r) A):
#   symmetric eps 0.2:            row 0: -min(1.5, 1.2) = -1.2, -min(0.5, 0.8) = -0.5;  row 1: -min(-2.5, -2.4) = 2.5
#   clip-higher (0.2 low, 0.28):  row 0: -min(1.5, 1.28) = -1.28, -0.5;                 row 1: 2.5
RATIOS = [[1.5, 0.5, 1.0], [1.25, 1.0, 1.0]]
MASK = [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
ADVANTAGES = [1.0, -2.0]


def _loss(normalizer, clip_high=0.0, rows=slice(None)):
    log_p = torch.log(torch.tensor(RATIOS, dtype=torch.float64))[rows].requires_grad_(True)
    mask = torch.tensor(MASK, dtype=torch.float64)[rows]
    loss, stats = token_loss(log_p * mask, torch.zeros_like(log_p), None, torch.tensor(ADVANTAGES, dtype=torch.float64)[rows],
                             mask, 0.2, 0.0, normalizer, clip_high)
    return loss, stats, log_p


def _value(normalizer, clip_high=0.0, rows=slice(None)) -> float:
    return float(_loss(normalizer, clip_high, rows)[0].detach())


@pytest.mark.parametrize(("norm", "clip_high", "expected"), [
    ("token", 0.0, (-1.2 - 0.5 + 2.5) / 3),                  # sum over the batch's 3 tokens / 3
    ("token", 0.28, (-1.28 - 0.5 + 2.5) / 3),
    ("sequence", 0.28, ((-1.28 - 0.5) / 2 + 2.5 / 1) / 2),    # each completion's mean, then the mean over 2
    ("drgrpo", 0.28, (-1.28 - 0.5 + 2.5) / (2 * 4)),          # sum / (2 completions x max_tokens 4)
])
def test_token_loss_normalisations_and_clip_higher_by_hand(norm, clip_high, expected):
    normalizers = row_normalizers([2, 1], norm, batch_tokens=3, batch_completions=2, max_tokens=4)
    assert _value(normalizers, clip_high) == pytest.approx(expected, abs=1e-12)
    # micro-batches of one row each accumulate to the batch's loss (the normalisers count the whole batch)
    parts = [_value(normalizers[i : i + 1], clip_high, slice(i, i + 1)) for i in (0, 1)]
    assert sum(parts) == pytest.approx(expected, abs=1e-12)


def test_token_loss_gradient_and_clip_fraction_by_hand():
    loss, stats, log_p = _loss(3.0, clip_high=0.28)
    loss.backward()
    # d/dl of -r A / 3 = -r A / 3 where the unclipped term is the minimum; 0 where the clipped one is (r = 1.5, A > 0)
    assert log_p.grad.reshape(-1).tolist() == pytest.approx([0.0, -0.5 / 3, 0.0, 2.5 / 3, 0.0, 0.0], abs=1e-12)
    assert stats["clip_frac"] == pytest.approx(2 / 3)  # 1.5 and 0.5 lie outside [0.8, 1.28]; 1.25 inside
    assert _loss(3.0)[1]["clip_frac"] == pytest.approx(3 / 3)  # and 1.25 outside [0.8, 1.2]
    # a plain number is the old token-mean normaliser
    assert _value(3.0) == pytest.approx((-1.2 - 0.5 + 2.5) / 3)


def test_row_normalizers_reject_unknown_modes():
    with pytest.raises(ValueError, match="loss_norm must be one of"):
        row_normalizers([1], "tokens", 1, 1, 4)
    with pytest.raises(ValueError, match="loss_norm must be one of"):
        LLMTrainConfig(loss_norm="mean").validate()


# ----------------------------------------------------------------------------- schedule, shares, devices
def test_learning_rate_warmup_then_schedule():
    cfg = LLMTrainConfig(updates=6, warmup_updates=2)
    assert [lr_factor(u, cfg) for u in range(6)] == pytest.approx([1 / 3, 2 / 3, 1, 1, 1, 1])
    linear = [lr_factor(u, replace(cfg, lr_schedule="linear")) for u in range(6)]
    assert linear == pytest.approx([1 / 3, 2 / 3, 1, 0.75, 0.5, 0.25])
    cosine = [lr_factor(u, replace(cfg, lr_schedule="cosine")) for u in range(6)]
    assert cosine[2:] == pytest.approx([0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(4)])
    with pytest.raises(ValueError, match="lr_schedule must be one of"):
        replace(cfg, lr_schedule="step").validate()


def test_per_agent_learning_rates_follow_the_schedule():
    from baselines.llm.train_llm import make_scheduler

    params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(2)]
    optimizer = torch.optim.AdamW([{"params": [params[0]], "lr": 1e-3}, {"params": [params[1]], "lr": 1e-4}])
    scheduler = make_scheduler(optimizer, LLMTrainConfig(updates=4, warmup_updates=1, lr_schedule="linear"))
    seen = []
    for _ in range(4):
        seen.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    assert np.allclose(seen, [[f * 1e-3, f * 1e-4] for f in (0.5, 1.0, 2 / 3, 1 / 3)])


def test_problem_shares_of_the_processes_cover_the_batch_once():
    class Fake:
        num_processes, device, is_main_process = 3, torch.device("cpu"), False

        def __init__(self, rank):
            self.process_index = rank

    shares = [DataParallel(Fake(rank)).share(7) for rank in range(3)]
    assert [list(s) for s in shares] == [[0, 1, 2], [3, 4], [5, 6]]
    assert DataParallel().share(4) == range(4) and DataParallel().sum([1, 2.5]) == [1.0, 2.5]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_agent_devices_are_validated_with_a_clear_error(tmp_path, capsys):
    from baselines.llm import train_llm

    with pytest.raises(ValueError, match=r"device cuda:0 is not available on this machine \(torch sees 0 cuda"):
        LLMTrainConfig(weights="separate", agent_devices="cuda:0,cuda:1").validate()
    with pytest.raises(ValueError, match="use it with --weights separate"):
        LLMTrainConfig(weights="lora", agent_devices="cpu,cpu").validate()
    with pytest.raises(ValueError, match="needs 2 devices"):
        LLMTrainConfig(weights="separate", agent_devices="cpu").validate()
    LLMTrainConfig(weights="separate", agent_devices="cpu,cpu").validate()
    with pytest.raises(SystemExit) as stop:
        train_llm.main(["--weights", "separate", "--agent-devices", "cuda:0,cuda:1", "--out", str(tmp_path / "run")])
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--agent-devices: device cuda:0 is not available" in lines[0], lines


def test_resume_needs_a_saved_state(tmp_path):
    with pytest.raises(ValueError, match="no training state there"):
        LLMTrainConfig(resume=str(tmp_path)).validate()


def _saved_state(folder, cfg: LLMTrainConfig) -> str:
    """A state folder whose trainer.json holds ``cfg``'s settings, as ``save_state`` writes them."""
    folder.mkdir()
    (folder / "trainer.json").write_text(json.dumps({"update": 1, "settings": asdict(cfg)}))
    return str(folder)


def test_resume_refuses_other_training_settings_and_names_each(tmp_path):
    saved = LLMTrainConfig(lr=1e-3, task_options={"levels": (0, 1)}, out="first", threads=1, updates=10)
    state = _saved_state(tmp_path / "state", saved)
    # where it runs, what it logs and, under a constant rate, how long it goes on may change
    replace(saved, resume=state, out="second", threads=4, progress=False, eval_every=5, updates=20).validate()
    with pytest.raises(ValueError, match=r"the run was saved with other settings: lr \(0\.001 saved, 0\.0001 now\); "
                                         r"task_options \(\{'levels': \[0, 1\]\} saved, \{'levels': \[0\]\} now\); "
                                         r"resume with the saved ones"):
        replace(saved, resume=state, lr=1e-4, task_options={"levels": (0,)}).validate()
    legacy = asdict(saved)
    legacy["agents"] = legacy.pop("num_agents")  # saved before the setting was renamed
    (tmp_path / "state" / "trainer.json").write_text(json.dumps({"update": 1, "settings": legacy}))
    replace(saved, resume=state).validate()
    with pytest.raises(ValueError, match=r"num_agents \(2 saved, 3 now\)"):
        replace(saved, resume=state, num_agents=3).validate()
    cosine = _saved_state(tmp_path / "cosine", replace(saved, lr_schedule="cosine"))
    with pytest.raises(ValueError, match=r"updates \(10 saved, 20 now\)"):  # the schedule's length: another rate
        replace(saved, lr_schedule="cosine", resume=cosine, updates=20).validate()


def test_full_weights_below_float32_are_refused_naming_the_fixes():
    for weights, dtype in (("shared", "bfloat16"), ("separate", "float16")):
        with pytest.raises(ValueError, match=f"--weights {weights} --dtype {dtype} would train the {dtype} weights "
                                             r"themselves.*use --weights lora .* or --dtype float32"):
            LLMTrainConfig(weights=weights, dtype=dtype).validate()
    LLMTrainConfig(weights="lora", dtype="bfloat16").validate()
    LLMTrainConfig(weights="shared", dtype="float32").validate()


def test_the_optimizer_refuses_low_precision_parameters_and_peft_keeps_adapters_in_float32():
    """A team handed to ``train`` with bfloat16 trainables is refused; LoRA adapters on a bfloat16 base are float32
    (peft casts them), which is what makes ``--weights lora --dtype bfloat16`` safe."""
    from types import SimpleNamespace

    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from baselines.llm.train_llm import make_optimizer

    cfg = LLMTrainConfig(num_agents=1)
    low = SimpleNamespace(parameter_groups=lambda: [[torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))]])
    with pytest.raises(ValueError, match="trainable parameters in bfloat16: AdamW keeps no float32 master copy"):
        make_optimizer(low, cfg)
    base = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                        num_key_value_heads=2, vocab_size=64)).to(torch.bfloat16)
    model = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]), adapter_name="agent_0")
    model.add_adapter("agent_1", LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    adapters = [[p for n, p in model.named_parameters() if f".agent_{i}." in n] for i in (0, 1)]
    assert all(p.dtype == torch.float32 for group in adapters for p in group) and all(adapters)
    make_optimizer(SimpleNamespace(parameter_groups=lambda: adapters), replace(cfg, num_agents=2))


# ----------------------------------------------------------------------------- on SmolLM2
def test_entropy_of_the_training_pass_matches_the_full_distribution(converted):
    from baselines.llm.policy import TeamPolicy

    team = TeamPolicy("smollm2", 1, "lora", converted_cache_dir=converted, reference=False)
    prompt, completion = team.tokenizer("What is 2 + 2?")["input_ids"], team.tokenizer(" It is 4.")["input_ids"]
    with torch.no_grad():
        log_p, mask, entropy = team.logprobs(0, [prompt], [completion], [0.7], entropy=True)
        logits = team.model(0)(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].float()
    dist = torch.distributions.Categorical(logits=logits / 0.7)
    assert torch.allclose(entropy[0], dist.entropy(), atol=1e-4) and mask.sum() == len(completion)
    assert torch.allclose(log_p[0], dist.log_prob(torch.tensor(completion)), atol=1e-4)


TIMING = ("seconds", "rollout_seconds", "update_seconds", "rollout_tok_s", "update_tok_s")


def test_resuming_a_saved_state_continues_as_if_uninterrupted(converted, tmp_path, monkeypatch):
    """2 updates, a crash in the third, resume for 2 more == 4 updates in one go: weights, metric rows (timings
    aside), the evaluations every 2 updates and the best team."""
    from baselines.llm import train_llm

    cfg = LLMTrainConfig(num_agents=2, group_size=2, max_tokens=6, meta_policy="self_consistency", credit="agent",
                         task_options={"levels": 0}, env_options={"confidence": "answer_logprobs", "count_tokens": len},
                         reward_weights={"length": 0.1, "format": 1.0}, lr=1e-3, updates=4, warmup_updates=1,
                         lr_schedule="cosine", eval_every=2, eval_problems=1, evaluate=False, device="cpu",
                         progress=False, tensorboard=False, converted_cache_dir=converted, seed=3)
    whole = train_llm.train(replace(cfg, out=str(tmp_path / "whole")))
    expected = {n: p.detach().clone() for n, p in whole.backends[0].model.named_parameters() if "lora_" in n}
    del whole

    real_update = train_llm.policy_update
    calls = []

    def crash_in_the_third_update(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_update(*args, **kwargs)

    monkeypatch.setattr(train_llm, "policy_update", crash_in_the_third_update)
    with pytest.raises(KeyboardInterrupt):
        train_llm.train(replace(cfg, out=str(tmp_path / "first"), save_every=2))
    monkeypatch.setattr(train_llm, "policy_update", real_update)
    saved = json.loads((tmp_path / "first" / "state" / "trainer.json").read_text())
    assert saved["update"] == 2 and len(saved["rows"]) == 2

    resumed = train_llm.train(replace(cfg, out=str(tmp_path / "resumed"), resume=str(tmp_path / "first"), save_every=2))
    weights = {n: p.detach() for n, p in resumed.backends[0].model.named_parameters() if "lora_" in n}
    assert any(not torch.equal(v, torch.zeros_like(v)) for n, v in expected.items() if "lora_B" in n)
    assert max(float((weights[n] - expected[n]).abs().max()) for n in expected) < 1e-6

    def rows(run):
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in lines]

    whole_rows, resumed_rows = rows("whole"), rows("resumed")
    assert [r["step"] for r in resumed_rows] == [1, 2, 3, 4] and len(whole_rows) == 4
    assert [r["lr"] for r in whole_rows] == pytest.approx([5e-4, 1e-3, 7.5e-4, 2.5e-4], abs=1e-12)  # warmup, cosine
    for mine, theirs in zip(resumed_rows, whole_rows):
        assert mine.keys() == theirs.keys()
        for key, value in theirs.items():
            assert mine[key] == (pytest.approx(value, rel=1e-6, abs=1e-9, nan_ok=True)
                                 if isinstance(value, float) else value), key
    assert "eval_accuracy" in whole_rows[1] and "eval_accuracy" in whole_rows[3] and "eval_accuracy" not in whole_rows[2]
    best = [json.loads((tmp_path / run / "best" / "eval.json").read_text()) for run in ("whole", "resumed")]
    assert best[0] == best[1] and best[0]["update"] in (2, 4)  # a resumed run elsewhere keeps the old best team
    assert (tmp_path / "resumed" / "best" / "team.json").is_file()
    assert json.loads((tmp_path / "resumed" / "state" / "trainer.json").read_text())["update"] == 4
