"""The fit of the sim's first-solution model: skills, difficulty weight, level offsets and problem spread.

The sim draws agent i's first solution on a problem right with
p = sigmoid(logit(s_i) - difficulty_weight * (d - 0.5) + level_offsets[level] - problem_spread * z), where
z ~ N(0, 1) is the problem's latent difficulty, shared by all its agents and episodes. This module fits
that model to round-0 solutions by maximum likelihood of a random-intercept logistic regression: the
solutions of one problem share z, which is integrated out with Gauss-Hermite quadrature. It also says
how often all of an episode's agents are right or all wrong, observed vs the fitted model's prediction.

Identifiability: the level offsets are constrained to be orthogonal (weighted by the solutions of each
level) to a constant and, when ``difficulty_weight`` is fitted, to the difficulty, so that the skills
keep their meaning (the middle difficulty, on average over the traced levels), ``difficulty_weight``
carries the linear trend and the offsets carry what is left: levels that share a difficulty (arithmetic
levels 0 and 1 both have difficulty 0.0) or a trend that is not linear.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Sequence
from typing import Any, NamedTuple

import numpy as np
from numpy.polynomial.hermite_e import hermegauss
from scipy import optimize
from scipy.special import logsumexp

from deliberation_env.backends.sim import MAX_LOGIT, SimConfig

QUADRATURE_NODES = 40
"""Gauss-Hermite nodes for integrating a problem's latent difficulty (exact enough to 1e-6 in the log-likelihood)."""
MAX_SPREAD = 8.0
"""Upper bound of the fitted ``problem_spread`` (logits): past it every problem is all right or all wrong."""
SPREAD_STARTS = (0.5, 2.0)
"""Starting spreads of the optimiser (the best end point is kept: the likelihood can be flat near 0)."""
MAX_SKILL_LOGIT = 6.0


class SolveEvent(NamedTuple):
    """One round-0 solution, as the fit reads it."""

    agent: int
    difficulty: float
    correct: bool
    has_answer: bool
    problem: str
    """The problem (task, settings, split, id): the group that shares a latent difficulty."""
    episode: str
    """The round-0 state it belongs to (problem and episode seed): the unit of the agreement report."""
    level: int | None


def _quadrature() -> tuple[np.ndarray, np.ndarray]:
    """Nodes and log-weights of E[f(z)], z ~ N(0, 1)."""
    nodes, weights = hermegauss(QUADRATURE_NODES)
    return nodes, np.log(weights / weights.sum())


def fit_solve(solves: Sequence[SolveEvent], num_agents: int, base: SimConfig, notes: dict[str, Any],
              min_events: int, fixed: Collection[str] = ()) -> dict[str, Any]:
    """The fitted ``skills`` and, where the solutions inform them, ``difficulty_weight``, ``level_offsets`` and
    ``problem_spread``; knobs without enough events keep ``base``'s value and are named in ``notes``, knobs
    in ``fixed`` keep it silently (the others are fitted given it)."""
    kept = notes.setdefault("defaults_kept", {})
    agents = np.array([s.agent for s in solves])
    centred = np.array([s.difficulty for s in solves]) - 0.5
    correct = np.array([s.correct for s in solves], dtype=float)
    per_agent = all((agents == i).sum() >= min_events for i in range(num_agents))
    skill_of = agents if per_agent else np.zeros_like(agents)
    count = num_agents if per_agent else 1
    if not per_agent:
        notes["skills_pooled"] = f"fewer than {min_events} solutions for some agent: one skill for all agents"
    fit_weight = centred.std() >= 0.05 and "difficulty_weight" not in fixed
    if not fit_weight and "difficulty_weight" not in fixed:
        kept["difficulty_weight"] = "the traced problems all have about the same difficulty"
    levels, basis, level_index = _level_basis(solves, centred, fit_weight, min_events,
                                              {} if "level_offsets" in fixed else kept)
    if "level_offsets" in fixed:
        basis, level_index = basis[:, :0], np.full(len(solves), -1)
    fixed_offsets = np.array([_offset(base, s.level) for s in solves])
    in_fitted_level = level_index >= 0
    order, starts = _groups(solves)
    sizes = np.diff(np.append(starts, len(solves)))
    fit_spread = int((sizes >= 2).sum()) >= min_events and "problem_spread" not in fixed
    if not fit_spread and "problem_spread" not in fixed:
        kept["problem_spread"] = f"fewer than {min_events} problems with two or more first solutions"
    nodes, log_weights = _quadrature()
    free_offsets = basis.shape[1]

    def unpack(params: np.ndarray) -> tuple[np.ndarray, float, float]:
        weight = params[count] if fit_weight else base.difficulty_weight
        offsets = fixed_offsets.copy()
        if free_offsets:
            fitted = basis @ params[count + 1:count + 1 + free_offsets]
            offsets[in_fitted_level] = fitted[level_index[in_fitted_level]]
        spread = params[-1] if fit_spread else base.problem_spread
        return params[skill_of] - weight * centred + offsets, weight, spread

    def loss(params: np.ndarray) -> float:
        eta, _, spread = unpack(params)
        if not spread:
            return float(np.sum(np.logaddexp(0.0, eta) - correct * eta))
        logits = eta[:, None] - spread * nodes[None, :]
        per_draw = correct[:, None] * logits - np.logaddexp(0.0, logits)
        per_problem = np.add.reduceat(per_draw[order], starts, axis=0)
        return -float(np.sum(logsumexp(per_problem + log_weights[None, :], axis=1)))

    bounds = [(-MAX_SKILL_LOGIT, MAX_SKILL_LOGIT)] * count + [(-20, 20)] + [(-MAX_LOGIT, MAX_LOGIT)] * free_offsets
    spread_starts = SPREAD_STARTS if fit_spread else (0.0,)
    results = [optimize.minimize(loss, np.array([0.0] * (count + 1 + free_offsets) + [start] * fit_spread),
                                 method="L-BFGS-B", bounds=bounds + [(0.0, MAX_SPREAD)] * fit_spread)
               for start in spread_starts]
    params = min(results, key=lambda r: r.fun).x
    knobs: dict[str, Any] = {"skills": tuple(round(float(np.clip(1 / (1 + math.exp(-a)), 0.01, 0.99)), 4)
                                             for a in params[:count])}
    if fit_weight:
        knobs["difficulty_weight"] = round(float(params[count]), 4)
    if free_offsets:
        fitted = basis @ params[count + 1:count + 1 + free_offsets]
        table = list(base.level_offsets) + [0.0] * (max(levels) + 1 - len(base.level_offsets))
        for level, value in zip(levels, fitted):
            table[level] = round(float(value), 4)
        knobs["level_offsets"] = tuple(table)
    if fit_spread:
        knobs["problem_spread"] = round(float(params[-1]), 4)
    return knobs


