"""Every bench script (``bench/*.py``, ``bench/benchmark/*.py``, ``bench/studies/*.py``) answers a mistyped flag with
one line on stderr and exit code 2, like the package's programs (``deliberation_env.cli.ArgumentParser``), not with
argparse's usage block; and a script run by its path finds the helpers it shares with the others."""

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


HELPERS = sorted(os.path.basename(path) for path in glob.glob(os.path.join(BENCH, "_*.py")) if not os.path.islink(path))
"""The helpers the bench scripts share (``bench/_results.py``, ...)."""
FOLDERS = ("benchmark", "studies")


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_script_folder_links_every_shared_helper(folder):
    """A script run as ``python bench/<folder>/NAME.py`` finds the shared helpers in its own folder (the path holds
    the script's folder, not ``bench/``): each folder holds a link to each helper of ``bench/``."""
    assert {"_results.py", "_trees.py"} <= set(HELPERS)
    for helper in HELPERS:
        link = os.path.join(BENCH, folder, helper)
        assert os.path.islink(link) and os.path.samefile(link, os.path.join(BENCH, helper)), f"link {link} to ../{helper}"


@pytest.mark.parametrize("script", ["benchmark/replay_benchmark.py", "studies/template_overlap.py"])
def test_a_script_run_by_its_path_imports_its_helpers(script):
    """Run as the docs say, from the repository's root (replay_benchmark reaches _suite, _trees and _results;
    template_overlap _results and _suite): a mistyped flag, so it only imports and parses."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, os.path.join("bench", script), "--no-such-flag"], cwd=os.path.dirname(BENCH),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [f"{os.path.basename(script)}: error: unrecognized arguments: "
                                                "--no-such-flag (see --help)"], done.stderr


def test_the_determinism_study_finds_the_recording_server_script(bench_import):
    """bench/studies/recording_determinism.py starts servers through bench/record/llama_server.sh (a path that broke
    when the scripts moved into folders)."""
    server = bench_import("recording_determinism").SERVER
    assert os.path.isfile(server) and server.endswith(os.path.join("bench", "record", "llama_server.sh"))
