"""Fit every ``SimConfig`` knob to episode traces (the engine behind ``python -m deliberation_env.analysis.calibrate``).

``fit(episodes)`` reads events off the traces (``extract_events``) and estimates every knob by the sim's
own model of that event (``docs/calibration.md`` lists each knob, its events and its estimator); the
first-solution knobs (skills, difficulty weight, level offsets, problem spread) are fitted by
``deliberation_env.analysis.solve_fit``. A knob without enough events keeps its default, and the notes
say so under ``defaults_kept``.

Each agent's round is counted once, however many traced episodes pass through it: round 0 once per
problem, episode seed and env settings; a later round once per state at its start (the same, and the
joint actions so far) and the agent's own action. Protocols that share seeds, or the joint actions of a
replay set's tree (which share each agent's refinement), do not weigh one draw twice.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy import optimize, stats

from deliberation_env.analysis.metrics import auroc
from deliberation_env.analysis.solve_fit import SolveEvent, agreement_shares, fit_solve
from deliberation_env.analysis.traces import Episode
from deliberation_env.backends.sim import (
    SimConfig,
    problem_difficulty,
    problem_latent,
    problem_level,
    solve_probability,
)
from deliberation_env.core.deliberation import Action
from deliberation_env.core.features import text_profile

MIN_EVENTS = 20
"""Fewer events than this leave a knob at its default (fewer round-0 solutions is an error)."""
_EPS = 1e-6


class CalibrationError(ValueError):
    """Traces that cannot be fitted (empty, too few events): says what is missing."""


@dataclass
class Events:
    """What the fit reads off the traces, one list per kind of event."""

    solves: list[SolveEvent] = field(default_factory=list)
    """Every round-0 solution (agent, difficulty, correct, has_answer, problem, episode, level)."""
    wrong_pairs: list[tuple[str, str, bool]] = field(default_factory=list)
    """(problem key, episode key, same answer) for every pair of round-0 wrong answers."""
    refines: list[dict[str, Any]] = field(default_factory=list)
    """One dict per REFINE: agent, difficulty, latent, level, own/peer answers and correctness at round start, outcome."""
    confidences: list[tuple[int, bool, float]] = field(default_factory=list)
    """(agent, correct, confidence) of every fresh confidence reading of an agent holding an answer."""
    tokens: dict[str, list[tuple[int, float]]] = field(default_factory=lambda: {"solve": [], "refine": [], "critic": []})
    """Per request kind: (completion tokens, difficulty)."""
    texts: list[tuple[bool, str]] = field(default_factory=list)
    """(correct, text) of every solution and revision."""
    num_agents: int = 0


def extract_events(episodes: Sequence[Episode], problems: dict[str, tuple[Any, Any] | None] | None = None) -> Events:
    """Read the fit's events off the episodes, each once (``problems``: from ``traced_problems``): an agent's
    round is a function of the state at the round's start and its own action (its requests' seeds and
    messages are), so episodes that share those share the agent's round, whatever the other agents did."""
    problems = traced_problems(episodes) if problems is None else problems
    events = Events()
    seen: set[tuple[str, tuple[tuple[str | None, ...], ...], int, str | None]] = set()
    """(round-0 state, joint actions before the round, agent, its action) of every agent round read so far."""
    for episode in episodes:
        difficulty = problem_difficulty(episode.problem_id, episode.difficulty)
        built = problems.get(traced_problem(episode))
        level = problem_level(built[1].metadata) if built is not None else None
        latent = problem_latent(episode.task, episode.problem_id)
        n = episode.num_agents
        events.num_agents = max(events.num_agents, n)
        has_critic = any(r.kind == "critic" for rnd in episode.rounds for a in rnd.agents for r in a.requests)
        start = _state_key(episode)
        history: tuple[tuple[str | None, ...], ...] = ()  # the joint actions before the round
        for before, rnd in zip((None, *episode.rounds), episode.rounds):
            if before is not None:
                history = tuple(tuple(a.action for a in r.agents) for r in episode.rounds[1:rnd.index])
            elif (start, history, 0, None) not in seen:
                _round0_events(events, episode, difficulty, level, start)
            for i, agent in enumerate(rnd.agents):
                if (start, history, i, agent.action) in seen:
                    continue
                seen.add((start, history, i, agent.action))
                kinds = [r.kind for r in agent.requests]
                for request in agent.requests:
                    events.tokens[request.kind].append((request.completion_tokens, difficulty))
                fresh = "critic" in kinds if has_critic else bool(kinds)
                if fresh and agent.answer is not None:
                    events.confidences.append((i, agent.correct, agent.confidence))
                if "solve" in kinds or "refine" in kinds:
                    events.texts.append((agent.correct, agent.text))
                if before is None or agent.action != Action.REFINE.name:
                    continue
                peers = [before.agents[(i + k) % n] for k in range(1, n)]
                events.refines.append({
                    "agent": i, "difficulty": difficulty, "latent": latent, "level": level,
                    "own_answer": before.agents[i].answer, "own_correct": before.agents[i].correct,
                    "peer_answers": [p.answer for p in peers], "peer_correct": [p.correct for p in peers],
                    "answer": agent.answer, "correct": agent.correct,
                })
    return events