def _offset(config: SimConfig, level: int | None) -> float:
    return config.level_offsets[level] if level is not None and level < len(config.level_offsets) else 0.0


def _groups(solves: Sequence[SolveEvent]) -> tuple[np.ndarray, np.ndarray]:
    """The draws' order sorted by problem, and where each problem starts in it (for ``np.add.reduceat``)."""
    keys = [s.problem for s in solves]
    order = np.array(sorted(range(len(keys)), key=keys.__getitem__), dtype=int)
    sorted_keys = [keys[i] for i in order]
    starts = np.array([i for i in range(len(sorted_keys)) if i == 0 or sorted_keys[i] != sorted_keys[i - 1]], dtype=int)
    return order, starts


def _level_basis(solves: Sequence[SolveEvent], centred: np.ndarray, fit_weight: bool, min_events: int,
                 kept: dict[str, str]) -> tuple[list[int], np.ndarray, np.ndarray]:
    """(fitted levels, a basis of their allowed offsets (levels x free), each draw's index among them or -1)."""
    counts: dict[int, int] = defaultdict(int)
    for s in solves:
        if s.level is not None:
            counts[s.level] += 1
    levels = sorted(level for level, n in counts.items() if n >= min_events)
    index = {level: k for k, level in enumerate(levels)}
    level_index = np.array([index.get(s.level, -1) if s.level is not None else -1 for s in solves])
    empty = np.zeros((len(levels), 0))
    if len(levels) < 2:
        kept["level_offsets"] = f"fewer than two problem levels with {min_events} or more first solutions"
        return levels, empty, np.full(len(solves), -1)
    n = np.array([counts[level] for level in levels], dtype=float)
    rows = [n]
    if fit_weight:
        rows.append(n * np.array([centred[level_index == k].mean() for k in range(len(levels))]))
    constraints = np.array(rows)
    _, singular, vt = np.linalg.svd(constraints)
    rank = int((singular > 1e-9 * singular.max()).sum())
    if rank >= len(levels):
        kept["level_offsets"] = "each level has its own difficulty: difficulty_weight accounts for the levels"
        return levels, empty, np.full(len(solves), -1)
    return levels, vt[rank:].T, level_index


def agreement_shares(solves: Sequence[SolveEvent], config: SimConfig) -> dict[str, dict[str, float]]:
    """Per level ("all" for every episode): the share of episodes whose agents' first solutions are all right or
    all wrong, observed and predicted by ``config`` (its latent spread integrated out), and what independent
    agents with the same accuracy would give."""
    from deliberation_env.backends.sim import solve_probability

    nodes, log_weights = _quadrature()
    weights = np.exp(log_weights)
    by_episode: dict[str, list[SolveEvent]] = defaultdict(list)
    for s in solves:
        by_episode[s.episode].append(s)
    rows: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for group in by_episode.values():
        if len(group) < 2:
            continue
        p = np.array([[solve_probability(config, s.agent, s.difficulty, float(z), s.level) for z in nodes]
                      for s in group])  # agents x nodes
        fitted = float(weights @ (p.prod(axis=0) + (1 - p).prod(axis=0)))
        marginal = p @ weights
        independent = float(marginal.prod() + (1 - marginal).prod())
        observed = float(len({s.correct for s in group}) == 1)
        level = group[0].level
        for key in ("all",) if level is None else ("all", str(level)):
            rows[key].append((observed, fitted, independent))
    return {key: {"episodes": len(values), **{name: round(float(np.mean(column)), 4) for name, column in
                                              zip(("observed", "fitted", "independent"), zip(*values))}}
            for key, values in sorted(rows.items(), key=lambda item: (item[0] != "all", item[0]))}
