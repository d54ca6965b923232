"""Reading an OpenAI-compatible chat reply: its text, usage counts and log-probabilities, validated.

Servers differ (vLLM, SGLang, llama.cpp, Ollama, hosted APIs) and some send garbage; every helper returns None for
what it cannot use, so that the backend estimates or drops it instead of crashing the env.
"""

from __future__ import annotations

import math
from typing import Any

from deliberation_env.requests import MAX_TOKEN_COUNT


def content_text(content: Any) -> str | None:
    """A message's text: a string, null (""), or a list of text parts joined; None when it is none of these."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    return None


def token_count(value: Any) -> int | None:
    """A usage count as a non-negative int, or None when it is missing or unusable."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return int(value) if 0 <= value <= MAX_TOKEN_COUNT else None


def logprob_value(value: Any) -> float | None:
    """A finite log-probability (<= 0, tiny positive rounding clipped), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:  # an int beyond float range
        return None
    if not math.isfinite(value) or value > 1e-6:
        return None
    return min(value, 0.0)


def first_token_logprobs(logprobs: Any) -> dict[str, float] | None:
    """{token: logprob} of the first generated token (chat or legacy format); None when unusable."""
    if not isinstance(logprobs, dict):
        return None
    pairs: list[tuple[Any, Any]] = []
    content, legacy = logprobs.get("content"), logprobs.get("top_logprobs")
    if isinstance(content, list) and content:
        first = content[0].get("top_logprobs") if isinstance(content[0], dict) else None
        if isinstance(first, list):
            pairs = [(item.get("token"), item.get("logprob")) for item in first if isinstance(item, dict)]
    elif isinstance(legacy, list) and legacy and isinstance(legacy[0], dict):
        pairs = list(legacy[0].items())
    result: dict[str, float] = {}
    for token, raw in pairs:
        value = logprob_value(raw)
        if isinstance(token, str) and value is not None:
            if token in result:  # the same text from two token ids: P adds up
                high, low = max(result[token], value), min(result[token], value)
                value = high + math.log1p(math.exp(low - high))
            result[token] = value
    return result or None


def every_token_logprobs(logprobs: Any) -> tuple[tuple[str, float], ...] | None:
    """(token, logprob) of every generated token (chat format); None when unusable."""
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list) or not content:
        return None
    pairs = []
    for item in content:
        value = logprob_value(item.get("logprob")) if isinstance(item, dict) else None
        if value is None or not isinstance(item.get("token"), str):
            return None  # a gap would misalign the tokens with the text
        pairs.append((item["token"], value))
    return tuple(pairs)


def vllm_token_ids(pairs: tuple[tuple[str, float], ...]) -> tuple[int, ...] | None:
    """The ids of ``(token, logprob)`` pairs whose tokens are vLLM's ``"token_id:<id>"``; None when any is not."""
    parts = [token.partition(":") for token, _ in pairs]
    return tuple(int(n) for _, _, n in parts) if all(p == "token_id" and n.isdigit() for p, _, n in parts) else None
