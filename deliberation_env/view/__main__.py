"""``python -m deliberation_env.view``: build (and serve) the browsable view of a replay set or of trace files.

    python -m deliberation_env.view qwen05-team-arith --out view/ --serve      # build, then serve on 127.0.0.1
    python -m deliberation_env.view PATH/TO/SET --out view/ --split test --problems 0:50
    python -m deliberation_env.view qwen05-team-arith --out view/ --trace traces.jsonl --labels softrankpo sft
    python -m deliberation_env.view traces.jsonl --out view/                  # policies side by side

The folder holds ``index.html`` and one page per problem; open ``index.html`` in a browser, or pass ``--serve``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from deliberation_env.cli import ArgumentParser, UserError, nonnegative_int, report_user_errors, user_input
from deliberation_env.view.site import Built, build_set_site, build_trace_site, serving

PROG = "python -m deliberation_env.view"


def problem_range(text: str) -> range:
    """argparse type: ``START:END`` (positions in each split, END excluded)."""
    start, sep, end = text.partition(":")
    if not sep or not start.isdigit() or not end.isdigit() or int(start) >= int(end):
        raise argparse.ArgumentTypeError(f"{text!r} is not START:END with START < END (e.g. 0:50)")
    return range(int(start), int(end))


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", help="a replay set (a shipped set's name, a folder, hf://owner/name) or a trace "
                                       "file (.jsonl, deliberation_env.analysis.traces)")
    parser.add_argument("--out", default=None, help="the site's folder (default with --serve: a temporary one)")
    parser.add_argument("--serve", action="store_true", help="serve the site on 127.0.0.1 until interrupted")
    parser.add_argument("--port", type=nonnegative_int, default=8000, help="the port of --serve (0: a free one)")
    parser.add_argument("--split", nargs="+", default=None, help="the set's splits to show (default: all)")
    parser.add_argument("--problems", type=problem_range, default=None, metavar="START:END",
                        help="positions in each split to show (default: all)")
    parser.add_argument("--trace", nargs="+", default=[], metavar="FILE.jsonl",
                        help="trace files whose policies are marked on the set's grids and shown beside it")
    parser.add_argument("--labels", nargs="+", default=None, metavar="LABEL",
                        help="the trace labels (policies) to show, in this order (default: every one)")
    parser.add_argument("--stream", type=nonnegative_int, default=0, help="the sample stream to show (default 0)")
    parser.add_argument("--chosen-targets", action="store_true",
                        help="the grid of the game with CONCEDE to a named peer (sets with every concede target)")
    return parser


def stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def is_trace(source: str) -> bool:
    return source.endswith(".jsonl") or Path(source).is_file()


@report_user_errors(PROG)
def main(argv: Sequence[str] | None = None) -> Built:
    args = build_parser().parse_args(argv)
    if args.out is None and not args.serve:
        raise UserError("name the site's folder with --out DIR, or pass --serve to look at it at once")
    if args.out is not None:
        return build_and_serve(args, args.out)
    with tempfile.TemporaryDirectory(prefix="deliberation-view-") as folder:  # removed when serving stops
        return build_and_serve(args, folder)


def build_and_serve(args: argparse.Namespace, out: str) -> Built:
    with user_input(args.source):
        if is_trace(args.source):
            set_only = [flag for flag, given in (("--split", args.split), ("--problems", args.problems),
                                                 ("--chosen-targets", args.chosen_targets)) if given]
            if set_only:
                raise UserError(f"{', '.join(set_only)} choose a replay set's problems; {args.source} is a trace file")
            built = build_trace_site([args.source, *args.trace], out, args.labels)
        else:
            built = build_set_site(args.source, out, splits=args.split, problems=args.problems, traces=args.trace,
                                   labels=args.labels, stream=args.stream, chosen_targets=args.chosen_targets)
    print(f"{built.pages} pages in {built.seconds:.1f} s: {Path(built.out) / 'index.html'}", flush=True)
    if args.serve:
        with user_input("--port"), serving(built.out, args.port) as url:
            print(f"serving {url} (Ctrl-C stops)", flush=True)
            signal.signal(signal.SIGTERM, stop)  # a kill ends the serving as Ctrl-C does (a temporary site is removed)
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
    return built


if __name__ == "__main__":
    main()
    sys.exit(0)
