"""Data-parallel ``baselines.llm.train_llm`` under ``accelerate launch`` (2 CPU processes, gloo) on the real SmolLM2-135M:
2 processes x 1 problem train the same adapters as 1 process x 2 problems (docs/train_llm.md, "Scale-out")."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("accelerate")
safetensors = pytest.importorskip("safetensors.torch")

# Train through train() with a config a flag cannot spell (count_tokens=len: the length term counts characters, so
# that the sampled completions get distinct returns); print which process of how many ran.
DRIVER = """
import json, sys
from accelerate import PartialState
from baselines.llm.config import LLMTrainConfig
from baselines.llm.train_llm import train
train(LLMTrainConfig(**json.loads(sys.argv[1]), env_options={"confidence": "answer_logprobs", "count_tokens": len}))
state = PartialState()
print(f"process {state.process_index} of {state.num_processes}", flush=True)
"""

# One update of 2 problems x G = 3 rollouts, both agents trained. micro_batch = generate_batch = G: each micro-batch
# (and generate batch) holds one problem's completions of one agent in both layouts, so the forward passes match
# row for row and the comparison isolates the splitting, the normalisers and the gradient all-reduce.
SETTINGS = {"num_agents": 2, "group_size": 3, "problems_per_update": 2, "updates": 1, "max_tokens": 8,
            "meta_policy": "self_consistency", "credit": "agent", "task_options": {"levels": 0},
            "reward_weights": {"length": 0.1, "format": 1.0}, "lr": 1e-3, "micro_batch": 3, "generate_batch": 3,
            "device": "cpu", "evaluate": False, "progress": False, "tensorboard": False, "seed": 5}
COMPARED = ("loss", "pg_loss", "entropy", "accuracy", "team_return", "adv_abs", "completion_tokens", "grad_norm_0",
            "grad_norm_1", "trained_tokens")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(command: list[str], cwd) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def _adapters(out) -> dict[str, torch.Tensor]:
    weights = {}
    for agent in (0, 1):
        path = out / "checkpoint" / "adapters" / f"agent_{agent}" / "adapter_model.safetensors"
        weights.update({f"{agent}/{k}": v for k, v in safetensors.load_file(str(path)).items()})
    return weights


def test_two_processes_train_the_adapters_of_one_process_on_the_same_batch(tmp_path, converted):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)

    def settings(out: str) -> str:
        return json.dumps({**SETTINGS, "out": str(tmp_path / out), "converted_cache_dir": converted})

    # the single process first: it fills the converted-model cache (if no earlier test did) that the launch reads
    assert "process 0 of 1" in _run([sys.executable, str(driver), settings("single")], tmp_path)
    launched = _run([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                     "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                     "--main_process_port", str(_free_port()), str(driver), settings("ddp")], tmp_path)
    assert "process 0 of 2" in launched and "process 1 of 2" in launched

    single, ddp = _adapters(tmp_path / "single"), _adapters(tmp_path / "ddp")
    assert single.keys() == ddp.keys()
    for agent in (0, 1):  # both agents' adapters moved (lora_B starts at zero)
        assert any(v.abs().max() > 0 for k, v in single.items() if k.startswith(f"{agent}/") and "lora_B" in k)
    worst = max(float((single[k] - ddp[k]).abs().max()) for k in single)
    assert worst < 1e-5, worst

    rows = [json.loads((tmp_path / out / "metrics.jsonl").read_text()) for out in ("single", "ddp")]
    assert rows[0]["adv_abs"] > 0
    for key in COMPARED:
        assert rows[1][key] == pytest.approx(rows[0][key], rel=1e-5, abs=1e-7), key
    # one process wrote the run: no per-process copies of the outputs
    assert sorted(p.name for p in (tmp_path / "ddp").iterdir()) == sorted(p.name for p in (tmp_path / "single").iterdir())