def _round0_events(events: Events, episode: Episode, difficulty: float, level: int | None, state: str) -> None:
    """The round-0 solutions of an episode and the pairs of its wrong answers."""
    first = episode.rounds[0].agents
    for i, agent in enumerate(first):
        events.solves.append(SolveEvent(i, difficulty, agent.correct, agent.answer is not None,
                                        traced_problem(episode), state, level))
    wrong = [a.answer for a in first if not a.correct and a.answer is not None]
    for x in range(len(wrong)):
        for y in range(x + 1, len(wrong)):
            events.wrong_pairs.append((traced_problem(episode), state, wrong[x] == wrong[y]))


def traced_problem(episode: Episode) -> str:
    """The traced problem: task, settings, split and id."""
    return json.dumps([episode.task, episode.task_settings, episode.split, episode.problem_id], sort_keys=True)


def _state_key(episode: Episode) -> str:
    """An episode's round-0 state: its problem, seed, agents' backends and env options."""
    return json.dumps([traced_problem(episode), episode.seed, episode.num_agents, episode.backends, episode.options],
                      sort_keys=True)


def traced_problems(episodes: Sequence[Episode]) -> dict[str, tuple[Any, Any] | None]:
    """(task, ``Problem``) of each traced problem (``traced_problem``), or None where the task cannot be built here."""
    from deliberation_env.registry import TASKS

    problems: dict[str, tuple[Any, Any] | None] = {}
    tasks: dict[str, dict[str, Any] | None] = {}
    for episode in episodes:
        key = traced_problem(episode)
        if key in problems:
            continue
        task_key = json.dumps([episode.task, episode.task_settings, episode.split], sort_keys=True)
        if task_key not in tasks:
            try:
                task = TASKS.make(episode.task, **episode.task_settings)
                tasks[task_key] = {p.id: (task, p) for p in task.problems(episode.split)}
            except Exception:  # a task needing data that is not here: no levels, default distractor counts
                tasks[task_key] = None
        built = tasks[task_key]
        problems[key] = built.get(episode.problem_id) if built else None
    return problems


# ------------------------------------------------------------------------------------ the fit
def fit(episodes: Sequence[Episode], base: SimConfig | None = None,
        fixed: Collection[str] = ()) -> tuple[SimConfig, dict[str, Any]]:
    """The fitted ``SimConfig`` and notes: event counts, knobs kept at their default and why. Knobs named in
    ``fixed`` keep ``base``'s value (the others are fitted given it)."""
    unknown = sorted(set(fixed) - {f.name for f in fields(SimConfig)})
    if unknown:
        raise CalibrationError(f"cannot fix unknown knob(s) {unknown}; SimConfig knobs: "
                               f"{', '.join(f.name for f in fields(SimConfig))}")
    if not episodes:
        raise CalibrationError("the traces hold no episodes: record some with parallel_env(trace=...) first")
    base = base or SimConfig()
    problems = traced_problems(episodes)
    events = extract_events(episodes, problems)
    if len(events.solves) < MIN_EVENTS:
        raise CalibrationError(
            f"only {len(events.solves)} round-0 solutions in the traces; at least {MIN_EVENTS} are needed to fit "
            "the agents' skills (record more episodes)")
    notes: dict[str, Any] = {"episodes": len(episodes), "defaults_kept": {}, "events": {
        "solves": len(events.solves), "refines": len(events.refines), "confidences": len(events.confidences),
        "wrong_answer_pairs": len(events.wrong_pairs), **{f"{k}_requests": len(v) for k, v in events.tokens.items()}}}
    knobs: dict[str, Any] = {}
    knobs.update(fit_solve(events.solves, events.num_agents, base, notes, MIN_EVENTS, fixed))
    config = replace(base, **knobs)
    notes["agreement"] = agreement_shares(events.solves, config)
    knobs.update(_fit_refine(events, config, notes, fixed))
    knobs.update(_fit_confidence(events, base, notes))
    knobs.update(_fit_tokens(events, base, notes))
    knobs.update(_fit_answers_and_texts(events, problems, base, notes))
    if fixed:
        notes["fixed"] = {name: getattr(base, name) for name in sorted(fixed)}
        for name in fixed:
            knobs.pop(name, None)
            notes["defaults_kept"].pop(name, None)
    return replace(base, **knobs), notes


