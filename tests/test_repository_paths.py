"""No file in the repository names a folder of the machine it was written on.

The forbidden prefixes are built here, at run time, from where this checkout and the home folder
are, so that this file names no machine path either: a docs page, script, example or test that
says where a data folder, model or checkout sits on one machine fails on that machine. Paths in
the tree are written relative to the repository, through a variable (``$DELIBERATION_ENV_DATA``)
or with ``~``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD_OUTPUTS = {"runs", "build", "dist", "__pycache__"}  # as in .gitignore; hidden folders (.git, .venv) too


def machine_prefixes() -> list[str]:
    """``<folder>/`` for the folder holding this checkout (siblings such as a data folder sit there) and the
    home folder, as given and resolved; never a bare filesystem root, nor the system's temporary folder (a
    checkout made there, as CI and fresh-clone checks do, must not forbid the ``/tmp/`` that code rightly names)."""
    folders = {Path(__file__).absolute().parents[2], ROOT.parent}
    with contextlib.suppress(RuntimeError):  # no home folder can be determined: the checkout's folder only
        folders |= {Path.home(), Path.home().resolve()}
    shared = {Path(tempfile.gettempdir()), Path(tempfile.gettempdir()).resolve()}
    return sorted({f"{folder}{os.sep}" for folder in folders if folder != Path(folder.anchor) and folder not in shared})


def tree_files() -> list[Path]:
    """Every file of the working tree but those in hidden folders (``.ci`` is kept), virtual environments and
    build outputs."""
    files = []
    for folder, subfolders, names in os.walk(ROOT):
        subfolders[:] = [
            name for name in subfolders
            if (name == ".ci" or not name.startswith(".")) and name not in BUILD_OUTPUTS
            and not name.endswith(".egg-info") and not (Path(folder, name) / "pyvenv.cfg").exists()]
        files += [Path(folder, name) for name in names if not Path(folder, name).is_symlink()
                  and name != ".git"]  # a git worktree's pointer file names where its repository lives
    return files


def test_machine_prefixes_are_real_folders():
    prefixes = machine_prefixes()
    assert prefixes and all(len(p.strip(os.sep)) > 0 for p in prefixes)
    in_temp = ROOT.parent.resolve() == Path(tempfile.gettempdir()).resolve()  # a checkout in /tmp: home only
    assert in_temp or any(str(ROOT).startswith(p) for p in prefixes)


def test_no_file_names_a_folder_of_this_machine():
    prefixes = [p.encode() for p in machine_prefixes()]
    files = tree_files()
    assert any(f.name == "pyproject.toml" for f in files) and any(f.suffix == ".md" for f in files)
    offenders = []
    for path in files:
        content = path.read_bytes()
        found = sorted({p.decode() for p in prefixes if p in content})
        if found:
            offenders.append(f"{path.relative_to(ROOT)} ({', '.join(found)})")
    assert not offenders, (
        f"files naming a folder of this machine: {offenders}; write paths relative to the repository, "
        "through a variable such as $DELIBERATION_ENV_DATA, or with ~")
