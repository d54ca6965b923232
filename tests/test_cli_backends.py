"""The command-line programs on real LLM backends: the SmolLM2 GGUF in-process, and a llama.cpp server.

Tiny budgets (two agents, one round, 16 tokens, 4 for the critic), yet every path a user takes: flags -> one shared
backend (cached) -> batched training and evaluation -> table, cache report, files.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

TINY_ENV = ["--num-agents", "2", "--max-rounds", "1", "--max-tokens", "16", "--env-option", "critic_max_tokens=4"]


def run_cli(module: str, *args: str, cwd) -> str:
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def cache_counts(output: str) -> dict[str, tuple[int, int]]:
    """{entry: (hits, misses)} from the evaluation's cache line."""
    line = next(line for line in output.splitlines() if line.startswith("cache ") and " / " in line)
    return {name: (int(h), int(m)) for name, h, m in re.findall(r"(\w+) (\d+) hits / (\d+) misses", line)}


def test_train_and_evaluate_with_smollm2(tmp_path, converted):
    pytest.importorskip("transformers")
    from deliberation_env.backends.models import smollm2_gguf_path

    try:
        smollm2_gguf_path()
    except FileNotFoundError as error:
        pytest.skip(str(error))
    out = run_cli("baselines.meta.train", "--algo", "sft", "--backend", "transformers", "--model", "smollm2", *TINY_ENV,
                  "--episodes", "4", "--num-envs", "4", "--eval-problems", "1", "--eval-seeds", "1",
                  "--cache", "smol.sqlite", "--backend-option", f"converted_cache_dir={converted}",
                  # float32: the session's other SmolLM2 tests have converted it already, and on a CPU without
                  # bfloat16 instructions it runs twice as fast (tests/test_backend_transformers.py covers bfloat16)
                  "--backend-option", "dtype=float32",
                  "--no-progress", "--no-tensorboard", "--out", "run", cwd=tmp_path)
    for name in ("sft", "single", "self_consistency", "debate", "threshold", "random", "oracle"):
        assert f"| {name} |" in out
    counts = cache_counts(out)
    assert counts["self_consistency"] == (4, 0)  # its round 0 (2 agents x solve + critic) was generated before
    assert (tmp_path / "run" / "policy.pt").is_file() and (tmp_path / "run" / "eval" / "table.csv").is_file()
    assert (tmp_path / "smol.sqlite").stat().st_size > 0


def test_evaluate_train_and_demo_against_a_llama_cpp_server(tmp_path, llama_url):
    backend = ["--backend", "openai", "--base-url", llama_url, "--model", "smol", *TINY_ENV]
    evaluate = ["--protocols", "single", "self_consistency", "--problems", "2", "--seeds", "0",
                "--num-envs", "2", "--cache", "server.sqlite", "--out", "eval"]
    first = run_cli("baselines.meta.evaluate", *backend, *evaluate, cwd=tmp_path)
    assert "| single |" in first and "| self_consistency |" in first
    counts = cache_counts(first)
    assert counts["single"] == (0, 4) and counts["self_consistency"] == (4, 4)  # agent_0's round 0 is shared
    again = cache_counts(run_cli("baselines.meta.evaluate", *backend, *evaluate, cwd=tmp_path))
    assert all(misses == 0 for _, misses in again.values())  # a re-run replays every generation from the cache
    with open(tmp_path / "eval" / "table.md", encoding="utf-8") as f:
        assert f.read().strip() == first.split("\ncache ")[0].strip()

    trained = run_cli("baselines.meta.train", "--algo", "sft", *backend, "--episodes", "1", "--num-envs", "1",
                      "--epochs", "1", "--no-evaluate", "--no-progress", "--no-tensorboard", "--out", "run", cwd=tmp_path)
    assert "trained sft" in trained and (tmp_path / "run" / "policy.pt").is_file()

    demo = run_cli("deliberation_env.demo", *backend, "--episodes", "1", "--policy", "refine", cwd=tmp_path)
    assert "=== episode 0 ===" in demo and "tokens per problem" in demo
