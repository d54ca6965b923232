"""Write the tables of the docs that come from declarations, so that a block (a feature set, a tool, a role's field) is
documented where it is declared and nowhere by hand:

- ``feature_sets``: the built-in feature sets (``core.features.feature_set_table``: width, the set extended, what it
  adds, what it needs);
- ``tools``: the built-in tools (``core.tools.tool_table``: kind, what becomes of the text's answer, what it does);
- ``role_fields``: a role's fields, each with its docstring (``core.roles.Role``).

Each table sits in docs/reference.md between ``<!-- table: NAME -->`` and ``<!-- end table -->``.

    python scripts/docs_tables.py            # rewrite them
    python scripts/docs_tables.py --check    # exit 1 naming the stale ones (tests/test_blocks.py runs the check)
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "reference.md"
SECTION = re.compile(r"(<!-- table: (\w+) -->\n)(.*?)(<!-- end table -->)", re.DOTALL)


def role_fields_table() -> str:
    """``core.roles.Role``'s fields and their docstrings."""
    from deliberation_env.cli import field_docs
    from deliberation_env.core.roles import Role

    docs = field_docs(Role)
    return "\n".join(["| field | meaning |", "|---|---|", *(f"| ``{f.name}`` | {docs[f.name]} |" for f in fields(Role))])


def tables() -> dict[str, str]:
    """Each generated table by its section's name, written from the built-in declarations."""
    from deliberation_env.core import features, tools

    return {"feature_sets": features.feature_set_table(features.BUILT_IN_FEATURE_SETS),
            "tools": tools.tool_table(tools.BUILT_IN_TOOLS), "role_fields": role_fields_table()}


def regenerate(text: str) -> str:
    """``text`` with every marked section holding its table now; ValueError for a section of no known name."""
    known = tables()

    def fill(match: re.Match[str]) -> str:
        if match.group(2) not in known:
            raise ValueError(f"no table named {match.group(2)!r}; known: {sorted(known)}")
        return f"{match.group(1)}{known[match.group(2)]}\n{match.group(4)}"

    return SECTION.sub(fill, text)


def stale(text: str) -> list[str]:
    """The names of the marked sections whose table is not the declarations' own."""
    fresh = {match.group(2): match.group(3) for match in SECTION.finditer(regenerate(text))}
    return [match.group(2) for match in SECTION.finditer(text) if match.group(3) != fresh[match.group(2)]]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 naming the stale tables")
    args = parser.parse_args(argv)
    text = DOCS.read_text(encoding="utf-8")
    if args.check:
        old = stale(text)
        if old:
            print(f"{DOCS.relative_to(ROOT)}: stale tables {old}: run python scripts/docs_tables.py", file=sys.stderr)
        return 1 if old else 0
    DOCS.write_text(regenerate(text), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
