"""Every command the docs and the results quote (``python bench/<folder>/NAME.py --flags``, ``python -m baselines...``,
``python -m deliberation_env...``) names a script or module of the tree, and its flags parse: the program runs
under its own ``__main__`` with the quoted arguments until its parser has read them, then stops (``Parsed``) before
any work. A renamed flag, a removed script or a results file whose command no longer reproduces it fails here."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import runpy
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
QUOTING = ("README.md", "CONTRIBUTING.md", "docs/*.md", "bench/results/**/*.md")
"""The Markdown files whose commands are checked."""
PROGRAM = re.compile(r"(?:\bpython3?\s+(?:-[A-Za-z]+\s+)*)?"
                     r"(?:(?<![\w/.-])(bench/(?:\w+/)*[A-Za-z]\w*\.py)\b|-m\s+((?:baselines|deliberation_env|bench)(?:\.\w+)*))")
"""A program of ours: a bench script by its path (``python`` before it optional: prose quotes ``bench/x.py --flag``;
not a shared helper such as ``bench/common/results.py``), or a module run with ``-m`` (also after ``accelerate launch``)."""
ENDS = {"&&", "||", "|", ";", ">", ">>", "2>&1", "&"}
"""Shell tokens that end a command's arguments; so does a token opening with ``:``, ``)``, ``,`` or ``(`` (a program
named in a sentence or an error message: ``python -m baselines.meta.train: error: ...``)."""
ELLIPSIS = {"...", "…"}
"""Written for "more flags": dropped, the flags around it are checked."""
TEMPLATE = re.compile(r"^[\[<]|[$|]")
"""A token of a usage line or a recipe (``[--seed S]``, ``<folder>``, ``a|b``, ``"$1"``): no value to parse."""


@dataclass(frozen=True)
class Command:
    where: str
    """file:line of the quote."""
    program: str
    """``bench/studies/x.py`` or a module's dotted name."""
    argv: tuple[str, ...]
    run: bool
    """Written as a command (``python`` before it, or arguments after it), not a program named in a sentence."""
    partial: bool
    """Some arguments left out (``...``)."""

    @property
    def template(self) -> bool:
        """A usage line, a recipe with shell variables or a partial command: its flags' names are checked (against
        the program's ``--help``), not their values."""
        return self.partial or any(TEMPLATE.search(token) for token in self.argv)

    def __str__(self) -> str:
        return f"{self.where}: {self.program} {shlex.join(self.argv)}"


def quoted_texts(text: str) -> list[tuple[int, str]]:
    """(line, text) of each command-bearing span of a Markdown file: each line of a fenced block (a line ending in
    a backslash joined with the next), and each inline code span of the prose (which may run over a line break). The
    lines of a block after a ``git checkout REV`` are commands of another commit (a study kept in the history), left
    out."""
    spans, fence, pending, elsewhere = [], None, None, False
    prose: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence, elsewhere = None if fence else number, False
            continue
        if fence and (elsewhere or re.match(r"\s*git checkout \w", line)):
            elsewhere = True
            continue
        if fence:
            if pending:
                start, head = pending
                line, number = head + " " + line.strip(), start
            pending = (number, line[:-1]) if line.rstrip().endswith("\\") else None
            if not pending:
                spans.append((number, line))
        else:
            prose.append((number, line))
    paragraph: list[tuple[int, str]] = []
    for number, line in [*prose, (0, "")]:
        if line.strip():
            paragraph.append((number, line))
            continue
        joined = "\n".join(part for _, part in paragraph)
        for match in re.finditer(r"(?<!`)`([^`]+)`(?!`)", joined):
            spans.append((paragraph[0][0] + joined.count("\n", 0, match.start()), match.group(1).replace("\n", " ")))
        paragraph = []
    return spans


def arguments(tail: str) -> tuple[tuple[str, ...], bool]:
    """The arguments a command's tail passes (up to a shell operator or a comment) and whether the quote leaves some
    out (an ellipsis, dropped: the flags around it are checked)."""
    try:
        tokens = shlex.split(tail, comments=True)
    except ValueError:  # an unbalanced quote: the span ends inside the command
        tokens = tail.split()
    argv: list[str] = []
    for token in tokens:
        if token in ENDS or (token and token[0] in ":),("):
            break
        if token not in ELLIPSIS:
            argv.append(token)
    return tuple(argv), any(token in ELLIPSIS for token in tokens[:len(argv) + 1])


