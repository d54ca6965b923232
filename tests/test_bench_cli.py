"""Every bench script (``bench/benchmark/*.py``, ``bench/studies/*.py``) answers a mistyped flag with one line on stderr
and exit code 2, like the package's programs (``deliberation_env.cli.ArgumentParser``), not with argparse's usage block;
``bench`` is a package (no links), whose scripts run by their path from the repository's root and from their own
folder, and import as ``bench.<folder>.<script>``."""

from __future__ import annotations

import glob
import importlib
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
FOLDERS = ("benchmark", "studies")
"""The script folders (``bench/common`` holds the helpers they share, ``bench/record`` shell recipes)."""
SCRIPTS = sorted(f"bench.{folder}.{os.path.basename(path)[:-3]}" for folder in FOLDERS
                 for path in glob.glob(os.path.join(BENCH, folder, "[!_]*.py")))
"""``bench.<folder>.<script>`` of every script (``_helpers`` and ``__init__`` are none)."""


def test_every_bench_script_is_found():
    assert {"bench.studies.llm_study", "bench.studies.protocols", "bench.benchmark.replay_benchmark",
            "bench.studies.replay_transfer"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_mistyped_flag_is_one_line_on_stderr(script, monkeypatch, capsys):
    module = importlib.import_module(script)
    name = script.rpartition(".")[2]
    monkeypatch.setattr("sys.argv", [f"{name}.py", "--no-such-flag"])
    with pytest.raises(SystemExit) as stopped:
        module.main()
    assert stopped.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"{name}.py: error: ") and lines[0].endswith("(see --help)")


def test_bench_is_a_package_without_links():
    """The shared helpers are ``bench.common.results``, ...: no script folder links them (a link breaks on Windows and in
    archives, and a helper reached two ways is two modules)."""
    links = [path for path in glob.glob(os.path.join(BENCH, "**", "*"), recursive=True) if os.path.islink(path)]
    assert not links
    for package in ("bench", "bench/benchmark", "bench/studies", "bench/common"):
        assert os.path.isfile(os.path.join(ROOT, package, "__init__.py")), package


BOOTSTRAP = "sys.path.insert(1, str(Path(__file__).resolve().parents[2]))"
"""A script's one path edit: run by its path, the repository's root goes on the path (after the script's folder), so
that ``import bench`` finds the package wherever the script was started from."""


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_puts_the_repository_root_on_the_path_before_importing_bench(script):
    with open(os.path.join(ROOT, *script.split(".")) + ".py", encoding="utf-8") as file:
        source = file.read()
    assert BOOTSTRAP in source, f"{script}: its first lines need `{BOOTSTRAP}`"
    first_import = source.find("\nfrom bench")
    assert first_import < 0 or source.index(BOOTSTRAP) < first_import


@pytest.mark.parametrize(("script", "where"), [("benchmark/replay_benchmark.py", "root"),
                                               ("studies/template_overlap.py", "own folder")])
def test_a_script_run_by_its_path_imports_its_helpers(script, where):
    """Run as the docs say, from the repository's root, and from the script's own folder, with no PYTHONPATH
    (replay_benchmark reaches bench.common's suite, trees and results; template_overlap results and suite): a mistyped flag, so
    it only imports and parses."""
    folder = ROOT if where == "root" else os.path.join(BENCH, os.path.dirname(script))
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, os.path.relpath(os.path.join(BENCH, script), folder), "--no-such-flag"],
                          cwd=folder, env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [f"{os.path.basename(script)}: error: unrecognized arguments: "
                                                "--no-such-flag (see --help)"], done.stderr


def test_the_determinism_study_finds_the_recording_server_script():
    """bench/studies/recording_determinism.py starts servers through bench/record/llama_server.sh (a path that broke
    when the scripts moved into folders)."""
    from bench.studies import recording_determinism

    server = recording_determinism.SERVER
    assert os.path.isfile(server) and server.endswith(os.path.join("bench", "record", "llama_server.sh"))
