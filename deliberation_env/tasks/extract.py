"""Shared text helpers for the benchmark tasks: JSONL loading and final-answer spans.

Everything here runs in time linear in the input (no regex with nested or adjacent
unbounded quantifiers; brace matching is one pass), so arbitrary LLM text is safe.

- ``read_lines(path)``: the lines of a UTF-8 text file (``.gz`` allowed); bytes that are not
  UTF-8, a corrupt or truncated gzip file, or an unreadable file raise ``DataFormatError``
  naming the file, the line and the fix;
- ``load_jsonl(path, fields)``: rows of a JSONL (or ``.jsonl.gz``) file, with errors that
  name the file and the line (bad JSON, a missing field, a wrong type);
- ``last_boxed(text)``: the content of the last ``\\boxed{...}`` (nested braces allowed);
- ``after_hashes(text)``: what follows the last ``#### `` (GSM8K's gold format);
- ``after_answer_marker(text)``: what follows the last "The answer is" / "Answer:" /
  "final answer is" marker, up to the end of that line (bounded).
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeGuard

from deliberation_env.tasks.base import DATA_ENV_VAR

FieldSpec = Mapping[str, type | tuple[type, ...]]

MAX_WINDOW = 200
"""Characters after a marker that are searched for the answer."""


def is_text(value: object) -> TypeGuard[str]:
    """Whether ``value`` is a str that UTF-8 can encode. Text with lone surrogates (``"\\ud800"``,
    e.g. from a bad JSON escape in a server's reply) is not: graders count it as a wrong answer."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class DataFormatError(ValueError):
    """A malformed data row; the message names the file (or hub dataset) and the line (or row)."""


def _type_names(expected: type | tuple[type, ...]) -> str:
    types = expected if isinstance(expected, tuple) else (expected,)
    return " or ".join(t.__name__ for t in types)


def check_fields(row: Any, fields: FieldSpec, where: str) -> dict[str, Any]:
    """Check that ``row`` is an object holding every field of ``fields`` with the right type.

    A field spec may be a tuple of names joined by ``|`` (``"problem|question"``): one of them
    must be present.
    """
    if not isinstance(row, dict):
        raise DataFormatError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for name, expected in fields.items():
        options = name.split("|")
        present = [option for option in options if option in row and row[option] is not None]
        if not present:
            raise DataFormatError(f"{where}: missing field {' or '.join(repr(o) for o in options)} (has {sorted(row)})")
        value = row[present[0]]
        bad_bool = isinstance(value, bool) and bool not in (expected if isinstance(expected, tuple) else (expected,))
        if bad_bool or not isinstance(value, expected):
            raise DataFormatError(
                f"{where}: field {present[0]!r} should be {_type_names(expected)}, got {type(value).__name__} {value!r:.60}"
            )
    return row


REPLACE_ADVICE = (f"Replace it with an intact copy (download it again), or point {DATA_ENV_VAR} "
                  "(or data_dir=) at a folder whose files are intact")


def read_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` for each line of a UTF-8 text file, ``.gz`` files decompressed.

    Raises ``DataFormatError`` naming the file, the line and the fix for bytes that are not UTF-8
    (a binary file), a corrupt or truncated gzip file, or a file that cannot be read.
    """
    path = Path(path)
    number = 0
    try:
        with (gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")) as handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    yield number, raw.decode("utf-8-sig" if number == 1 else "utf-8")
                except UnicodeDecodeError as error:
                    raise DataFormatError(
                        f"{path}, line {number}: not UTF-8 text ({error.reason} at byte {error.start + 1} of the "
                        f"line: {raw[max(0, error.start - 10): error.start + 10]!r}); is it a binary file? "
                        f"Data files must be UTF-8 JSON lines. {REPLACE_ADVICE}."
                    ) from None
    except (gzip.BadGzipFile, zlib.error, EOFError) as error:
        where = f"after line {number}" if number else "at its start"
        raise DataFormatError(
            f"{path}: corrupt or truncated gzip file ({type(error).__name__}: {error}; {where}). "
            f"Check it with `gzip -t {path}`. {REPLACE_ADVICE}."
        ) from None
    except OSError as error:  # a folder, no permission, an I/O error
        raise DataFormatError(f"{path}: cannot be read ({error.strerror or error}). {REPLACE_ADVICE}.") from None


def parse_json_line(line: str, where: str) -> Any:
    """``json.loads`` whose errors (bad JSON, absurd nesting, over-long integers) name ``where``."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as error:
        raise DataFormatError(f"{where}: invalid JSON ({error.msg} at column {error.colno})") from None
    except (ValueError, RecursionError) as error:
        raise DataFormatError(f"{where}: unreadable JSON ({type(error).__name__}: {str(error)[:200]})") from None


def load_jsonl(path: str | Path, fields: FieldSpec | None = None) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, row)`` for each non-blank line of a JSONL file (``.gz`` allowed).

    Raises ``DataFormatError`` naming the file and line for bad JSON, a row that is not an
    object, or (with ``fields``) a missing field or a field of the wrong type.
    """
    path = Path(path)
    rows: list[tuple[int, dict[str, Any]]] = []
    for number, line in read_lines(path):
        if line.strip():
            where = f"{path}, line {number}"
            rows.append((number, check_fields(parse_json_line(line, where), fields or {}, where)))
    return rows


def convert_rows(
    rows: Iterable[tuple[int, dict[str, Any]]],
    convert: Callable[[dict[str, Any], int], Any],
    source: str,
    unit: str = "line",
) -> list[Any]:
    """Apply ``convert(row, index)`` to each row; a ValueError becomes a DataFormatError naming
    ``source`` and the row's line (or hub row) number."""
    converted = []
    for index, (number, row) in enumerate(rows):
        try:
            converted.append(convert(row, index))
        except DataFormatError:
            raise
        except (ValueError, KeyError, TypeError) as error:
            raise DataFormatError(f"{source}, {unit} {number}: {error}") from None
    return converted


# ---------------------------------------------------------------------------- spans
def matching_braces(text: str) -> dict[int, int]:
    """Index of each ``{`` -> index of its matching ``}`` (one linear pass; escaped ``\\{`` ignored)."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    previous = ""
    for index, char in enumerate(text):
        if previous != "\\":
            if char == "{":
                stack.append(index)
            elif char == "}" and stack:
                pairs[stack.pop()] = index
        previous = char if previous != "\\" else ""
    return pairs


_BOX_RE = re.compile(r"\\(?:boxed|fbox|framebox)\s{0,3}")


def last_boxed(text: str) -> str | None:
    """The content of the last complete ``\\boxed{...}`` (also ``\\fbox``, ``\\framebox``, and
    ``\\boxed 5``), nested braces kept; None if there is none."""
    if "\\boxed" not in text and "\\fbox" not in text and "\\framebox" not in text:
        return None
    starts = [match.end() for match in _BOX_RE.finditer(text)]
    pairs: dict[int, int] | None = None
    for start in reversed(starts):
        if start < len(text) and text[start] == "{":
            if pairs is None:
                pairs = matching_braces(text)
            if start in pairs:
                return text[start + 1 : pairs[start]].strip()
        elif start < len(text) and text[start - 1].isspace():
            word = re.match(r"[^\s$]{1,50}", text[start:])  # "\boxed 5"
            if word:
                return word.group(0)
    return None


_HASHES_RE = re.compile(r"####[ \t]{0,20}")
_MARKER_RE = re.compile(
    r"(?i)\b(?:final answer|the answer|answer|correct option|correct choice|the option|the choice)\b"
    r"(?: is| would be| should be|)[ \t]{0,5}(?::|=|is\b)?"
)


def _window(text: str, start: int) -> str:
    """From ``start`` to the end of that line, at most MAX_WINDOW characters, stripped."""
    end = text.find("\n", start, start + MAX_WINDOW)
    return text[start : end if end >= 0 else start + MAX_WINDOW].strip()


def after_hashes(text: str) -> str | None:
    """The rest of the line after the last ``####`` (GSM8K's final-answer marker), or None."""
    matches = list(_HASHES_RE.finditer(text)) if "####" in text else []
    return _window(text, matches[-1].end()) if matches else None


def after_answer_marker(text: str) -> str | None:
    """The rest of the line after the last answer marker ("The answer is", "Answer:",
    "The final answer is", "The correct option is", ...); None if there is no marker or the
    rest is empty. Markdown emphasis and ``$`` around the answer are left to the caller."""
    for match in reversed(list(_MARKER_RE.finditer(text))):
        window = _window(text, match.end()).lstrip(":*_ \t")
        if window:
            return window
    return None


def first_sentence(window: str) -> str:
    """``window`` cut at the first sentence end (". " or a final "."), keeping decimals."""
    match = re.search(r"\.(?:\s|$)", window)
    return window[: match.start()] if match else window
