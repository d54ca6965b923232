"""Every bench script (``bench/*.py``, ``bench/benchmark/*.py``, ``bench/studies/*.py``) answers a mistyped flag with
one line on stderr and exit code 2, like the package's
programs (``deliberation_env.cli.ArgumentParser``), not with argparse's usage block."""

from __future__ import annotations

import glob
import os

import pytest

pytest.importorskip("torch")

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
SCRIPTS = sorted(os.path.basename(path)[:-3] for pattern in ("[!_]*.py", "*/[!_]*.py")
                 for path in glob.glob(os.path.join(BENCH, pattern)))


def test_every_bench_script_is_found():
    assert {"llm_study", "protocols", "replay_benchmark", "replay_transfer"} <= set(SCRIPTS)
    assert len(SCRIPTS) == len(set(SCRIPTS)), "two bench scripts share a name: their imports would clash"


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_mistyped_flag_is_one_line_on_stderr(script, bench_import, monkeypatch, capsys):
    module = bench_import(script)
    monkeypatch.setattr("sys.argv", [f"{script}.py", "--no-such-flag"])
    with pytest.raises(SystemExit) as stopped:
        module.main()
    assert stopped.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"{script}.py: error: ") and lines[0].endswith("(see --help)")