def _keep(notes: dict[str, Any], names: Sequence[str], why: str) -> dict[str, Any]:
    for name in names:
        notes["defaults_kept"][name] = why
    return {}


_REFINE_KNOBS = ("sycophancy", "refine_break", "copy_peer", "refine_self", "refine_peer_gain", "follow_wrong")


def _refine_arrays(events: Events, config: SimConfig) -> dict[str, np.ndarray]:
    """Per REFINE event, the counts the sim's refine model needs and the observed outcome category."""
    rows = []
    for event in events.refines:
        peers = event["peer_answers"]
        wrong_peer_answers = {a for a, ok in zip(peers, event["peer_correct"]) if a is not None and not ok}
        own = event["own_answer"]
        outcome = 0 if event["correct"] else (1 if event["answer"] in wrong_peer_answers else 2)
        rows.append((
            event["own_correct"], len(peers) or 1, sum(a is not None for a in peers), len(wrong_peer_answers) > 0,
            sum(1 for a, ok in zip(peers, event["peer_correct"]) if a is not None and not ok),
            sum(event["peer_correct"]), own is not None and own in wrong_peer_answers,
            solve_probability(config, event["agent"], event["difficulty"], event["latent"], event["level"]), outcome,
        ))
    names = ("own_right", "peers", "answered", "any_wrong", "wrong", "right", "own_in_wrong", "p_solve", "outcome")
    return {name: np.array(column, dtype=float) for name, column in zip(names, zip(*rows))} if rows else {}


def refine_probabilities(params: dict[str, float], data: dict[str, np.ndarray]) -> np.ndarray:
    """P(right), P(a wrong peer's answer), P(another wrong answer) per REFINE event, under the sim's model."""
    answered = np.maximum(data["answered"], 1)
    copy = params["copy_peer"] * (data["answered"] > 0)
    switch = params["sycophancy"] * data["wrong"] / data["peers"]
    wrong_if_right = switch + (1 - switch) * params["refine_break"]
    p_fix = np.minimum(0.95, params["refine_self"] * data["p_solve"] + params["refine_peer_gain"] * data["right"] / data["peers"])
    follow = params["follow_wrong"] * data["any_wrong"]
    stay_in_wrong = follow + (1 - follow) * data["own_in_wrong"]
    right = np.where(data["own_right"] > 0, (1 - copy) * (1 - wrong_if_right),
                     (1 - copy) * p_fix) + copy * data["right"] / answered
    peer_wrong = np.where(data["own_right"] > 0, (1 - copy) * switch,
                          (1 - copy) * (1 - p_fix) * stay_in_wrong) + copy * data["wrong"] / answered
    return np.stack([right, peer_wrong, np.clip(1 - right - peer_wrong, 0, 1)], axis=1)


def _fit_refine(events: Events, config: SimConfig, notes: dict[str, Any], fixed: Collection[str] = ()) -> dict[str, Any]:
    data = _refine_arrays(events, config)
    if len(events.refines) < MIN_EVENTS:
        return _keep(notes, _REFINE_KNOBS, f"fewer than {MIN_EVENTS} REFINE events")
    own_right, wrong, right = data["own_right"] > 0, data["wrong"] > 0, data["right"] > 0
    support = {
        "sycophancy": own_right & wrong, "refine_break": own_right, "refine_self": ~own_right,
        "refine_peer_gain": ~own_right & right, "follow_wrong": ~own_right & wrong, "copy_peer": ~own_right,
    }
    free = [k for k in _REFINE_KNOBS if support[k].sum() >= MIN_EVENTS and k not in fixed]
    for name in _REFINE_KNOBS:
        if name not in free and name not in fixed:
            _keep(notes, [name], f"fewer than {MIN_EVENTS} REFINE events that inform it")
    if not free:
        return {}
    fixed = {name: getattr(config, name) for name in _REFINE_KNOBS}
    outcome = data["outcome"].astype(int)

    def loss(values: np.ndarray) -> float:
        probabilities = refine_probabilities({**fixed, **dict(zip(free, values))}, data)
        return -float(np.sum(np.log(np.maximum(probabilities[np.arange(len(outcome)), outcome], _EPS))))

    starts = [np.array([fixed[k] for k in free]), np.full(len(free), 0.3), np.full(len(free), 0.1)]
    best = min((optimize.minimize(loss, s, method="L-BFGS-B", bounds=[(0, 1)] * len(free)) for s in starts),
               key=lambda r: r.fun)
    return {name: round(float(value), 4) for name, value in zip(free, best.x)}


