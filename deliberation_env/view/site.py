"""Build the static site of a replay set or of trace files, and serve a built site on 127.0.0.1.

A site is a folder: ``index.html``, ``data.js`` (the index's rows as data, which its filters, sorting and grouping
and each problem page's previous/next read), ``assets/`` (one stylesheet, one script) and ``problems/`` (one page
per problem), so no page grows with the set and every page opens from disk (``file://``) as well as over HTTP.
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
from deliberation_env.tasks.base import Problem
from deliberation_env.view.episodes import Policy, ProblemKey, load_policies, problem_keys
from deliberation_env.view.pages import index_page, legend_tags, problem_file, problem_page, set_listing
from deliberation_env.view.trace_pages import trace_file, trace_index_page, trace_listing, trace_problem_page
from deliberation_env.view.tree import ProblemTree, walk_split

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
    other = next((e for policy in policies for played in policy.episodes.values() for e in played
                  if e.replay_set is not None and e.replay_set != replay.identity), None)
    if other is not None:
        raise ValueError(f"a trace's episodes (label {other.label!r}) were played on replay set {other.replay_set}, "
                         f"the view shows {replay.identity}: their actions and outcomes are another recording's; "
                         "show them with the set they were played on, or trace a run on this one")
    trees: list[ProblemTree] = []
    for split in chosen:
        count = len(card.splits[split])
        indices = None if problems is None else [i for i in problems if i < count]
        trees += walk_split(replay, split, indices, stream=stream, chosen_targets=chosen_targets)
    if not trees:
        raise ValueError(f"no problems chosen: the splits {chosen} hold {[len(card.splits[s]) for s in chosen]}")
    game = (f"{trees[0].num_actions} actions per agent, {len(trees[0].cells)} joint actions, stream {stream}"
            + (" (CONCEDE to a named peer)" if chosen_targets else ""))
    target = prepare(out)
    tags = legend_tags(policies)
    files = [problem_file(tree) for tree in trees]
    for i, tree in enumerate(trees):
        write(target / files[i], problem_page(card, tree, policies, i, neighbours(files, i), tags))
    built = f"{len(trees)} problems" + (f", policies from {len(traces)} trace file(s)" if traces else "")
    write(target / "index.html", index_page(card, trees, policies, game, built))
    write(target / "data.js", set_listing(trees, policies))
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
    problems = trace_problems(policies, keys)
    target = prepare(out)
    for number, key in enumerate(keys):
        write(target / trace_file(number), trace_problem_page(title, key, number, len(keys), policies, problems[key]))
    write(target / "index.html", trace_index_page(title, keys, policies, problems))
    write(target / "data.js", trace_listing(keys, policies, problems))
    return Built(target, len(keys) + 1, time.perf_counter() - started)


def trace_problems(policies: Sequence[Policy], keys: Sequence[ProblemKey]) -> dict[ProblemKey, Problem | None]:
    """Each traced problem, rebuilt from its episodes' task and settings (None where the task cannot be built here,
    e.g. without its data)."""
    from deliberation_env.analysis.sim_fit import traced_problem, traced_problems  # scipy: only trace sites pay

    first = {key: next(e for p in policies for e in p.episodes.get(key, [])) for key in keys}
    found = traced_problems(list(first.values()))
    return {key: None if (built := found[traced_problem(episode)]) is None else built[1]
            for key, episode in first.items()}


def neighbours(files: Sequence[str], i: int) -> tuple[str | None, str | None]:
    """The pages before and after page ``i`` in the set's order (the links a page has without its script)."""
    return files[i - 1] if i else None, files[i + 1] if i + 1 < len(files) else None


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
