"""The two packages type-check: mypy, pinned in constraints-tests.txt, configured in pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_packages_type_check_with_mypy():
    pytest.importorskip("mypy", reason="mypy is not installed: bash scripts/setup-tests.sh")
    result = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"mypy found type errors:\n{result.stdout[-6000:]}{result.stderr[-2000:]}"
