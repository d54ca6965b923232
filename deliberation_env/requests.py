"""The seam between the core and the backends, on its own ground floor: a ``Request`` (one chat-completion request
from one agent: the messages, the sampling settings, labels) and the ``Completion`` that answers it, and
``sanitize_completion``, which makes whatever a backend returned safe for the core. The core makes requests and reads
completions, the backends (``deliberation_env.backends``) answer requests with completions, and both import them from
here, which imports nothing of theirs. ``deliberation_env.backends.base`` re-exports these names.

A request carries no simulator state: the simulated backend asks the deliberation named by ``source`` for what it
knows beyond the text (``core.sim_context``, the hook the core owns). ``episode``, ``source`` and ``problem`` are
labels, not part of a request's identity.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from deliberation_env.chat import Message

RequestKind = str
"""A request's kind: an agent's ``"solve"``, ``"refine"`` or ``"critic"``, or a registered tool's kind (``"run"`` for
the built-in python tools; ``core.tools.request_kinds()`` lists them)."""


@dataclass(frozen=True)
class Request:
    """One chat-completion request from one agent. Its token budget and temperature are always given (the core
    gives its config's: ``DeliberationConfig``, where their defaults are declared); a request has no defaults of its
    own."""

    messages: tuple[Message, ...]
    kind: RequestKind
    agent: int
    seed: int
    max_tokens: int
    temperature: float
    top_p: float = 1.0
    logprobs: bool = False
    """Ask for the first token's top log-probabilities (critic calls)."""
    token_logprobs: bool = False
    """Ask for the log-probability of every generated token (``confidence="answer_logprobs"``)."""
    episode: int | None = field(default=None, compare=False, repr=False)
    """Which episode the request belongs to: a routing hint only (the OpenAI-compatible backend keeps an
    episode on one replica for its prefix cache). Not part of a request's identity, nor of cache keys."""
    source: int | None = field(default=None, compare=False, repr=False)
    """Which deliberation made the request (a process-unique number): only the simulated backend reads it, to ask
    that deliberation for the request's context (``core.sim_context``). Not part of a request's identity."""
    problem: str | None = field(default=None, compare=False, repr=False)
    """The id of the problem the request is about: a label for messages and replay records only. Not part of a
    request's identity."""

    def sampling_params(self) -> dict[str, Any]:
        """The fields, besides messages and seed, that change what a model returns."""
        params: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "logprobs": self.logprobs,
        }
        if self.token_logprobs:  # only when set, so that cache keys of other requests stay as they were
            params["token_logprobs"] = True
        return params


@dataclass(frozen=True)
class Completion:
    """A backend's answer to one Request."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    top_logprobs: dict[str, float] | None = None
    """Top log-probabilities of the first generated token, when the backend gives them."""
    finish_reason: str = "stop"
    cached: bool = False
    token_logprobs: tuple[tuple[str, float], ...] | None = None
    """(token text, log-probability) of every generated token, when asked for and the backend gives them."""
    token_ids: tuple[int, ...] | None = field(default=None, compare=False, repr=False)
    """The generated token ids, when the backend gives them (an end-of-sequence token the model stopped at included).
    Not part of equality (a cache's copy without them equals the original)."""
    token_id_logprobs: tuple[float, ...] | None = field(default=None, compare=False, repr=False)
    """The sampler's log-probability of each of ``token_ids`` (same length), when the backend gives them: of the
    distribution it drew the token from, the logits divided by the temperature (1 when greedy), before top-p (vLLM's
    ``--logprobs-mode processed_logprobs``; ``TransformersBackend``'s ``token_logprobs`` are of temperature 1). Not part
    of equality."""

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def sanitize_completion(completion: object) -> Completion:
    """A backend's answer made safe for the core: text a str, token counts ints in [0, 10^9].

    The env must never crash, nor leave its observation space, on what a model or server sends:
    a non-string text becomes "" (no answer), unusable token counts become 0, out-of-range ones
    are clipped, and ``top_logprobs`` is kept only when it is a mapping (``parse_confidence``
    filters its entries).
    """
    if (type(completion) is Completion and type(completion.text) is str
            and type(completion.prompt_tokens) is int and 0 <= completion.prompt_tokens <= MAX_TOKEN_COUNT
            and type(completion.completion_tokens) is int and 0 <= completion.completion_tokens <= MAX_TOKEN_COUNT):
        return completion  # the common case, kept fast
    text = getattr(completion, "text", "")
    counts = [_token_count(getattr(completion, name, 0)) for name in ("prompt_tokens", "completion_tokens")]
    top = getattr(completion, "top_logprobs", None)
    tokens = getattr(completion, "token_logprobs", None)
    ids, id_logprobs = getattr(completion, "token_ids", None), getattr(completion, "token_id_logprobs", None)
    # Only the containers of top_logprobs and token_logprobs are checked here: their readers in core
    # (parse_confidence, well_formed_logprobs) skip entries that are not (str, finite float).
    return Completion(text if isinstance(text, str) else "", counts[0], counts[1],
                      cast("dict[str, float]", top) if isinstance(top, Mapping) else None,
                      str(getattr(completion, "finish_reason", "stop")),
                      token_logprobs=cast("tuple[tuple[str, float], ...]", tokens)
                      if isinstance(tokens, (list, tuple)) else None,
                      token_ids=tuple(ids) if isinstance(ids, (list, tuple)) else None,
                      token_id_logprobs=tuple(id_logprobs) if isinstance(id_logprobs, (list, tuple)) else None)


def _token_count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy scalars included
        return 0
    return int(min(max(float(value), 0.0), MAX_TOKEN_COUNT)) if math.isfinite(value) else 0


MAX_TOKEN_COUNT = 10**9
"""Beyond any context window: a larger token count is garbage (clipped here; the OpenAI reply reader drops it)."""
