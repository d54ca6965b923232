"""User mistakes on the command line: one line on stderr naming the problem, exit code 2, no traceback."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

TRAIN, EVALUATE, DEMO = "baselines.meta.train", "baselines.meta.evaluate", "deliberation_env.demo"


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


CASES = [
    (TRAIN, ["--task", "nope"], "unknown task 'nope'"),
    (TRAIN, ["--backend", "openai"], "--backend openai needs --base-url"),
    (TRAIN, ["--backend", "transformers"], "--backend transformers needs --model"),
    (TRAIN, ["--num-agents", "0"], "num_agents must be >= 1"),
    (TRAIN, ["--eval-problems", "0"], "eval_problems and eval_seeds must be >= 1"),
    (TRAIN, ["--sft-init", "missing/policy.pt"], "--sft-init: checkpoint 'missing/policy.pt' does not exist"),
    (TRAIN, ["--backend", "nope"], "invalid choice: 'nope'"),
    (EVALUATE, ["--problems", "-3"], "argument --problems: -3 must be >= 1"),
    (EVALUATE, ["--checkpoints", "missing/policy.pt"], "checkpoint 'missing/policy.pt' does not exist"),
    (EVALUATE, ["--backend", "transformers", "--model", "./missing-model"], "model directory 'missing-model' does not exist"),
    (EVALUATE, ["--protocols", "debate", "--problems", "100000"], "has only 500 in split 'test'"),
    (EVALUATE, ["--cache", "missing-folder/cache.sqlite"], "missing-folder' does not exist"),
    (DEMO, ["--episodes", "-1"], "argument --episodes: -1 must be >= 1"),
    (DEMO, ["--agents", "0"], "must be >= 1"),
    (DEMO, ["--backend", "openai", "--model", "m", "--base-url", _closed_port_url()], "no server answers at"),
    (DEMO, ["--backend-option", "no_such_knob=1"], "unexpected keyword argument 'no_such_knob'"),
    (DEMO, ["--temperature", "9"], "temperature must be a number in [0, 5]"),
]


@pytest.mark.parametrize(("module", "args", "expected"), CASES, ids=[f"{m.split('.')[-1]} {' '.join(a)}" for m, a, _ in CASES])
def test_user_mistake_is_one_line_and_exit_code_2(tmp_path, module, args, expected):
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith(f"python -m {module}: error: ") and expected in lines[0], lines[0]
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_a_bug_past_the_user_input_boundary_keeps_its_traceback(tmp_path, monkeypatch, capsys):
    from baselines.meta import train

    def broken(*args, **kwargs):
        raise ValueError("an internal bug")

    monkeypatch.setattr(train, "run", broken)
    with pytest.raises(ValueError, match="an internal bug"):
        train.main(["--out", str(tmp_path / "run"), "--episodes", "8", "--no-progress"])
    assert "error:" not in capsys.readouterr().err
