"""Build the static site of a replay set or of trace files, and serve a built site on 127.0.0.1.

A site is a folder: ``index.html``, ``assets/`` (one stylesheet, one script) and ``problems/`` (one page per
problem), so no page grows with the set and every page opens from disk (``file://``) as well as over HTTP.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from deliberation_env.replay.dataset import ReplaySet
from deliberation_env.view.episodes import Policy, load_policies, problem_keys
from deliberation_env.view.pages import index_page, legend_tags, problem_file, problem_page
from deliberation_env.view.trace_pages import trace_file, trace_index_page, trace_problem_page
from deliberation_env.view.tree import ProblemTree, record_texts, walk_split

ASSETS = Path(__file__).resolve().parent / "assets"


@dataclass
class Built:
    """What a build wrote."""

    out: Path
    pages: int
    seconds: float


def build_set_site(source: str | os.PathLike | ReplaySet, out: str | os.PathLike, *,
                   splits: Sequence[str] | None = None, problems: Sequence[int] | None = None,
                   traces: Sequence[str | os.PathLike] = (), labels: Sequence[str] | None = None, stream: int = 0,
                   chosen_targets: bool = False) -> Built:
    """The site of a replay set: every problem of ``splits`` (default: all), or the problem indices ``problems``
    of each; ``traces``: trace files whose policies (``labels``: these only) are marked on the grids and shown
    beside the recording."""
    started = time.perf_counter()
    replay = source if isinstance(source, ReplaySet) else ReplaySet(source)
    card = replay.card
    chosen = list(splits or sorted(card.splits))
    missing = [split for split in chosen if split not in card.splits]
    if missing:
        raise ValueError(f"replay set {card.name!r} has no split {missing[0]!r}; it holds {sorted(card.splits)}")
    if chosen_targets and card.concede_targets != "all":
        raise ValueError(f"replay set {card.name!r} recorded CONCEDE to its rule's peer only, so it has no grid of "
                         "chosen concede targets: drop --chosen-targets")
    policies = load_policies(traces, labels)
    texts = record_texts(replay)
    trees: list[ProblemTree] = []
    for split in chosen:
        count = len(card.splits[split])
        indices = None if problems is None else [i for i in problems if i < count]
        trees += walk_split(replay, split, indices, stream=stream, chosen_targets=chosen_targets, texts=texts)
    if not trees:
        raise ValueError(f"no problems chosen: the splits {chosen} hold {[len(card.splits[s]) for s in chosen]}")
    game = (f"{trees[0].num_actions} actions per agent, {len(trees[0].cells)} joint actions, stream {stream}"
            + (" (CONCEDE to a named peer)" if chosen_targets else ""))
    target = prepare(out)
    tags = legend_tags(policies)
    files = [problem_file(tree) for tree in trees]
    for i, tree in enumerate(trees):
        neighbours = (files[i - 1] if i else None, files[i + 1] if i + 1 < len(files) else None)
        write(target / files[i], problem_page(card, tree, policies, neighbours, tags))
    built = f"{len(trees)} problems" + (f", policies from {len(traces)} trace file(s)" if traces else "")
    write(target / "index.html", index_page(card, trees, policies, game, built))
    return Built(target, len(trees) + 1, time.perf_counter() - started)


def build_trace_site(traces: Sequence[str | os.PathLike], out: str | os.PathLike,
                     labels: Sequence[str] | None = None) -> Built:
    """The site of trace files: every problem a policy (``labels``: these only) played, their episodes side by
    side."""
    started = time.perf_counter()
    policies: list[Policy] = load_policies(traces, labels)
    keys = problem_keys(policies)
    if not keys:
        raise ValueError(f"the trace files {[str(t) for t in traces]} hold no episodes")
    title = ", ".join(Path(t).name for t in traces)
    target = prepare(out)
    for number, key in enumerate(keys):
        write(target / trace_file(number), trace_problem_page(title, key, number, len(keys), policies))
    write(target / "index.html", trace_index_page(title, keys, policies))
    return Built(target, len(keys) + 1, time.perf_counter() - started)


def prepare(out: str | os.PathLike) -> Path:
    """The output folder with fresh assets and an empty ``problems/`` (the pages of an earlier build are removed;
    a folder that holds anything else is refused, so that no build deletes files it did not write)."""
    target = Path(out)
    if target.exists() and not target.is_dir():
        raise ValueError(f"--out {target}: a file, not a folder")
    if target.is_dir() and any(target.iterdir()) and not (target / "assets" / "view.css").is_file():
        raise ValueError(f"--out {target}: a folder that holds other files, not a site of this view; name a new or "
                         "empty folder")
    if (target / "problems").is_dir():
        shutil.rmtree(target / "problems")
    (target / "problems").mkdir(parents=True, exist_ok=True)
    shutil.copytree(ASSETS, target / "assets", dirs_exist_ok=True)
    return target


def write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the site's folder without a log line per request."""

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


@contextmanager
def serving(folder: str | os.PathLike, port: int = 0) -> Iterator[str]:
    """Serve ``folder`` on 127.0.0.1 (``port`` 0: a free one) in a thread; yields its URL, stops on exit."""
    handler = functools.partial(QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
