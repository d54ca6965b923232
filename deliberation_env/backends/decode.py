"""Token-by-token decoding for ``TransformersBackend``: per-row seeded sampling and continuous batching.

``transformers``' ``generate`` decodes every row of a batch until the longest one ends, feeding pad tokens to the
rows that already stopped, and the next batch waits for it. On a CPU each row of a decode step costs compute (a
Qwen2.5-0.5B step takes about 52, 65, 77 and 122 ms at 1, 4, 8 and 16 rows), so ``decode`` takes a row out of the
batch and its KV cache as soon as it ends (at an end-of-sequence token or its own ``max_tokens``), and lets waiting
requests in once a quarter of the batch is free (``REFILL_FRACTION``): their prompts are prefilled in one forward
pass and their cache joins the batch's, left-padded to a common width.

Sampling is ``SeededSampler``'s: a per-row Gumbel-max draw whose noise comes from a ``torch.Generator`` seeded with
the request's seed, so a row's draws do not depend on which other rows share its batch, nor on when they leave it.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from deliberation_env.requests import Request

REFILL_FRACTION = 0.25
"""Let waiting requests in once this share of the batch is free: each admission is one more forward pass (the new
rows' prefill), so admitting rows one at a time would add a pass per row."""


class SeededSampler:
    """Per-row seeded sampling (Gumbel-max after temperature and top-p; temperature 0 is greedy).

    ``choose`` picks the next tokens in ``decode``; called as a ``transformers`` logits processor it turns ``generate``'s
    greedy search into the same sampling. With ``record_logprobs`` it keeps, per row, the log-probability of each token
    chosen: the model's (temperature 1, ``recorded``) and the sampling distribution's (the logits divided by the row's
    temperature, 1 when greedy, before top-p: ``recorded_sampling``, what a trainer's importance ratio compares with).
    """

    def __init__(self, requests: Sequence[Request], device: torch.device, record_logprobs: bool = False):
        self.record_logprobs = record_logprobs
        self.recorded: list[list[float]] = [[] for _ in requests]
        self.recorded_sampling: list[list[float]] = [[] for _ in requests]
        self._previous: torch.Tensor | None = None
        self.temperatures = [float(r.temperature) for r in requests]
        self.top_ps = [float(r.top_p) for r in requests]
        self.noise_device = device if device.type == "cuda" else torch.device("cpu")
        self.generators = []
        for request in requests:
            generator = torch.Generator(device=self.noise_device)
            generator.manual_seed(int(request.seed) & 0x7FFF_FFFF_FFFF_FFFF)
            self.generators.append(generator)

    def subset(self, rows: Sequence[int]) -> SeededSampler:
        """The sampler of a batch made of these rows: their own generators, recording into their own lists."""
        view = SeededSampler([], self.noise_device, self.record_logprobs)
        view.recorded = [self.recorded[row] for row in rows]
        view.recorded_sampling = [self.recorded_sampling[row] for row in rows]
        view.temperatures = [self.temperatures[row] for row in rows]
        view.top_ps = [self.top_ps[row] for row in rows]
        view.generators = [self.generators[row] for row in rows]
        return view

    def choose(self, logits: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        """The next token of each row: ``logits[k]`` (vocabulary logits) belongs to request ``rows[k]``."""
        logits = logits.float()
        chosen = self._perturbed(logits, rows).argmax(dim=-1)
        if self.record_logprobs:
            self._record(logits, chosen, rows)
        return chosen

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.Tensor:
        """The logits-processor form, for ``generate``: the token chosen at step k is read from ``input_ids`` at step
        k + 1, so one step of log-probabilities is held at a time (the last token's is never recorded)."""
        if self.record_logprobs:
            if self._previous is not None:
                self._record(self._previous, input_ids[:, -1].to(self._previous.device), range(len(self._previous)))
            self._previous = scores.float()
        return self._perturbed(scores.float(), range(scores.shape[0]))

    def _record(self, logits: torch.Tensor, chosen: torch.Tensor, rows: Sequence[int]) -> None:
        """Append each row's log-probabilities of its chosen token (``recorded``, ``recorded_sampling``)."""
        picked = chosen[:, None]
        plain = torch.log_softmax(logits, dim=-1).gather(1, picked).squeeze(1)
        scales = [self.temperatures[row] if self.temperatures[row] > 0 else 1.0 for row in rows]
        scaled = plain if all(scale == 1.0 for scale in scales) else torch.log_softmax(
            logits / torch.tensor(scales, device=logits.device)[:, None], dim=-1).gather(1, picked).squeeze(1)
        for row, value, sampled in zip(rows, plain.tolist(), scaled.tolist()):
            self.recorded[row].append(value)
            self.recorded_sampling[row].append(sampled)

    def _perturbed(self, logits: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        scores = logits.clone()
        vocab = scores.shape[-1]
        for k, row in enumerate(rows):
            temperature = self.temperatures[row]
            if temperature <= 0.0:
                continue  # greedy
            row_logits = logits[k] / temperature
            if self.top_ps[row] < 1.0:
                row_logits = _top_p_filter(row_logits, self.top_ps[row])
            uniform = torch.rand(vocab, generator=self.generators[row], device=self.noise_device).to(scores.device)
            scores[k] = row_logits - torch.log(-torch.log(uniform.clamp(1e-10, 1.0 - 1e-7)))
        return scores


def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Set to -inf every token outside the smallest set whose probability reaches ``top_p``."""
    sorted_logits, order = torch.sort(logits, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    outside = torch.cumsum(probs, dim=-1) - probs > top_p
    filtered = logits.clone()
    filtered[order[outside]] = float("-inf")
    return filtered


def positions_from_mask(attention: torch.Tensor) -> torch.Tensor:
    """Each token's position among its row's real tokens (pads, wherever they are, get 0), as ``generate`` derives
    position ids from a padded attention mask."""
    return (attention.cumsum(-1) - 1).masked_fill(attention == 0, 0)


def first_token_top(logits: torch.Tensor, count: int) -> tuple[list[float], list[int]]:
    """The ``count`` most likely tokens of one row of logits: (log-probabilities, token ids), most likely first."""
    values, ids = torch.topk(torch.log_softmax(logits.float(), dim=-1), min(count, logits.shape[-1]))
    return values.tolist(), ids.tolist()


def forward_parameters(model: Any) -> frozenset[str]:
    """The keyword names the model's ``forward`` takes (a peft wrapper's base model's). ``model``: a ``transformers``
    model or a peft wrapper of one (Any: their methods are not typed through ``torch.nn.Module``)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return frozenset(inspect.signature(base.forward).parameters)


def cache_keyword(model: torch.nn.Module) -> str | None:
    """The name under which the model's ``forward`` takes a KV cache: ``cache`` (transformers >= 5.24),
    ``past_key_values`` (earlier releases), or None when it takes none."""
    parameters = forward_parameters(model)
    return next((name for name in ("cache", "past_key_values") if name in parameters), None)


def can_decode(model: torch.nn.Module) -> bool:
    """Whether ``decode`` can drive this model: its forward takes a KV cache and position ids (every ``transformers``
    causal LM does; some remote-code models do not, and get ``generate``)."""
    return cache_keyword(model) is not None and "position_ids" in forward_parameters(model)


@dataclass
class Decoded:
    """What ``decode`` produced, per request."""

    tokens: list[list[int]]
    """Each request's generated tokens, up to and including its end-of-sequence token."""
    first_top: dict[int, tuple[list[float], list[int]]] = field(default_factory=dict)
    """The most likely first tokens of the requests that asked for them (``first_token_top``); not the whole
    vocabulary's logits, which would hold about 600 kB per request for a 150k-token vocabulary until the call ends."""
    row_steps: int = 0
    """Rows decoded, summed over forward passes (a prompt's prefill counts one): the decoding work."""


StartRows = Callable[[list[int]], tuple[torch.Tensor, torch.Tensor, Any]]
"""Lays out the prompts of some requests: (left-padded input ids, attention mask, a KV cache holding the first columns
already, e.g. a shared prefill, or None)."""


@dataclass
class _Rows:
    """The rows in the batch: the request behind each, their KV cache, attention mask, and next input."""

    requests: list[int]
    cache: Any
    attention: torch.Tensor
    """(rows, width): one column per cached token, 0 for padding."""
    next_positions: torch.Tensor
    next_ids: torch.Tensor

    def select(self, keep: list[int]) -> None:
        index = torch.tensor(keep, device=self.attention.device)
        self.cache.batch_select_indices(index)
        self.requests = [self.requests[k] for k in keep]
        self.attention, self.next_positions, self.next_ids = (
            self.attention[index], self.next_positions[index], self.next_ids[index])

    def mergeable(self) -> bool:
        from transformers.cache_utils import DynamicLayer

        return all(type(layer) is DynamicLayer and layer.is_initialized for layer in self.cache.layers)

    def join(self, other: _Rows) -> None:
        """Append ``other``'s rows; the narrower cache is left-padded (masked out) to the wider one's width."""
        width = max(self.attention.shape[1], other.attention.shape[1])
        for mine, theirs in zip(self.cache.layers, other.cache.layers):
            mine.keys = torch.cat([_left_pad(mine.keys, width, -2), _left_pad(theirs.keys, width, -2)])
            mine.values = torch.cat([_left_pad(mine.values, width, -2), _left_pad(theirs.values, width, -2)])
        self.attention = torch.cat([_left_pad(self.attention, width, 1), _left_pad(other.attention, width, 1)])
        self.requests = self.requests + other.requests
        self.next_positions = torch.cat([self.next_positions, other.next_positions])
        self.next_ids = torch.cat([self.next_ids, other.next_ids])


def _left_pad(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


@torch.inference_mode()
def decode(model: Any, sampler: SeededSampler, limits: Sequence[int], eos_ids: Sequence[int],
           order: Sequence[int], start_rows: StartRows, batch_size: int, adapter_names: Sequence[str] | None,
           want_first_top: Sequence[bool], top_count: int = 20) -> Decoded:
    """Generate for every request, at most ``batch_size`` rows at a time, admitting them in ``order``.

    ``model``: a ``transformers`` causal LM (or a peft wrapper of one). ``limits``: each request's ``max_tokens``.
    ``start_rows``: lays out the prompts of the requests admitted together. ``adapter_names``: each request's LoRA
    adapter (peft mixed batches). ``want_first_top``: per request, whether to keep its ``top_count`` most likely first
    tokens.
    """
    from transformers import DynamicCache

    result = Decoded([[] for _ in limits])
    stop = set(eos_ids)
    extra: dict[str, Any] = {"logits_to_keep": 1} if "logits_to_keep" in forward_parameters(model) else {}
    cache_name = cache_keyword(model) or "past_key_values"
    waiting, rows = deque(order), None

    def forward(requests: list[int], input_ids, attention, positions, cache) -> torch.Tensor:
        if adapter_names is not None:
            extra["adapter_names"] = [adapter_names[r] for r in requests]
        result.row_steps += len(requests)
        return model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True,
                     **{cache_name: cache}, **extra).logits[:, -1, :]

    def sample(requests: list[int], logits: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        """Each row's next token, and the rows that go on."""
        chosen = sampler.choose(logits, requests)
        going_on = []
        for k, (request, token) in enumerate(zip(requests, chosen.tolist())):
            tokens = result.tokens[request]
            tokens.append(token)
            if token not in stop and len(tokens) < limits[request]:
                going_on.append(k)
        return chosen, going_on

    def start(requests: list[int]) -> _Rows | None:
        input_ids, attention, cache = start_rows(requests)
        cache = cache if cache is not None else DynamicCache(config=model.config)
        cached, positions = cache.get_seq_length(), positions_from_mask(attention)
        logits = forward(requests, input_ids[:, cached:], attention, positions[:, cached:], cache)
        for k, request in enumerate(requests):
            if want_first_top[request]:
                result.first_top[request] = first_token_top(logits[k], top_count)
        chosen, going_on = sample(requests, logits)
        new = _Rows(requests, cache, attention, positions[:, -1:] + 1, chosen[:, None])
        if len(going_on) < len(requests):
            if not going_on:
                return None
            new.select(going_on)
        return new

    while waiting or rows is not None:
        free = batch_size - (len(rows.requests) if rows is not None else 0)
        if waiting and (rows is None or (free >= max(1.0, REFILL_FRACTION * batch_size) and rows.mergeable())):
            new = start([waiting.popleft() for _ in range(min(free, len(waiting)))])
            if rows is None:
                rows = new
            elif new is not None:
                rows.join(new)
            continue
        if rows is None:  # with no rows running, waiting is not empty and the branch above admits some
            raise RuntimeError("decode: no rows to step")
        rows.attention = torch.cat([rows.attention, rows.attention.new_ones((len(rows.requests), 1))], dim=1)
        logits = forward(rows.requests, rows.next_ids, rows.attention, rows.next_positions, rows.cache)
        chosen, going_on = sample(rows.requests, logits)
        rows.next_ids, rows.next_positions = chosen[:, None], rows.next_positions + 1
        if not going_on:
            rows = None
        elif len(going_on) < len(rows.requests):
            rows.select(going_on)
    return result
