"""Extracting and normalising numeric final answers from free-form LLM text.

All regexes here are linear-time (no nested quantifiers), so arbitrary text is safe.
"""

from __future__ import annotations

import re
from fractions import Fraction

_NUMBER = r"[-−+]?\$?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s?/\s?\d+)?%?"
_NUMBER_RE = re.compile(_NUMBER)
_MARKERS = (
    re.compile(r"####\s*(" + _NUMBER + ")"),
    re.compile(r"\\boxed\{\s*(" + _NUMBER + r")\s*\}"),
    re.compile(r"(?i)(?:final answer|the answer|answer)\s*(?:is|:|=)?\s*:?\s*\**\s*(" + _NUMBER + ")"),
)


def normalize_number(text: str) -> str | None:
    """Canonical string of a number: ``"1,234.50"`` -> ``"1234.5"``, ``"3/4"`` -> ``"3/4"``, ``"12.0"`` -> ``"12"``."""
    cleaned = text.strip().replace("−", "-").replace(",", "").replace("$", "").replace(" ", "")
    cleaned = cleaned.rstrip("%").lstrip("+")
    if not cleaned:
        return None
    try:
        value = Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None
    if value.denominator == 1:
        return str(value.numerator)
    as_float = float(value)
    if Fraction(repr(as_float)) == value:
        return repr(as_float)
    return f"{value.numerator}/{value.denominator}"


def extract_number(text: str) -> str | None:
    """The final numeric answer in ``text``: an explicit marker (``####``, ``\\boxed{}``,
    "the answer is") if present, else the last number; normalised, or None."""
    for pattern in _MARKERS:
        matches = pattern.findall(text)
        if matches:
            return normalize_number(matches[-1])
    numbers = _NUMBER_RE.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


def numbers_equal(a: str | None, b: str | None) -> bool:
    """Numeric equality of two normalised answers (``"27"`` equals ``"27.0"``)."""
    if a is None or b is None:
        return False
    if a == b:
        return True
    left, right = normalize_number(a), normalize_number(b)
    return left is not None and left == right