def _fit_confidence(events: Events, base: SimConfig, notes: dict[str, Any]) -> dict[str, Any]:
    names = ["confidence_right", "confidence_wrong", "confidence_noise", "overconfidence"]
    rows = events.confidences
    right = sum(1 for r in rows if r[1])
    if min(right, len(rows) - right) < MIN_EVENTS // 4:
        return _keep(notes, names, "too few confidence readings of right and of wrong answers")
    agents = np.array([r[0] for r in rows])
    is_right = np.array([r[1] for r in rows], dtype=float)
    value = np.array([r[2] for r in rows])
    n = events.num_agents
    low, high = value <= 0.01 + 1e-9, value >= 0.99 - 1e-9

    def unpack(params: np.ndarray) -> tuple[np.ndarray, float]:
        offsets = np.concatenate([[0.0], params[3:]])
        return params[0] * is_right + params[1] * (1 - is_right) + offsets[agents], math.exp(params[2])

    def loss(params: np.ndarray) -> float:  # censored normal (the sim clips to [0.01, 0.99])
        mean, sigma = unpack(params)
        z = (value - mean) / sigma
        inside = stats.norm.logpdf(z) - math.log(sigma)
        return -float(np.sum(np.where(low, stats.norm.logcdf((0.01 - mean) / sigma),
                                      np.where(high, stats.norm.logsf((0.99 - mean) / sigma), inside))))

    start = np.array([value[is_right > 0].mean(), value[is_right == 0].mean(), math.log(0.15), *np.zeros(n - 1)])
    params = optimize.minimize(loss, start, method="L-BFGS-B").x
    sigma = math.exp(params[2])
    real = auroc(value[is_right > 0], value[is_right == 0])
    offsets = np.concatenate([[0.0], params[3:]])[agents]
    predicted = _simulated_auroc(params[0], params[1], offsets, is_right, sigma)
    notes["confidence_auroc"] = {"real": round(real, 4), "sim_at_fitted_noise": round(predicted, 4),
                                 "fitted_noise": round(sigma, 4)}
    if abs(predicted - real) > 0.02:  # not normal enough: keep the means, set the noise to give the real AUROC
        matched = _match_auroc(params[0], params[1], offsets, is_right, real)
        if matched is not None:
            sigma = matched
            notes["confidence_auroc"]["note"] = f"noise {sigma} gives the real AUROC (the fitted noise does not)"
        else:
            notes["confidence_auroc"]["note"] = "the real AUROC cannot be reached by the noise alone"
    offsets = tuple(round(float(o), 4) for o in np.concatenate([[0.0], params[3:]]))
    return {"confidence_right": round(float(np.clip(params[0], 0, 1)), 4),
            "confidence_wrong": round(float(np.clip(params[1], 0, 1)), 4),
            "confidence_noise": round(sigma, 4), "overconfidence": offsets}


def _simulated_auroc(mean_right: float, mean_wrong: float, offsets: np.ndarray, is_right: np.ndarray,
                     sigma: float) -> float:
    """The AUROC of the sim's confidence on these events (fixed draws: smooth in sigma)."""
    draws = np.random.default_rng(0).standard_normal((8, len(is_right)))
    means = np.where(is_right > 0, mean_right, mean_wrong) + offsets
    values = np.round(np.clip(means + sigma * draws, 0.01, 0.99), 2)
    return auroc(values[:, is_right > 0].ravel(), values[:, is_right == 0].ravel())


