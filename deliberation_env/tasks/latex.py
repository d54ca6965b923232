"""LaTeX final answers (MATH-style): light normalisation and mathematical equivalence.

``normalize_latex`` is cheap, idempotent and conservative; it makes equal-looking answers
equal strings (``\\dfrac`` -> ``\\frac``, ``\\left( ... \\right)`` -> ``( ... )``, no degree
signs, ``\\%``, ``\\$``, trailing units ``\\text{ cm}``, ``\\frac12`` -> ``\\frac{1}{2}``,
``k = 5`` -> ``5``), so a plurality vote sees them as one answer.

``latex_equal(pred, gold)`` first compares normal forms (and plain numbers exactly), then
asks ``math-verify`` (with sympy) under a wall-clock limit. It never raises: any error or
time-out counts as "not equal".

Time limit: in the main thread a ``SIGALRM`` interval timer (math-verify's own integer-second
alarms are switched off so they cannot cancel it); in other threads (or without
``signal.setitimer``, e.g. on Windows) signals are unavailable, so inputs that could make
sympy run long (huge exponents, factorials, sums, long strings) are refused instead.
"""

from __future__ import annotations

import logging
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache
from typing import Any, TypeVar

from deliberation_env.tasks.extract import is_text
from deliberation_env.tasks.numeric import normalize_number

T = TypeVar("T")
MAX_VERIFY_CHARS = 400
"""Answers longer than this are compared as strings only."""

_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), replacement)
    for pattern, replacement in (
        (r"\\[dt]frac(?![A-Za-z])", r"\\frac"),
        (r"\\(?:left|right|displaystyle|bigl|bigr|Bigl|Bigr)(?![A-Za-z])", ""),
        (r"(?<!\\)\\[!,;: ]|~", " "),
        (r"\^\s{0,3}\{?\s{0,3}\\circ\s{0,3}\}?|°|\\%|%|\\\$", ""),
        (r"\s{0,5}\\(?:text|mbox|mathrm)\{ [A-Za-z ]{1,40}\}(?:\^\{?[23]\}?)?", ""),  # trailing units
        (r"\\(?:text|textbf|mbox|mathrm)\{([^{}\\]{0,100})\}", r"\1"),
        (r"\s+", " "),
        (r"(?<![A-Za-z]) | (?![A-Za-z])", ""),
        (r"\\frac(\d)(\d)", r"\\frac{\1}{\2}"),
        (r"\\frac(\{[^{}]{1,50}\})(\d)", r"\\frac\1{\2}"),
        (r"\\sqrt(\d)", r"\\sqrt{\1}"),
    )
)
_ASSIGNMENT_RE = re.compile(r"[A-Za-z]=([^=A-Za-z]{1,200})")
_PLAIN_NUMBER_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+|-?\d+/\d+")


def _strip_wrappers(text: str) -> str:
    """Remove outer whitespace, trailing dots and matched ``$``/``\\(``/``\\[`` pairs, to a fixed
    point (index arithmetic, so linear even for thousands of nested wrappers)."""
    i, j = 0, len(text)
    while True:
        before = (i, j)
        while j > i and (text[j - 1].isspace() or text[j - 1] == "."):
            j -= 1
        while i < j and text[i].isspace():
            i += 1
        for left, right in _DELIMITERS:
            if j - i > len(left) + len(right) and text.startswith(left, i) and text.endswith(right, i, j):
                i, j = i + len(left), j - len(right)
                break
        if (i, j) == before:
            return text[i:j]


def _normalize_once(text: str) -> str:
    text = _strip_wrappers(text)
    for pattern, replacement in _RULES:
        text = pattern.sub(replacement, text)
    text = _strip_wrappers(text)
    assignment = _ASSIGNMENT_RE.fullmatch(text)
    if assignment:
        text = assignment.group(1)
    if _PLAIN_NUMBER_RE.fullmatch(text):
        text = normalize_number(text) or text
    return text


def normalize_latex(answer: str) -> str:
    """The light normal form of a LaTeX answer (see the module docstring); idempotent."""
    text = answer
    for _ in range(4):  # one pass almost always suffices; rules can expose a new wrapper
        normal = _normalize_once(text)
        if normal == text:
            break
        text = normal
    return text


def plain_number(text: str) -> Fraction | None:
    """The value of a normalised answer that is just a number, else None."""
    if not _PLAIN_NUMBER_RE.fullmatch(text):
        return None
    value = normalize_number(text)
    return Fraction(value) if value is not None else None


# ---------------------------------------------------------------------------- time limit
RETRY_SECONDS = 0.05
"""How soon the time limit fires again when its first signal was swallowed."""


class _TimeUp(BaseException):
    """Raised by the interval timer; a BaseException so library ``except Exception`` cannot swallow it."""


def _raise_time_up(signum: int, frame: Any) -> None:
    raise _TimeUp


def _drop_time_up(previous_hook: Callable[[Any], object]) -> Callable[[Any], None]:
    """An unraisable hook that drops a swallowed ``_TimeUp`` (expected: the next tick raises again) and passes
    anything else on. Without it the report of the swallowed signal (pytest's hook formats a traceback, reading
    source files) can outlast a tick and be cut short itself."""

    def hook(unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, _TimeUp):
            previous_hook(unraisable)

    return hook


