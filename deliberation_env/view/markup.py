"""HTML pieces shared by every page of the view: the page shell, escaping, badges, collapsible texts.

Everything that comes from a recording (model completions, program output, questions, labels) goes through
``esc``: it is shown as text, never as markup, and its bidirectional controls (U+202E and its kin) are shown as
``[U+202E]`` instead of reordering the text around them. The pages load the site's ``data.js`` (the index's rows as
data: ``listing``), one script and one stylesheet from ``assets/``, and carry a Content-Security-Policy that allows
no other script, no inline script and no inline style, so even markup that slipped through could not run.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; base-uri 'none'; "
       "form-action 'none'")
"""The pages' Content-Security-Policy: scripts and styles from the site's own files only."""


BIDI_CONTROLS = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""The invisible characters that reorder text (embeddings, overrides, isolates and marks)."""


def show_controls(text: str) -> str:
    """``text`` with each bidirectional control written out (``[U+202E]``): a completion that holds one reverses
    nothing on the page, and the reader sees that it was there."""
    return BIDI_CONTROLS.sub(lambda found: f"[U+{ord(found.group()):04X}]", text)


def esc(value: object) -> str:
    """``value`` as HTML text (quotes escaped too, so it is safe in attributes; bidi controls shown)."""
    return html.escape(show_controls("" if value is None else str(value)), quote=True)


