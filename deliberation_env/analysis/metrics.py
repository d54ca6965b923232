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


def hierarchical_bootstrap(cells: Sequence[np.ndarray], weights: Sequence[float], resamples: int = 4000,
                           seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """``sum_c weights[c] * mean(cells[c])`` and its percentile bootstrap interval (``level``, default 95%) over
    training runs and problems.

    ``cells[c]``: cell c's scores, one row per training run, one column per problem (the same problems in every cell;
    a 1-D array is one run). Each resample draws every cell's runs with replacement, then one set of problems with
    replacement shared by all cells (the problems are paired), and averages. One cell with weight 1 gives its mean,
    two with 1 and -1 their paired difference, four with +-1/2 a main effect of a 2x2. With one run per cell only the
    problems vary; with few runs the spread between runs is underestimated (2 runs: 4 distinct draws per cell)."""
    scores = [np.atleast_2d(np.asarray(cell, float)) for cell in cells]
    problems = scores[0].shape[1]
    if any(cell.shape[1] != problems for cell in scores):
        raise ValueError(f"every cell needs scores on the same problems, got {[cell.shape[1] for cell in scores]} columns")
    rng = np.random.default_rng(seed)
    columns = rng.integers(0, problems, (resamples, problems))
    combined = np.zeros((resamples, problems))
    for cell, weight in zip(scores, weights):
        runs = rng.integers(0, len(cell), (resamples, len(cell)))
        combined += weight * cell[runs].mean(1)  # each resample's mean over its drawn runs, per problem
    means = np.take_along_axis(combined, columns, 1).mean(1)
    estimate = sum(weight * cell.mean() for cell, weight in zip(scores, weights))
    tail = 50.0 * (1.0 - level)
    return float(estimate), float(np.percentile(means, tail)), float(np.percentile(means, 100.0 - tail))


def clustered_auroc(groups: Sequence[tuple[Floats, Sequence[bool]]], resamples: int = 1000,
                    rng: np.random.Generator | None = None) -> tuple[float, float, float]:
    """AUROC of confidences for rightness, pooled over groups, and its bootstrap 95% interval resampling whole groups.

    ``groups``: one ``(confidences, right)`` pair per cluster whose items are not independent (a problem's agents
    share its question). ``rng``: the generator the draws come from (pass one to keep several tables' draws in one
    stream; default: seed 0). NaN where a side is empty."""
    rng = np.random.default_rng(0) if rng is None else rng
    values = [np.asarray(v, float) for v, _ in groups]
    rights = [np.asarray(r, bool) for _, r in groups]

    def pooled(picks) -> float:
        if len(picks) == 0:
            return float("nan")
        v, r = np.concatenate([values[k] for k in picks]), np.concatenate([rights[k] for k in picks])
        return auroc(v[r], v[~r])

    value = pooled(range(len(groups)))
    if not groups:
        return value, float("nan"), float("nan")
    draws = np.array([pooled(rng.integers(len(groups), size=len(groups))) for _ in range(resamples)])
    if np.isnan(draws).all():  # a side is empty in every resample
        return value, float("nan"), float("nan")
    low, high = np.nanpercentile(draws, [2.5, 97.5])
    return value, float(low), float(high)
