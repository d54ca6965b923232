"""What the bench scripts share: the results folder, the command that reproduces a run, saving a
Markdown table there, and a backend wrapper that counts what passes through it.

The bench is a package: its scripts import the shared helpers (this module, ``trees``, ``replay_rows``, ``suite``) as
``bench.common.results``, ..., and a script run by its path (``python bench/<folder>/<script>.py``, from the repository's
root or its own folder) first puts the repository's root on ``sys.path`` (its one bootstrap line)."""

from __future__ import annotations

import os
import shlex
import sys

from deliberation_env.analysis.metrics import wilson_interval  # noqa: F401 - re-exported for the bench scripts

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""``bench/`` itself."""
RESULTS = os.path.join(BENCH, "results")


def command_line() -> str:
    """The command that started this script, ready to paste from the repository's root whatever folder it
    was started in (the home folder written as ~, so that no path of the measuring machine ends up in the
    results)."""
    home = os.path.expanduser("~") + os.sep
    script = os.path.relpath(os.path.abspath(sys.argv[0]), os.path.dirname(BENCH))
    return "python " + " ".join("~/".join(shlex.quote(piece) if piece else "" for piece in a.split(home))
                                for a in [script, *sys.argv[1:]])


def write_report(stem: str, text: str) -> str:
    """Print a whole markdown report (which names its own command) and write it to ``results/<stem>.md``."""
    print(text)
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{stem}.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def save_markdown(stem: str, header: str, table: str) -> str:
    """Print ``header`` and ``table`` and write them, with the command line, to ``results/<stem>.md``."""
    print(f"\n{header}:\n{table}")
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{stem}.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{header}\n\n`{command_line()}`\n\n{table}\n")
    return path


class Counting:
    """A backend wrapper that counts the requests it passes on, the completions it gets back and their tokens."""

    def __init__(self, inner):
        self.inner = inner
        self.requests = self.completions = self.prompt_tokens = self.completion_tokens = 0

    def identity(self) -> str:
        return self.inner.identity()

    def generate(self, requests):
        self.requests += len(requests)
        out = self.inner.generate(requests)
        self.completions += len(out)
        self.prompt_tokens += sum(c.prompt_tokens for c in out)
        self.completion_tokens += sum(c.completion_tokens for c in out)
        return out


def flag_settings(parser, args, names):
    """The ``DeliberationConfig`` of the env-setting flags ``names`` (``cli.add_env_arguments``): those given, the
    env's own defaults for the rest, so that a script that builds requests itself samples as the env would; a value
    the declaration refuses is the parser's one-line error."""
    from deliberation_env.cli import env_arguments
    from deliberation_env.core.config import DeliberationConfig

    try:
        return DeliberationConfig(**env_arguments(args, names))
    except ValueError as error:
        parser.error(str(error))


def add_band_arguments(parser, out: str) -> None:
    """The flags of a measurement on a range of problems outside any recording (team_band, jigsaw_band): the
    range, levels and seed, the results stem ``out``, ``--report-only`` and the backend (256 tokens, at the env's
    temperature)."""
    from deliberation_env.cli import add_backend_arguments

    parser.add_argument("--split", default="train")
    parser.add_argument("--start", type=int, default=1900, help="the first problem's position in the split")
    parser.add_argument("--problems", type=int, default=40)
    parser.add_argument("--levels", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=out, help="results file stem under bench/results/")
    parser.add_argument("--report-only", action="store_true", help="report <out>.jsonl again (no model run)")
    add_backend_arguments(parser, backend_default="transformers")
    parser.set_defaults(max_tokens=256)


def parse_band_arguments(parser, argv):
    """Parse ``add_band_arguments``' flags: --model is required unless --report-only; the sampling settings not given
    are the env's."""
    from deliberation_env.cli import SAMPLING_FLAGS

    args = parser.parse_args(argv)
    settings = flag_settings(parser, args, SAMPLING_FLAGS)
    args.max_tokens, args.temperature = settings.max_tokens, settings.temperature
    if not args.model and not args.report_only:
        parser.error("--model is required (a .gguf file or model folder; with --backend openai the served name), "
                     "unless --report-only")
    return args
