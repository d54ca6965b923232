"""Confidence in [0, 1] from what a backend returned: a critic's verdict, or the solution's own tokens.

Every function here is total: whatever a model or server sends (non-finite or positive
log-probabilities, garbage types), the result is a confidence in [0, 1] and a named source.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from math import exp

from deliberation_env.requests import Completion

_CONFIDENCE = re.compile(r"(?i)confidence\s*[:=]?\s*(\d{1,3}(?:\.\d+)?)\s*(%?)")
_BARE_NUMBER = re.compile(r"(?<![\d.])(0(?:\.\d+)?|1(?:\.0+)?|\.\d+)(?![\d.])")
_VERDICT = re.compile(r"(?i)^\W*(yes|no)\b")


def parse_confidence(completion: Completion) -> tuple[float, str]:
    """Confidence in [0, 1] from a critic completion, and its source.

    ``logprobs``: P(yes) / (P(yes) + P(no)) from the first token's log-probabilities;
    ``verbalized``: the number the critic wrote; ``verdict``: a bare Yes (0.75) or No (0.25);
    ``default``: 0.5 when the critic wrote nothing usable. Log-probabilities that are not
    finite numbers <= 0 (a server's garbage) are ignored, so the result is always in [0, 1].
    """
    yes, no = _yes_no_logprobs(completion.top_logprobs)
    if yes is not None or no is not None:
        top = max(v for v in (yes, no) if v is not None)  # normalise in log space: no overflow, no 0/0
        p_yes = exp(yes - top) if yes is not None else 0.0
        p_no = exp(no - top) if no is not None else 0.0
        return p_yes / (p_yes + p_no), "logprobs"
    return _text_confidence(completion.text)


@functools.lru_cache(maxsize=4096)
def _text_confidence(text: str) -> tuple[float, str]:
    """``parse_confidence`` of a critic text without log-probabilities (texts repeat: computed once each)."""
    match = _CONFIDENCE.search(text)
    if match:
        value = float(match.group(1))
        if match.group(2) or value > 1.0:
            value /= 100.0
        if 0.0 <= value <= 1.0:
            return value, "verbalized"
    match = _BARE_NUMBER.search(text)
    if match:
        return float(match.group(1)), "verbalized"
    match = _VERDICT.search(text)
    if match:
        return (0.75 if match.group(1).lower() == "yes" else 0.25), "verdict"
    return 0.5, "default"


def _yes_no_logprobs(top_logprobs: object) -> tuple[float | None, float | None]:
    """log P("yes") and log P("no") summed over their spellings, or None where absent."""
    if not isinstance(top_logprobs, Mapping):
        return None, None
    found: dict[str, list[float]] = {"yes": [], "no": []}
    for token, logprob in top_logprobs.items():
        if not isinstance(token, str) or isinstance(logprob, bool) or not isinstance(logprob, (int, float)):
            continue
        word = token.strip().lower()
        if word in found and math.isfinite(logprob):
            found[word].append(min(float(logprob), 0.0))
    return _logsumexp(found["yes"]), _logsumexp(found["no"])


def _logsumexp(values: list[float]) -> float | None:
    if not values:
        return None
    top = max(values)
    return top + math.log(sum(exp(v - top) for v in values))


def answer_confidence(completion: Completion, answer: str | None) -> tuple[float, str]:
    """Confidence from the solution's own token log-probabilities, and its source.

    ``answer_logprobs``: the probability the model gave the tokens that spell the answer's last
    occurrence in the text, exp(sum of their log-probabilities); ``sequence_logprobs``: where the
    answer is not spelled out verbatim (or there is none), the geometric-mean token probability of
    the whole completion; ``default``: 0.5 without usable log-probabilities.
    """
    pieces = well_formed_logprobs(completion.token_logprobs)
    if not pieces:
        return 0.5, "default"
    total = answer_logprob(pieces, answer)
    if total is not None:
        return exp(total), "answer_logprobs"
    return exp(sum(v for _, v in pieces) / len(pieces)), "sequence_logprobs"


def answer_logprob(pieces: list[tuple[str, float]], answer: str | None) -> float | None:
    """The summed log-probability of the tokens that spell the answer's last occurrence in the text the
    (token, logprob) ``pieces`` make, or None where the answer is not spelled out verbatim (or there is none)."""
    if not answer:
        return None
    start = "".join(token for token, _ in pieces).rfind(answer)
    if start < 0:
        return None
    end, offset, total = start + len(answer), 0, 0.0
    for token, logprob in pieces:
        if offset < end and offset + len(token) > start:
            total += logprob
        offset += len(token)
    return total


def well_formed_logprobs(items: object) -> list[tuple[str, float]]:
    """The well-formed (token, logprob <= 0) pairs of a backend's per-token log-probabilities."""
    pieces = []
    for item in items if isinstance(items, (list, tuple)) else ():
        if isinstance(item, (list, tuple)) and len(item) == 2:
            token, value = item
            if isinstance(token, str) and isinstance(value, (int, float)) and not isinstance(value, bool) \
                    and math.isfinite(value):
                pieces.append((token, min(float(value), 0.0)))
    return pieces