def call_with_time_limit(func: Callable[[], T], seconds: float) -> T:
    """``func()``, interrupted after ``seconds`` (main thread only; raises TimeoutError).

    An interval timer already running (e.g. pytest-timeout's) is restored afterwards.
    """
    previous_handler = signal.signal(signal.SIGALRM, _raise_time_up)
    # The timer repeats: a _TimeUp raised where Python swallows exceptions (a weakref or __del__ callback run by
    # the garbage collector) would otherwise lose the limit; the next tick, RETRY_SECONDS later, raises again.
    previous_delay, previous_interval = signal.setitimer(signal.ITIMER_REAL, seconds, RETRY_SECONDS)
    if 0 < previous_delay < seconds:
        signal.setitimer(signal.ITIMER_REAL, previous_delay, RETRY_SECONDS)
    started = time.monotonic()
    previous_unraisable_hook = sys.unraisablehook  # installed last: a failure above leaves no hook behind
    sys.unraisablehook = _drop_time_up(previous_unraisable_hook)
    try:
        return func()
    except _TimeUp:
        signal.setitimer(signal.ITIMER_REAL, 0)  # at once: the next tick is RETRY_SECONDS away
        raise TimeoutError(f"gave up after {seconds} s") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        sys.unraisablehook = previous_unraisable_hook
        if previous_delay > 0:
            remaining = max(1e-3, previous_delay - (time.monotonic() - started))
            signal.setitimer(signal.ITIMER_REAL, remaining, previous_interval)


def _timer_available() -> bool:
    """An interval timer works here: POSIX, the main thread, and no SIGALRM handler installed
    outside Python (which could not be restored)."""
    return (
        hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGALRM) is not None
    )


_RISKY_RE = re.compile(r"\^\s{0,3}\{?\s{0,3}[-\d]{4,}|!|\^[^$]{0,40}\^|\\(?:sum|prod|int|lim)(?![A-Za-z])")


def _risky_without_timer(text: str) -> bool:
    return len(text) > MAX_VERIFY_CHARS // 2 or _RISKY_RE.search(text) is not None


# ---------------------------------------------------------------------------- math-verify
class _DropTimeoutWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


@lru_cache(maxsize=1)
def _math_verify() -> Any:
    """Import math-verify once (outside any time limit); ImportError explains the extra."""
    try:
        import math_verify  # noqa: PLC0415 (optional dependency, heavy import)
    except ImportError as error:
        raise ImportError(
            "MATH grading needs math-verify: pip install 'deliberation-env[tasks]' (math-verify, sympy)"
        ) from error
    for name in ("math_verify.parser", "math_verify.grader", "math_verify.utils"):
        logging.getLogger(name).addFilter(_DropTimeoutWarning())
    # Warm up outside any time limit: regex compilation and the LaTeX parser (a number), and sympy's first
    # symbolic comparison (an expansion), whose lazy imports alone took 0.3 s of the 0.5 s limit on an idle core.
    for left, right in (("\\frac{1}{2}", "0.5"), ("(x+1)^2", "x^2+2x+1")):
        math_verify.verify(math_verify.parse(f"${left}$", parsing_timeout=None),
                           math_verify.parse(f"${right}$", parsing_timeout=None), timeout_seconds=None)
    return math_verify


@lru_cache(maxsize=4096)
def _parse(latex: str) -> Any:
    """math-verify's parse of ``$latex$`` (cached: gold answers are parsed once)."""
    math_verify = _math_verify()
    return math_verify.parse(f"${latex}$", parsing_timeout=None)


def _verify(pred: str, gold: str) -> bool:
    math_verify = _math_verify()
    gold_parsed, pred_parsed = _parse(gold), _parse(pred)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(math_verify.verify(gold_parsed, pred_parsed, timeout_seconds=None))


def _balanced(text: str) -> bool:
    """Braces pair up, and as many brackets open as close (intervals such as ``[2,3)`` mix them)."""
    opened = text.count("(") + text.count("[")
    return text.count("{") == text.count("}") and opened == text.count(")") + text.count("]")


_VERIFIED: dict[tuple[str, str], bool] = {}
_VERIFIED_MAX = 100_000


def latex_equal(pred: str | None, gold: str, timeout: float = 0.5) -> bool:
    """Whether two LaTeX answers are mathematically equivalent (never raises).

    Normal forms equal -> True; both plain numbers -> exact comparison; too long (over
    ``MAX_VERIFY_CHARS``) or unbalanced brackets -> False; otherwise math-verify under
    ``timeout`` seconds (False on time-out or error).
    """
    if not is_text(pred) or not pred.strip():  # also text that is not valid Unicode: a wrong answer
        return False
    try:
        left, right = normalize_latex(pred), normalize_latex(gold)
        if left == right:
            return True
        left_value, right_value = plain_number(left), plain_number(right)
        if left_value is not None and right_value is not None:
            return left_value == right_value
        if len(left) > MAX_VERIFY_CHARS or len(right) > MAX_VERIFY_CHARS or not _balanced(left):
            return False  # too long, or not a formula (unbalanced brackets): strings already differ
        key = (left, right)
        if key not in _VERIFIED:
            _math_verify()
            if _timer_available():
                result = call_with_time_limit(lambda: _verify(left, right), timeout)
            elif _risky_without_timer(left):
                return False
            else:
                result = _verify(left, right)
            if len(_VERIFIED) >= _VERIFIED_MAX:
                _VERIFIED.clear()
            _VERIFIED[key] = result  # only completed checks are remembered, never time-outs
        return _VERIFIED[key]
    except (Exception, TimeoutError):
        return False