def page(title: str, body: str, root: str = "") -> str:
    """A whole page: ``root`` is the relative path from the page to the site's top folder ("" or "../")."""
    return (
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{esc(title)}</title>\n"
        f"<link rel=\"icon\" href=\"{root}assets/favicon.svg\" type=\"image/svg+xml\">\n"
        f"<link rel=\"stylesheet\" href=\"{root}assets/view.css\">\n"
        f"<script src=\"{root}data.js\" defer></script>\n"
        f"<script src=\"{root}assets/view.js\" defer></script>\n"
        f"</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def mark(correct: bool | None) -> str:
    """A right/wrong class name (empty when unknown)."""
    return "" if correct is None else "right" if correct else "wrong"


def answer_chip(answer: str | None, correct: bool | None, title: str = "") -> str:
    """An answer in a coloured chip: green when right, red when wrong."""
    shown = "none" if answer is None else answer
    tip = f" title=\"{esc(title)}\"" if title else ""
    return f"<span class=\"chip {mark(correct)}\"{tip}>{esc(shown)}</span>"


def fraction_chip(right: float | None, title: str = "") -> str:
    """A share of right episodes (a policy played several seeds) as a chip."""
    if right is None:
        return "<span class=\"chip none\">-</span>"
    correct = True if right == 1 else False if right == 0 else None
    tip = f" title=\"{esc(title)}\"" if title else ""
    text = "right" if right == 1 else "wrong" if right == 0 else f"{right:.2f}"
    return f"<span class=\"chip {mark(correct) or 'mixed'}\"{tip}>{text}</span>"


def text_block(summary: str, text: str | None, open_: bool = False, kind: str = "text") -> str:
    """A collapsible block of recorded text (a completion, a program, its output)."""
    if text is None:
        return ""
    shown = text if text.strip() else "(empty)"
    return (f"<details class=\"{kind}\"{' open' if open_ else ''}><summary>{esc(summary)}</summary>"
            f"<pre>{esc(shown)}</pre></details>")


def definitions(items: Iterable[tuple[str, str]]) -> str:
    """A definition list; values are HTML already (escape them first)."""
    rows = "".join(f"<dt>{esc(name)}</dt><dd>{value}</dd>" for name, value in items)
    return f"<dl>{rows}</dl>"


def table(header: Iterable[str], rows: Iterable[Iterable[str]], cls: str = "",
          attrs: Iterable[Mapping[str, str]] = (), sorts: Mapping[int, str] | None = None) -> str:
    """A table in a container that scrolls sideways (the page never does); header cells are escaped, body cells are
    HTML already. ``attrs``: data attributes per row; ``sorts``: the sort key of a column (its header sorts by it)."""
    sorts = sorts or {}
    head = "".join(f"<th><button type=\"button\" class=\"sort\" data-sort=\"{esc(sorts[i])}\">{esc(cell)}</button></th>"
                   if i in sorts else f"<th>{esc(cell)}</th>" for i, cell in enumerate(header))
    body, extras = [], list(attrs)
    for i, row in enumerate(rows):
        extra = "".join(f" {name}=\"{esc(value)}\"" for name, value in (extras[i] if i < len(extras) else {}).items())
        body.append(f"<tr{extra}>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>")
    klass = f" class=\"{cls}\"" if cls else ""
    return (f"<div class=\"scroll\"><table{klass}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody>"
            "</table></div>")


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


RIGHT_WRONG = [("1", "right"), ("0", "wrong")]
"""The options of a right/wrong filter."""


def select(key: str, label: str, options: Iterable[tuple[str, str]]) -> str:
    """A filter: rows whose ``data-<key>`` equals the chosen value stay visible ("" keeps every row)."""
    choices = "".join(f"<option value=\"{esc(value)}\">{esc(text)}</option>" for value, text in options)
    return (f"<label><span class=\"label\">{esc(label)}</span> <select data-key=\"{esc(key)}\" autocomplete=\"off\">"
            f"<option value=\"\">any</option>{choices}</select></label>")


def search_box(label: str) -> str:
    return (f"<label><span class=\"label\">{esc(label)}</span> <input type=\"search\" id=\"search\" "
            "autocomplete=\"off\" placeholder=\"contains...\"></label>")


def ordering(sorts: Sequence[tuple[str, str]], groups: Sequence[tuple[str, str]]) -> str:
    """The sort and group controls of an index (their keys name the listing's sort values and filters)."""
    sort = "".join(f"<option value=\"{esc(key)}\">{esc(label)}</option>" for key, label in sorts)
    group = "".join(f"<option value=\"{esc(key)}\">{esc(label)}</option>" for key, label in groups)
    return (f"<div class=\"ordering\"><label>sort by <select id=\"sort\" autocomplete=\"off\">{sort}</select></label>"
            "<label><input type=\"checkbox\" id=\"desc\" autocomplete=\"off\"> descending</label>"
            f"<label>group by <select id=\"group\" autocomplete=\"off\"><option value=\"\">nothing</option>{group}"
            "</select></label></div>")


Value = str | list[str]
"""A row's value of a filter: one value, or several (the row passes a filter that names any of them)."""


def listing(rows: Sequence[tuple[str, str, Mapping[str, Value], Mapping[str, Any]]], filters: Sequence[str],
            sorts: Sequence[tuple[str, str]], groups: Sequence[tuple[str, str]],
            outcomes: Sequence[tuple[str, str]]) -> str:
    """The site's ``data.js``: an index's rows as data, which the index filters, sorts and groups and a problem
    page's previous/next follow. A row: its page, its search text, its value of each filter key and of each sort
    key (a number, a text, or None: sorted last). ``outcomes``: the right/wrong filters a group's heading shares."""
    data = {"filters": list(filters), "sorts": [list(s) for s in sorts], "groups": [list(g) for g in groups],
            "outcomes": [list(o) for o in outcomes],
            "rows": [[file, search.lower(), [values.get(key, "") for key in filters],
                      [order.get(key) for key, _ in sorts]] for file, search, values, order in rows]}
    return "window.VIEW_DATA = " + json.dumps(data, separators=(",", ":"), ensure_ascii=False) + ";\n"


def nav_bar(number: int, previous: str | None, following: str | None) -> str:
    """A problem page's links: the index, and the previous and next problems of the set's order (the script makes
    them follow the index's filters and sort, which the page's URL carries)."""
    def link(rel: str, target: str | None, text: str) -> str:
        return (f"<a rel=\"{rel}\" href=\"../{esc(target)}\">{text}</a>" if target else
                f"<a rel=\"{rel}\" hidden>{text}</a>")

    return (f"<nav id=\"nav\" data-n=\"{number}\"><a class=\"up\" href=\"../index.html\">all problems</a>"
            f"{link('prev', previous, '← previous')}{link('next', following, 'next →')}"
            "<span id=\"position\" class=\"n\"></span></nav>")


def question_panel(question: str, gold: str, more: str = "") -> str:
    """The question and the gold answer (``more``: HTML after them on the same line)."""
    return (f"<section class=\"panel question\"><p class=\"q\" id=\"question\">{esc(question)}</p>"
            f"<p>gold answer <span class=\"chip gold\" id=\"gold\">{esc(gold)}</span>{more}</p></section>")
