"""Group-relative advantages, in numpy: the functions the meta-policy trainers (``baselines.meta``) and the LLM
trainer (``baselines.llm.train_llm``) both turn a comparison group's returns into advantages with.

* ``group_normalized``: GRPO's ``(r - mean) / (std + eps)`` (MAGRPO's ``r - mean`` without the division);
* ``softrank_advantages``: SoftRankPO's rank quantiles (see its docstring, and ``docs/method.md``);
* ``grouped_apply``: one of them applied per comparison group to one value per unit (episode or rollout), broadcast
  back to every row of the unit.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.special import ndtri

TIE_TOLERANCE = 1e-9


def group_normalized(returns: np.ndarray, std_normalize: bool = True, eps: float = 1e-6) -> np.ndarray:
    """``(r - mean) / (std + eps)`` (or ``r - mean``) over one group's returns."""
    returns = np.asarray(returns, dtype=np.float64)
    centred = returns - returns.mean()
    return centred / (returns.std() + eps) if std_normalize else centred


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


def grouped_apply(values: np.ndarray, keys: np.ndarray, units: np.ndarray,
                  fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """``fn`` applied per key to one value per unit (episode), e.g. a group's K returns; broadcast back."""
    out = np.zeros(len(values))
    order = np.argsort(keys, kind="stable")
    cuts = np.flatnonzero(np.diff(keys[order])) + 1
    for rows in np.split(order, cuts) if len(order) else []:
        _, first, inverse = np.unique(units[rows], return_index=True, return_inverse=True)
        out[rows] = np.asarray(fn(values[rows][first]), dtype=np.float64)[inverse.reshape(-1)]
    return out
