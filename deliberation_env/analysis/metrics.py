"""Small statistics shared by calibration, fidelity, evaluation and the bench scripts (numpy and scipy only)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

Floats = Sequence[float] | np.ndarray
"""Numbers as a sequence or a 1-D numpy array (what the statistics below accept)."""


def auroc(confidence_right: Floats, confidence_wrong: Floats) -> float:
    """P(a right answer's confidence > a wrong one's), ties half: NaN without both kinds."""
    if len(confidence_right) == 0 or len(confidence_wrong) == 0:
        return float("nan")
    u = stats.mannwhitneyu(confidence_right, confidence_wrong, alternative="two-sided").statistic
    return float(u) / (len(confidence_right) * len(confidence_wrong))


def spearman(real: Floats, sim: Floats) -> float:
    """Spearman's rank correlation (NaN with fewer than 3 items or a constant side)."""
    if len(real) < 3 or len(set(real)) < 2 or len(set(sim)) < 2:
        return float("nan")
    return float(stats.spearmanr(real, sim).statistic)


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% for z = 1.96)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_interval(values: Floats, resamples: int = 4000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap 95% interval of the mean of ``values`` (items resampled; NaN when empty or NaN)."""
    _, low, high = paired_bootstrap(values, np.zeros(len(values)), resamples, seed)
    return low, high


def paired_bootstrap(a: Floats, b: Floats, resamples: int = 4000,
                     seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``a - b`` over paired items (problems) and its percentile bootstrap 95% interval."""
    diff = np.asarray(a, float) - np.asarray(b, float)
    if len(diff) == 0:
        return float("nan"), float("nan"), float("nan")
    draws = np.random.default_rng(seed).integers(0, len(diff), (resamples, len(diff)))
    means = diff[draws].mean(1)
    return float(diff.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))
