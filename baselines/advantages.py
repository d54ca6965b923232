"""Group-relative advantages, in numpy: the functions the meta-policy trainers (``baselines.meta``) and the LLM
trainer (``baselines.llm.train_llm``) both turn a comparison group's returns into advantages with.

* ``baseline_advantages``: a return minus a baseline of its group (``ADVANTAGE_MODES``: the mean, MAGRPO; the mean of
  the others, MARLOO; the maximum, MAREMAX; none, MAREINFORCE), optionally divided by the group's std (GRPO);
* ``group_normalized``: GRPO's ``(r - mean) / (std + eps)`` (MAGRPO's ``r - mean`` without the division);
* ``softrank_advantages``: SoftRankPO's rank quantiles (see its docstring, and ``docs/method.md``);
* ``grouped_apply``: one of them applied per comparison group to one value per unit (episode or rollout), broadcast
  back to every row of the unit; ``grouped_flat``: which rows belong to a group whose values are all equal.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.special import ndtri

TIE_TOLERANCE = 1e-9
ADVANTAGE_MODES = ("mean", "rloo", "max", "raw")
"""Baselines of ``baseline_advantages``: mean (MAGRPO), rloo (MARLOO), max (MAREMAX), raw (MAREINFORCE)."""


def baseline_advantages(returns: np.ndarray, mode: str = "mean", std_normalize: bool = False,
                        eps: float = 1e-6) -> np.ndarray:
    """One group's K returns minus a baseline, optionally divided by ``std + eps`` of the returns:

    - ``mean``: ``R_k - mean(R)`` (MAGRPO; GRPO with the division);
    - ``rloo``: ``R_k - mean_{j != k} R_j``, the leave-one-out mean (MARLOO; ``K / (K - 1)`` times ``mean``'s);
    - ``max``: ``R_k - max(R)`` (MAREMAX: every advantage <= 0, the best candidates' 0);
    - ``raw``: ``R_k`` (MAREINFORCE: no baseline).

    A group of one gets ``raw``'s value for ``raw`` and 0 otherwise."""
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"advantage mode must be one of {ADVANTAGE_MODES}, got {mode!r}")
    returns = np.asarray(returns, dtype=np.float64)
    count = len(returns)
    if mode == "raw":
        centred = returns.copy()
    elif count < 2:
        centred = np.zeros(count)
    elif mode == "mean":
        centred = returns - returns.mean()
    elif mode == "rloo":
        centred = returns - (returns.sum() - returns) / (count - 1)
    else:
        centred = returns - returns.max()
    return centred / (returns.std() + eps) if std_normalize and count else centred


def group_normalized(returns: np.ndarray, std_normalize: bool = True, eps: float = 1e-6) -> np.ndarray:
    """``(r - mean) / (std + eps)`` (or ``r - mean``) over one group's returns."""
    return baseline_advantages(returns, "mean", std_normalize, eps)


def is_flat(values: np.ndarray) -> bool:
    """All values equal (within ``TIE_TOLERANCE`` of their magnitude): a group that teaches nothing."""
    values = np.asarray(values, dtype=np.float64)
    return len(values) == 0 or float(np.ptp(values)) <= TIE_TOLERANCE * max(1.0, float(np.abs(values).max()))


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..K with ties (within TIE_TOLERANCE of the range) sharing their average rank."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    spread = values.max() - values.min() if len(values) else 0.0
    start = 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[order[i]] - values[order[i - 1]] > TIE_TOLERANCE * spread:
            ranks[order[start:i]] = (start + 1 + i) / 2.0
            start = i
    return ranks


def softrank_advantages(returns: np.ndarray, tau: float = 0.8) -> np.ndarray:
    """SoftRankPO advantages of one group's K returns:

    1. rank the returns, 1..K, average ranks for ties (values closer than ``TIE_TOLERANCE`` of the group's
       range count as tied, so float noise of a rescaled reward cannot split a tie);
    2. percentile ``p = (rank - 0.5) / K``;
    3. ``A = Phi^-1(p) / tau`` (``scipy.special.ndtri``), then minus the group mean of A.

    A depends only on the order of the returns (unchanged by any ``r -> a*r + b`` with ``a > 0``); it has zero
    mean; equal returns get equal advantages; an all-equal group (or one of fewer than 2) gets zeros;
    ``|A| <= 2 |Phi^-1(0.5/K)| / tau``."""
    returns = np.asarray(returns, dtype=np.float64)
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    if len(returns) < 2:
        return np.zeros(len(returns))
    percentiles = (average_ranks(returns) - 0.5) / len(returns)
    advantages = ndtri(percentiles) / tau
    return advantages - advantages.mean()


def group_rows(keys: np.ndarray) -> list[np.ndarray]:
    """The row indices of each distinct key (ascending keys; rows in their order)."""
    keys = np.asarray(keys)
    order = np.argsort(keys, kind="stable")
    cuts = np.flatnonzero(keys[order][1:] != keys[order][:-1]) + 1
    return np.split(order, cuts) if len(order) else []


def grouped_apply(values: np.ndarray, keys: np.ndarray, units: np.ndarray,
                  fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """``fn`` applied per key to one value per unit (episode), e.g. a group's K returns; broadcast back."""
    out = np.zeros(len(values))
    for rows in group_rows(keys):
        _, first, inverse = np.unique(units[rows], return_index=True, return_inverse=True)
        out[rows] = np.asarray(fn(values[rows][first]), dtype=np.float64)[inverse.reshape(-1)]
    return out


def grouped_flat(values: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Per row, whether its group (rows of one key) has all values equal (``is_flat``)."""
    flat = np.zeros(len(values), dtype=bool)
    for rows in group_rows(keys):
        flat[rows] = is_flat(np.asarray(values)[rows])
    return flat
