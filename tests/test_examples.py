"""The scripts in examples/ run as a user runs them (a fresh interpreter, their own working folder)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(name: str, cwd: Path, *args: str, data_dir: Path | None = None) -> str:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    if data_dir is not None:
        env["DELIBERATION_ENV_DATA"] = str(data_dir)
    done = subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_random_policy(tmp_path):
    out = run_example("random_policy.py", tmp_path)
    accuracy = float(out.split("accuracy ")[1].split(",")[0])
    assert 0.0 < accuracy < 1.0 and "tokens per problem" in out


def test_own_env_finds_the_optimum(tmp_path):
    out = run_example("own_env.py", tmp_path)
    payoff, optimum = out.split("payoff ")[1].split(" (optimum ")
    assert int(payoff) == int(optimum.rstrip(")\n"))


@pytest.mark.slow
def test_train_each_algorithm_then_evaluate_on_gsm8k(tmp_path, data_dir):
    table = run_example("train_each_algorithm.py", tmp_path)
    for algo in ("sft", "softrankpo", "grpo", "magrpo", "ppo", "threshold", "random"):
        assert f"| {algo} |" in table
    checkpoint = tmp_path / "runs" / "examples" / "softrankpo" / "policy.pt"
    assert checkpoint.is_file()
    table = run_example("evaluate_gsm8k.py", tmp_path, str(checkpoint), data_dir=data_dir)
    for name in ("learned", "self_consistency", "debate", "threshold"):
        assert f"| {name} |" in table


def test_evaluate_without_a_checkpoint_says_how_to_get_one(tmp_path, data_dir):
    done = subprocess.run([sys.executable, str(EXAMPLES / "evaluate_gsm8k.py")], cwd=tmp_path,
                          env={**os.environ, "DELIBERATION_ENV_DATA": str(data_dir)}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0 and "train one first" in done.stderr


def test_text_env_own_llm_logs_each_reward_term(tmp_path):
    out = run_example("text_env_own_llm.py", tmp_path)
    terms = dict(item.rsplit(" ", 1) for item in out.strip().split(", "))
    assert float(terms["format"]) == 1.0 and float(terms["correct"]) < 0.5 and float(terms["length"]) < 0
