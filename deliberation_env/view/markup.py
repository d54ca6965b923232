"""HTML pieces shared by every page of the view: the page shell, escaping, badges, collapsible texts.

Everything that comes from a recording (model completions, program output, questions, labels) goes through
``esc``: it is shown as text, never as markup. The pages load one script and one stylesheet from ``assets/`` and
carry a Content-Security-Policy that allows no other script, no inline script and no inline style, so even markup
that slipped through could not run.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; base-uri 'none'; "
       "form-action 'none'")
"""The pages' Content-Security-Policy: scripts and styles from the site's own files only."""


def esc(value: object) -> str:
    """``value`` as HTML text (quotes escaped too, so it is safe in attributes)."""
    return html.escape("" if value is None else str(value), quote=True)


def page(title: str, body: str, root: str = "") -> str:
    """A whole page: ``root`` is the relative path from the page to the site's top folder ("" or "../")."""
    return (
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{esc(title)}</title>\n"
        f"<link rel=\"icon\" href=\"{root}assets/favicon.svg\" type=\"image/svg+xml\">\n"
        f"<link rel=\"stylesheet\" href=\"{root}assets/view.css\">\n"
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
          attrs: Iterable[Mapping[str, str]] = ()) -> str:
    """A table; header cells are escaped, body cells are HTML already. ``attrs``: data attributes per row."""
    head = "".join(f"<th>{esc(cell)}</th>" for cell in header)
    body, extras = [], list(attrs)
    for i, row in enumerate(rows):
        extra = "".join(f" {name}=\"{esc(value)}\"" for name, value in (extras[i] if i < len(extras) else {}).items())
        body.append(f"<tr{extra}>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>")
    klass = f" class=\"{cls}\"" if cls else ""
    return f"<table{klass}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def select(key: str, label: str, options: Iterable[tuple[str, str]]) -> str:
    """A filter: rows whose ``data-<key>`` equals the chosen value stay visible ("" keeps every row)."""
    choices = "".join(f"<option value=\"{esc(value)}\">{esc(text)}</option>" for value, text in options)
    return (f"<label>{esc(label)} <select data-key=\"{esc(key)}\"><option value=\"\">any</option>{choices}"
            "</select></label>")
