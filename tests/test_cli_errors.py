"""User mistakes on the command line: one line on stderr naming the problem, exit code 2, no traceback."""

from __future__ import annotations

import importlib
import socket
import subprocess
import sys

import pytest

TRAIN, EVALUATE, DEMO = "baselines.meta.train", "baselines.meta.evaluate", "deliberation_env.demo"


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


CLOSED_PORT = "<a closed port>"  # replaced when the test runs, so that the test's id is the same in every process

CASES = [
    (TRAIN, ["--task", "nope"], "unknown task 'nope'"),
    (TRAIN, ["--backend", "openai"], "--backend openai needs --base-url"),
    (TRAIN, ["--backend", "transformers"], "--backend transformers needs --model"),
    (TRAIN, ["--num-agents", "0"], "--num-agents: 0 must be >= 1"),
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
    (DEMO, ["--backend", "openai", "--model", "m", "--base-url", CLOSED_PORT], "no server answers at"),
    (DEMO, ["--backend-option", "no_such_knob=1"], "unexpected keyword argument 'no_such_knob'"),
    (DEMO, ["--temperature", "9"], "temperature must be a number in [0, 5]"),
]


# One case per program runs as a real process (the interpreter's exit path, nothing else printed on stderr); the
# rest call the same ``main`` in-process, which saves an interpreter start and the imports per case.
OWN_PROCESS = {(TRAIN, "--sft-init"), (EVALUATE, "--backend"), (DEMO, "--backend")}


def run_program(module: str, args: list[str], cwd, capsys) -> tuple[int, str]:
    """(exit code, stderr) of ``python -m module args`` in ``cwd``: a subprocess for the cases in OWN_PROCESS."""
    if (module, args[0]) in OWN_PROCESS:
        done = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True,
                              timeout=120)
        return done.returncode, done.stderr
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as exited:
        main(args)
    return exited.value.code, capsys.readouterr().err


@pytest.mark.parametrize(("module", "args", "expected"), CASES, ids=[f"{m.split('.')[-1]} {' '.join(a)}" for m, a, _ in CASES])
def test_user_mistake_is_one_line_and_exit_code_2(tmp_path, monkeypatch, capsys, module, args, expected):
    monkeypatch.chdir(tmp_path)
    args = [_closed_port_url() if arg == CLOSED_PORT else arg for arg in args]
    code, stderr = run_program(module, args, tmp_path, capsys)
    lines = stderr.strip().splitlines()
    assert code == 2, stderr[-2000:]
    assert len(lines) == 1, stderr[-2000:]
    assert lines[0].startswith(f"python -m {module}: error: ") and expected in lines[0], lines[0]
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_each_program_has_a_case_run_as_a_real_process():
    assert {module for module, first in OWN_PROCESS} == {TRAIN, EVALUATE, DEMO}
    assert all(any(m == module and a[0] == first for m, a, _ in CASES) for module, first in OWN_PROCESS)


def test_a_bug_past_the_user_input_boundary_keeps_its_traceback(tmp_path, monkeypatch, capsys):
    from baselines.meta import train

    def broken(*args, **kwargs):
        raise ValueError("an internal bug")

    monkeypatch.setattr(train, "run", broken)
    with pytest.raises(ValueError, match="an internal bug"):
        train.main(["--out", str(tmp_path / "run"), "--episodes", "8", "--no-progress"])
    assert "error:" not in capsys.readouterr().err


def test_the_recorders_old_flag_names_still_work_with_a_warning(tmp_path, capsys):
    """``--agents``/``--rounds`` were the recorder's own spelling; every other program says --num-agents/--max-rounds."""
    from deliberation_env.record import parse_args

    new = parse_args(["--out", str(tmp_path), "--num-agents", "2", "--max-rounds", "2"])
    assert capsys.readouterr().err == ""
    old = parse_args(["--out", str(tmp_path), "--agents", "2", "--rounds", "2"])
    warnings = capsys.readouterr().err.splitlines()
    assert (old.num_agents, old.max_rounds) == (new.num_agents, new.max_rounds) == (2, 2)
    assert len(warnings) == 2 and "--agents is an old name of --num-agents" in warnings[0]
    assert "--rounds is an old name of --max-rounds" in warnings[1]
