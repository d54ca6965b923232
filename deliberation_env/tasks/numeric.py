"""Extracting and normalising numeric final answers from free-form LLM text.

All regexes here are linear-time (no nested or adjacent unbounded quantifiers), and numbers
longer than ``MAX_DIGITS`` characters are ignored, so arbitrary text is safe.

Normal form: integers without sign ``+``, commas or leading zeros (``"1,080"`` -> ``"1080"``,
``"025"`` -> ``"25"``, ``"27.0"`` -> ``"27"``); terminating decimals exact and without
trailing zeros (``"12.50"`` -> ``"12.5"``, ``"3/8"`` -> ``"0.375"``); other fractions reduced
(``"2/6"`` -> ``"1/3"``). ``$``, ``%`` and units around the number are dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from fractions import Fraction

from deliberation_env.tasks.extract import after_answer_marker, after_hashes, first_sentence, is_text, last_boxed

MAX_DIGITS = 200

# A sign only when it does not follow a word character or ")" (so "3-2" is 3 and 2).
_NUMBER = (
    r"(?:(?<![\w)])[-−+])?\\?\$?[ ]?"
    r"(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"
    r"(?:[ ]?/[ ]?\d+)?"
)
_NUMBER_RE = re.compile(_NUMBER)
_LATEX_FRAC_RE = re.compile(r"(-?)\\[dt]?frac\{(-?\d{1,50})\}\{(\d{1,50})\}")
_LATEX_FRAC_SHORT_RE = re.compile(r"\\[dt]?frac(\d)(\d)")
_LATEX_NOISE_RE = re.compile(r"\\[!,;: ]|\{,\}|\\left|\\right|\\text\{|\\mathrm\{|\\mbox\{")


def normalize_number(text: str) -> str | None:
    """Canonical string of one number (see the module docstring), or None if ``text`` is not one."""
    cleaned = text.strip().replace("−", "-").replace(",", "").replace("\\$", "").replace("$", "")
    cleaned = cleaned.replace(" ", "").rstrip("%").lstrip("+")
    if not cleaned or len(cleaned) > MAX_DIGITS:
        return None
    digits = cleaned[1:] if cleaned[0] == "-" else cleaned
    if digits.isascii() and digits.isdigit():  # a plain integer: the common case, without Fraction's parser
        return str(int(cleaned))
    try:
        value = Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None
    return format_fraction(value)


def format_fraction(value: Fraction) -> str:
    """An exact decimal when the denominator divides a power of ten, else ``p/q``."""
    if value.denominator == 1:
        return str(value.numerator)
    rest, twos, fives = value.denominator, 0, 0
    while rest % 2 == 0:
        rest, twos = rest // 2, twos + 1
    while rest % 5 == 0:
        rest, fives = rest // 5, fives + 1
    if rest != 1:
        return f"{value.numerator}/{value.denominator}"
    places = max(twos, fives)
    digits = str(abs(value.numerator) * 10**places // value.denominator).rjust(places + 1, "0")
    sign = "-" if value < 0 else ""
    return f"{sign}{digits[:-places]}.{digits[-places:]}".rstrip("0")


def clean_latex_numbers(text: str) -> str:
    """Rewrite ``\\frac{3}{4}`` as ``3/4`` and drop LaTeX spacing and ``\\text{`` wrappers, so
    that numbers written in LaTeX are found by the plain-number pattern."""
    if "\\" not in text and "{," not in text:
        return text
    text = _LATEX_FRAC_SHORT_RE.sub(r"\1/\2", text)
    text = _LATEX_FRAC_RE.sub(r"\1\2/\3", text)
    return _LATEX_NOISE_RE.sub("", text)


def first_number(text: str) -> str | None:
    """The first number in ``text``, normalised."""
    match = _NUMBER_RE.search(clean_latex_numbers(text))
    return normalize_number(match.group(0)) if match else None


def last_number(text: str) -> str | None:
    """The last number in ``text``, normalised."""
    last = None
    for last in _NUMBER_RE.finditer(clean_latex_numbers(text)):  # noqa: B007
        pass
    return normalize_number(last.group(0)) if last else None


def _leading_number(window: str) -> str | None:
    """The number that ``window`` starts with (``#### 18``, not a Markdown heading ``#### Step 2``)."""
    match = _NUMBER_RE.match(clean_latex_numbers(window))
    return normalize_number(match.group(0)) if match else None


def _marker_number(window: str) -> str | None:
    """The number stated after an answer marker: in "10 - 4 = 6." the part after the last "="."""
    sentence = first_sentence(window)
    if "=" in sentence:
        sentence = sentence.rsplit("=", 1)[1]
    return first_number(sentence)


def extract_number(text: str) -> str | None:
    """The final numeric answer in ``text``, normalised, or None.

    In order: the number right after the last ``####``; in the last ``\\boxed{}``; after the last
    answer marker ("The answer is", "Answer:", "final answer is"); else the last number.
    """
    if not isinstance(text, str):
        return None
    for window, pick in ((after_hashes(text), _leading_number), (last_boxed(text), first_number),
                         (after_answer_marker(text), _marker_number)):
        if window:
            found = pick(window)
            if found is not None:
                return found
    return last_number(text)


def numbers_equal(a: str | None, b: str | None) -> bool:
    """Numeric equality of two answers (``"27"`` equals ``"27.0"``, ``"1,080"`` equals ``"1080"``);
    False for None and for text that is not valid Unicode."""
    if not is_text(a) or not is_text(b):
        return False
    if a == b:
        return True
    left, right = normalize_number(a), normalize_number(b)
    return left is not None and left == right


def numeric_distractors(
    gold: str,
    intermediates: Iterable[str] = (),
    low: int | None = None,
    high: int | None = None,
    limit: int = 4,
) -> list[str]:
    """Plausible wrong answers for a numeric gold: intermediate results first (a forgotten
    last step), then off-by-one, factor-of-two, sign and factor-of-ten slips; normalised,
    distinct, different from ``gold`` and (for integers) inside ``[low, high]``."""
    gold_norm = normalize_number(gold)
    if gold_norm is None:
        return []
    value = Fraction(gold_norm)
    candidates = [normalize_number(x) for x in intermediates]
    slips = [value + 1, value - 1, value * 2, value / 2, -value, value * 10, value + 2, value - 2]
    candidates += [format_fraction(x) for x in slips]
    result: list[str] = []
    for candidate in candidates:
        if candidate is None or candidate == gold_norm or candidate in result:
            continue
        number = Fraction(candidate)
        if value.denominator == 1 and number.denominator != 1:
            continue  # an integer answer's slips stay integers
        if (low is not None and number < low) or (high is not None and number > high):
            continue
        result.append(candidate)
        if len(result) == limit:
            break
    return result