def documented_commands() -> list[Command]:
    commands = []
    for pattern in QUOTING:
        for path in sorted(ROOT.glob(pattern)):
            relative = path.relative_to(ROOT).as_posix()
            for line, span in quoted_texts(path.read_text(encoding="utf-8")):
                matches = list(PROGRAM.finditer(span))
                for match, after in zip(matches, [*matches[1:], None]):
                    python = match.group(0).startswith("python")
                    if match.group(1) and not (python or match.start() == 0):
                        continue  # a path inside a sentence in code, not a command
                    tail = span[match.end():after.start() if after else len(span)]
                    argv, partial = arguments(tail)
                    named = tail.lstrip()[:1] in (":", ")", ",")  # python -m x: what x does
                    commands.append(Command(f"{relative}:{line}", match.group(1) or match.group(2), argv,
                                            (python or bool(argv) or partial) and not named, partial))
    return commands


COMMANDS = documented_commands()


class Parsed(Exception):
    """Raised once the program's parser has read the quoted arguments: the command is checked, nothing runs."""


def exists(program: str) -> bool:
    if program.endswith(".py"):
        return (ROOT / program).is_file()
    base = ROOT.joinpath(*program.split("."))
    return base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()


def run_until_parsed(program: str, argv: Sequence[str], monkeypatch) -> tuple[str, str]:
    """Run ``program`` as ``__main__`` with ``argv`` until its first ``parse_args`` returns. (error, output): error is
    what its parser said when it refused the arguments, or "" when they parsed (``--help`` counts as parsed)."""
    original = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        original(self, args, namespace)
        raise Parsed

    stderr, stdout = io.StringIO(), io.StringIO()
    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
        patch.setattr(sys, "argv", [program.rpartition("/")[2] if program.endswith(".py") else program, *argv])
        try:
            with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stdout):
                if program.endswith(".py"):
                    runpy.run_path(str(ROOT / program), run_name="__main__")
                else:
                    runpy.run_module(program, run_name="__main__", alter_sys=True)
        except Parsed:
            return "", stdout.getvalue()
        except SystemExit as stop:
            if stop.code in (0, None):
                return "", stdout.getvalue()
            return stderr.getvalue().strip() or f"exit status {stop.code}", stdout.getvalue()
    return "ran to its end without parsing its arguments", stdout.getvalue()


def unknown_flags(command: Command, monkeypatch) -> str:
    """For a usage line or recipe: the flags it names that the program's ``--help`` (of its subcommand, if it names
    one first) does not list."""
    words = [token.strip("[]") for token in command.argv]
    first = next((i for i, word in enumerate(words) if word.startswith("-")), len(words))
    error, shown = run_until_parsed(command.program, [*words[:first], "--help"], monkeypatch)
    if error:
        return error
    listed = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", shown))
    missing = [word.split("=")[0] for word in words[first:] if word.startswith("-") and word.split("=")[0] not in listed]
    return f"not among its flags: {missing}" if missing else ""


def check(command: Command, monkeypatch) -> str:
    """What is wrong with a quoted command, or ""."""
    if not exists(command.program):
        return "no such script or module"
    if not command.run:
        return ""
    if command.template:
        return unknown_flags(command, monkeypatch)
    return run_until_parsed(command.program, command.argv, monkeypatch)[0]


def test_the_docs_quote_commands():
    """The extraction finds the commands it is meant to check (if it found none, every check below would pass)."""
    programs = {command.program for command in COMMANDS}
    assert {"bench/benchmark/benchmark_suite.py", "baselines.meta.train", "deliberation_env.record"} <= programs
    assert sum(command.run and not command.template for command in COMMANDS) > 100
    assert any(command.template for command in COMMANDS)


@pytest.mark.parametrize("program", sorted({command.program for command in COMMANDS}))
def test_every_quoted_program_exists_and_its_quoted_flags_parse(program, monkeypatch):
    failures = [f"{command}\n    {error}" for command in COMMANDS if command.program == program
                if (error := check(command, monkeypatch))]
    assert not failures, "quoted commands that do not run as quoted:\n" + "\n".join(failures)
