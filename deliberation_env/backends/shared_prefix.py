"""Which rows of a generation batch can share the prefill of a common prompt prefix, and where each row's tokens go.

The N agents of an episode see prompts that start alike (chat template, system prompt, the problem) and end
apart (each agent's own solution, its peers' answers); a GRPO group's samples see one prompt outright. A prefix
that several rows share is prefilled once, on one row, and its KV cache copied to the others; each row then
prefills only its own tail. The batch is laid out in two column blocks, both left-padded:

    [ pads | shared prefix ][ pads | own tail ]
    <-------- prefix_width --------><------ tail_width ------>

A row outside every group is its own group: what of its prompt does not fit in the tail block goes in the
prefix block. Pads are masked, and positions count only the row's real tokens, so each row sees exactly its own
prompt.

The plan is chosen by counting padded prefill tokens: rows sorted by (adapter, tokens) are cut into runs whose
neighbours share at least m tokens, for every candidate m, and the cheapest layout is kept; it is used only when
it prefills clearly fewer tokens than one left-padded block.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PrefixPlan:
    """Row r's first ``prefix_lengths[r]`` tokens are the prefix of group ``groups[r]`` (None: the whole prompt is in
    the tail block); a group of one row is a lone prompt split in two."""

    groups: tuple[int | None, ...]
    prefix_lengths: tuple[int, ...]
    representatives: tuple[int, ...]
    """One row per group, the one whose prefix is prefilled."""
    prefix_width: int
    tail_width: int

    @property
    def width(self) -> int:
        return self.prefix_width + self.tail_width

    def tokens_prefilled(self) -> int:
        return len(self.representatives) * self.prefix_width + len(self.groups) * self.tail_width


def plan_shared_prefixes(prompts: Sequence[Sequence[int]], adapters: Sequence[str | None] | None = None,
                         min_saving: float = 0.15) -> PrefixPlan | None:
    """The cheapest two-block layout of ``prompts`` (see the module docstring), or None when sharing would not save
    at least ``min_saving`` of the padded prefill tokens of one plain left-padded block."""
    rows = len(prompts)
    if rows < 2:
        return None
    adapters = list(adapters) if adapters is not None else [None] * rows
    order = sorted(range(rows), key=lambda r: (str(adapters[r]), tuple(prompts[r])))
    shared = [  # common prefix of neighbours in sorted order, leaving each at least its last token to prefill
        min(len(os.path.commonprefix([list(prompts[a]), list(prompts[b])])), len(prompts[a]) - 1, len(prompts[b]) - 1)
        if adapters[a] == adapters[b] else 0
        for a, b in zip(order, order[1:])
    ]
    plain = rows * max(len(p) for p in prompts)
    best: PrefixPlan | None = None
    for threshold in sorted({s for s in shared if s > 0}):
        plan = _runs(prompts, order, shared, threshold)
        if best is None or plan.tokens_prefilled() < best.tokens_prefilled():
            best = plan
    if best is None or best.tokens_prefilled() > (1.0 - min_saving) * plain:
        return None
    return best


def _runs(prompts: Sequence[Sequence[int]], order: list[int], shared: list[int], threshold: int) -> PrefixPlan:
    """Groups: maximal runs of sorted rows whose neighbours share at least ``threshold`` tokens."""
    groups: list[int | None] = [None] * len(prompts)
    lengths = [0] * len(prompts)
    representatives: list[int] = []
    start = 0
    for end in range(1, len(order) + 1):
        if end < len(order) and shared[end - 1] >= threshold:
            continue
        if end - start >= 2:
            common = min(shared[start : end - 1])
            for row in order[start:end]:
                groups[row], lengths[row] = len(representatives), common
            representatives.append(order[start])
        start = end
    return _split_lone_rows(prompts, groups, lengths, representatives)


def _split_lone_rows(prompts: Sequence[Sequence[int]], groups: list[int | None], lengths: list[int],
                     representatives: list[int]) -> PrefixPlan:
    """Choose the tail width; a row in no group puts what of its prompt does not fit in the tail block in the
    prefix block (its own prefill, split in two), so that a long lone prompt does not widen every row's tail."""
    lone = [len(p) for p, group in zip(prompts, groups) if group is None]
    narrowest_tail = max(len(p) - n for p, n in zip(prompts, lengths) if n)  # the grouped rows' tails must fit
    widest_prefix = max(lengths)
    candidates = ({narrowest_tail} | {n for n in lone if n > narrowest_tail}
                  | {n - widest_prefix for n in lone if n - widest_prefix > narrowest_tail})

    def cost(tail: int) -> int:
        split = [n - tail for n in lone if n > tail]
        return (len(representatives) + len(split)) * max([widest_prefix, *split]) + len(prompts) * tail

    tail_width = min(sorted(candidates), key=cost)
    groups, lengths, representatives = list(groups), list(lengths), list(representatives)
    for row, prompt in enumerate(prompts):
        if groups[row] is None and len(prompt) > tail_width:
            groups[row], lengths[row] = len(representatives), len(prompt) - tail_width
            representatives.append(row)
    return PrefixPlan(groups=tuple(groups), prefix_lengths=tuple(lengths), representatives=tuple(representatives),
                      prefix_width=max(lengths), tail_width=max(len(p) - n for p, n in zip(prompts, lengths)))