def _match_auroc(mean_right: float, mean_wrong: float, offsets: np.ndarray, is_right: np.ndarray,
                 target: float) -> float | None:
    """The noise at which the sim's confidence has the real AUROC, or None where no noise does."""
    if math.isnan(target):
        return None

    def simulated(sigma: float) -> float:
        return _simulated_auroc(mean_right, mean_wrong, offsets, is_right, sigma)

    low, high = simulated(0.005) - target, simulated(2.0) - target
    if low * high > 0:
        return None
    return round(float(optimize.brentq(lambda s: simulated(s) - target, 0.005, 2.0, xtol=1e-4)), 4)


def _fit_tokens(events: Events, base: SimConfig, notes: dict[str, Any]) -> dict[str, Any]:
    knobs = {}
    for kind in ("solve", "refine", "critic"):
        rows = events.tokens[kind]
        if len(rows) < MIN_EVENTS:
            _keep(notes, [f"{kind}_tokens"], f"fewer than {MIN_EVENTS} {kind} requests")
            continue
        scaled = [t / (0.7 + 0.6 * d) if kind != "critic" else t for t, d in rows]  # the sim's length model
        knobs[f"{kind}_tokens"] = max(1, round(float(np.mean(scaled))))
    return knobs


def _fit_answers_and_texts(events: Events, problems: dict[str, tuple[Any, Any] | None], base: SimConfig,
                           notes: dict[str, Any]) -> dict[str, Any]:
    knobs: dict[str, Any] = {}
    wrong = [s for s in events.solves if not s[2]]
    if len(wrong) >= MIN_EVENTS:
        knobs["no_answer_rate"] = round(sum(not s[3] for s in wrong) / len(wrong), 4)
    else:
        _keep(notes, ["no_answer_rate"], f"fewer than {MIN_EVENTS} wrong first solutions")
    decay = _fit_distractor_decay(events, problems, notes)
    if decay is not None:
        knobs["distractor_decay"] = decay
    for correct, suffix in ((True, "right"), (False, "wrong")):
        profiles = [text_profile(text) for ok, text in events.texts if ok == correct]
        if len(profiles) < MIN_EVENTS:
            _keep(notes, [f"check_rate_{suffix}", f"hedge_rate_{suffix}"], f"fewer than {MIN_EVENTS} {suffix} texts")
            continue
        knobs[f"check_rate_{suffix}"] = round(float(np.mean([p[2] for p in profiles])), 4)
        knobs[f"hedge_rate_{suffix}"] = round(float(np.mean([p[3] for p in profiles])), 4)
    return knobs


def _distractor_counts(problems: dict[str, tuple[Any, Any] | None]) -> dict[str, int]:
    """How many distractors the sim would draw from for each traced problem (4 where the task cannot be built)."""
    counts = {}
    for key, built in problems.items():
        if built is None:
            counts[key] = 4
            continue
        task, problem = built
        counts[key] = len(task.distractors(problem, random.Random(f"{task.name}/{problem.id}")))
    return counts


def _fit_distractor_decay(events: Events, problems: dict[str, tuple[Any, Any] | None],
                          notes: dict[str, Any]) -> float | None:
    if len(events.wrong_pairs) < MIN_EVENTS // 2:
        _keep(notes, ["distractor_decay"], f"fewer than {MIN_EVENTS // 2} pairs of wrong first answers")
        return None
    counts = _distractor_counts(problems)
    lengths = np.array([max(1, counts.get(problem, 4)) for problem, _, _ in events.wrong_pairs])
    observed = float(np.mean([same for _, _, same in events.wrong_pairs]))

    def agreement(decay: float) -> float:
        total = 0.0
        for length in lengths:
            weights = decay ** np.arange(length)
            total += float(np.sum(weights**2) / np.sum(weights) ** 2)
        return total / len(lengths)

    if observed >= agreement(0.001):
        return 0.001
    if observed <= agreement(1.0):
        notes["distractor_decay_note"] = "wrong answers agree less than uniform distractors would: decay 1"
        return 1.0
    return round(float(optimize.brentq(lambda d: agreement(d) - observed, 0.001, 1.0, xtol=1e-4)), 4)


def write_config(config: SimConfig, notes: dict[str, Any], path: str | Path) -> None:
    """Save the fit as ``{"config": knobs, "calibration": notes}`` (``SimBackend(config=path)`` reads it)."""
    record = {"config": {f.name: getattr(config, f.name) for f in fields(SimConfig)}, "calibration": notes}
    Path(path).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
