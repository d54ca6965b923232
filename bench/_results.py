"""What the bench scripts share: the results folder, the command that reproduces a run, saving a
Markdown table there."""

from __future__ import annotations

import math
import os
import shlex
import sys

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def command_line() -> str:
    """The command that started this script, ready to paste."""
    return "python " + " ".join(shlex.quote(a) for a in sys.argv)


def save_markdown(stem: str, header: str, table: str) -> str:
    """Print ``header`` and ``table`` and write them, with the command line, to ``results/<stem>.md``."""
    print(f"\n{header}:\n{table}")
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{stem}.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{header}\n\n`{command_line()}`\n\n{table}\n")
    return path


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% for z = 1.96)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)
