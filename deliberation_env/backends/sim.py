"""A seeded simulated LLM: fast, no model, and realistic enough that meta-actions matter.

It asks the deliberation that made each request for its privileged ``SimContext`` (the problem,
and whether the answers already held are correct; ``core.sim_context``), decides the outcome from the knobs of ``SimConfig``, and writes
text in the task's own format (``task.render_solution``), so the task's real answer
extraction runs on it exactly as on an LLM's text. Each request is answered from
``random.Random(request.seed)`` alone, so a seeded episode replays exactly.

The model of an agent i on a problem of difficulty d (``Problem.difficulty``, else a stable
hash of its id), with ``s_i = skills[i % len(skills)]``:

- solve: correct with p = sigmoid(logit(s_i) - difficulty_weight * (d - 0.5) + level_offsets[level]
  - problem_spread * z), where ``level`` is the problem's ``metadata["level"]`` (no offset without one)
  and z ~ N(0, 1) is the problem's latent difficulty, a stable hash of (task, problem id) shared by
  all agents and seeds (``problem_latent``): with ``problem_spread`` > 0 the agents' first answers
  are right or wrong together, as a real model's are; otherwise no answer (``no_answer_rate``) or a
  distractor, the first distractors much likelier (``distractor_decay``), so wrong agents often
  agree on the same wrong answer;
- refine, currently right: with p = ``sycophancy`` x (share of wrong peers) the agent adopts a
  wrong peer's answer, else it stays right;
- refine, currently wrong: right with p = ``refine_self`` x p_solve + ``refine_peer_gain`` x
  (share of right peers); otherwise it adopts a wrong peer's answer (``follow_wrong``) or keeps
  its own;
- critic: confidence ~ (``confidence_right`` or ``confidence_wrong``) + ``overconfidence[i]`` +
  N(0, ``confidence_noise``), clipped: informative, noisy, and over-confident for some agents;
- text: right agents often say they double-checked, wrong ones often hedge (``check_rate_*``,
  ``hedge_rate_*``), which shows in the reasoning profile;
- tokens: completion lengths drawn around ``solve_tokens`` / ``refine_tokens`` (longer on
  harder problems) and ``critic_tokens``; prompt tokens estimated from the prompt's length;
- knobs for behaviour that real traces show (``deliberation_env.analysis.calibrate`` fits them), off by
  default so that the default sim is unchanged: ``copy_peer`` (a refining agent just adopts a
  peer's answer, as small models do), ``refine_break`` (a right agent's revision comes out
  wrong with no wrong peer to blame), ``problem_spread`` and ``level_offsets`` (above).

``SimBackend(config=...)`` takes a ``SimConfig``, a dict of knobs, or the path of a JSON file
of knobs (``{"skills": [0.6, 0.5], ...}`` or the ``{"config": {...}, ...}`` that calibrate writes).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from statistics import NormalDist
from typing import Any

from deliberation_env.backends.base import estimate_tokens
from deliberation_env.core.sim_context import SimContext, sim_context
from deliberation_env.requests import Completion, Request


@dataclass(frozen=True)
class SimConfig:
    """Every knob of the simulated LLM (defaults give a team where deliberation choices matter)."""

    skills: tuple[float, ...] = (0.72, 0.55, 0.4)
    """P(correct first solution) on a problem of middle difficulty, per agent (cycled)."""
    difficulty_weight: float = 3.0
    """How much harder (in logits) the hardest problem is than the middle one, times 2."""
    no_answer_rate: float = 0.05
    """P(a wrong solution states no final answer)."""
    distractor_decay: float = 0.35
    """Weight ratio between consecutive distractors (small: wrong answers concentrate)."""
    sycophancy: float = 0.45
    """P(a right agent switches to a wrong peer's answer when REFINE-ing among only wrong peers)."""
    refine_self: float = 0.35
    """Scales a wrong agent's own chance to fix its answer when it REFINEs."""
    refine_peer_gain: float = 0.55
    """Added chance of fixing it, times the share of right peers."""
    follow_wrong: float = 0.5
    """P(a wrong agent that stays wrong adopts a wrong peer's answer)."""
    confidence_right: float = 0.72
    """Mean critic confidence when the agent's answer is right."""
    confidence_wrong: float = 0.5
    """Mean critic confidence when it is wrong."""
    confidence_noise: float = 0.14
    """Standard deviation of the critic's confidence around its mean."""
    overconfidence: tuple[float, ...] = (0.0, 0.08, 0.18)
    """Added to each agent's confidence (cycled): the weakest agent is the most over-confident."""
    check_rate_right: float = 0.6
    """P(a right answer's text says it double-checked the work)."""
    check_rate_wrong: float = 0.2
    """P(a wrong answer's text says so too)."""
    hedge_rate_right: float = 0.125
    """P(a right answer's text hedges ("not sure ...")."""
    hedge_rate_wrong: float = 0.5
    """P(a wrong answer's text hedges)."""
    solve_tokens: int = 220
    """Mean completion tokens of a first solution (scaled by 0.7-1.3 with difficulty)."""
    refine_tokens: int = 260
    """Mean completion tokens of a revised solution."""
    critic_tokens: int = 12
    """Mean completion tokens of a critic verdict."""
    copy_peer: float = 0.0
    """P(a REFINE-ing agent just adopts the answer of a peer, uniformly among those holding one)."""
    refine_break: float = 0.0
    """P(a right agent that REFINEs and is not swayed by a wrong peer still ends up wrong)."""
    problem_spread: float = 0.0
    """Standard deviation (in logits) of each problem's latent difficulty, shared by all its agents."""
    level_offsets: tuple[float, ...] = ()
    """Logit offset of a first solution per problem level (``metadata["level"]``: 0, 1, ...); missing ones are 0."""

    def __post_init__(self) -> None:
        for name in ("no_answer_rate", "distractor_decay", "sycophancy", "refine_self", "refine_peer_gain",
                     "follow_wrong", "confidence_right", "confidence_wrong", "check_rate_right", "check_rate_wrong",
                     "hedge_rate_right", "hedge_rate_wrong", "copy_peer", "refine_break"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"SimConfig.{name} must be in [0, 1], got {value!r}")
        if not self.skills or not all(0.0 < s < 1.0 for s in self.skills):
            raise ValueError(f"SimConfig.skills must be probabilities in (0, 1), got {self.skills!r}")
        if not self.overconfidence:
            raise ValueError("SimConfig.overconfidence needs at least one value")
        if not self.confidence_noise >= 0.0:
            raise ValueError(f"SimConfig.confidence_noise must be >= 0, got {self.confidence_noise!r}")
        for name in ("solve_tokens", "refine_tokens", "critic_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"SimConfig.{name} must be >= 1")
        if not (math.isfinite(self.problem_spread) and 0.0 <= self.problem_spread <= MAX_LOGIT):
            raise ValueError(f"SimConfig.problem_spread must be in [0, {MAX_LOGIT}] (logits), got {self.problem_spread!r}")
        if not isinstance(self.level_offsets, tuple) or not all(
                _is_number(o) and abs(o) <= MAX_LOGIT for o in self.level_offsets):
            raise ValueError(f"SimConfig.level_offsets must be a tuple of logit offsets in [-{MAX_LOGIT}, {MAX_LOGIT}], "
                             f"one per level from level 0, got {self.level_offsets!r}")


MAX_LOGIT = 20.0
"""Bound on ``problem_spread`` and on each level offset (in logits): beyond it every answer is decided."""
_ADDED_KNOBS: dict[str, Any] = {"copy_peer": 0.0, "refine_break": 0.0, "problem_spread": 0.0, "level_offsets": ()}
"""Knobs added after caches keyed on identity() existed: named in the identity only when not at their default."""


def load_sim_config(source: str | os.PathLike | Mapping[str, Any]) -> SimConfig:
    """A ``SimConfig`` from a dict of knobs or a JSON file of them; errors name the file and the knob."""
    where = "SimConfig"
    if isinstance(source, (str, os.PathLike)):
        where = f"sim config file {os.fspath(source)!r}"
        try:
            with open(source, encoding="utf-8") as file:
                source = json.load(file)
        except FileNotFoundError:
            raise FileNotFoundError(f"{where} does not exist (write one with python -m deliberation_env.analysis.calibrate)") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"{where} is not a readable JSON file: {error}") from None
    if isinstance(source, Mapping) and isinstance(source.get("config"), Mapping):
        source = source["config"]  # the file calibrate writes: {"config": {...}, "calibration": {...}}
    if not isinstance(source, Mapping):
        raise ValueError(f"{where} must be a JSON object of SimConfig knobs, got {type(source).__name__}")
    known = {f.name: f for f in fields(SimConfig)}
    unknown = sorted(set(source) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown knob(s) {unknown}; SimConfig knobs: {', '.join(known)}")
    knobs: dict[str, Any] = {}
    for name, value in source.items():
        default = getattr(SimConfig, name)
        if isinstance(default, tuple):
            ok = isinstance(value, (list, tuple)) and all(_is_number(v) for v in value)
            value = tuple(float(v) for v in value) if ok else value
        elif isinstance(default, int):
            ok = _is_number(value) and float(value).is_integer()
            value = int(value) if ok else value
        else:
            ok = _is_number(value)
            value = float(value) if ok else value
        if not ok:
            kind = "a list of numbers" if isinstance(default, tuple) else type(default).__name__
            raise ValueError(f"{where}: knob {name!r} must be {kind}, got {value!r}")
        knobs[name] = value
    try:
        return SimConfig(**knobs)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def problem_difficulty(problem_id: str, difficulty: float | None) -> float:
    """The difficulty the sim uses: the problem's own, else a stable hash of its id in [0, 1]."""
    return (zlib.crc32(problem_id.encode()) % 1000) / 999.0 if difficulty is None else difficulty


def problem_latent(task_name: str, problem_id: str) -> float:
    """The problem's latent difficulty z ~ N(0, 1) for ``problem_spread``: a stable hash of (task, problem id)."""
    u = (zlib.crc32(f"{task_name}/{problem_id}".encode()) + 0.5) / 2**32
    return _NORMAL.inv_cdf(u)


def problem_level(metadata: Mapping[str, Any]) -> int | None:
    """The problem's level for ``level_offsets``: ``metadata["level"]`` when it is an int >= 0, else None."""
    level = metadata.get("level")
    return level if isinstance(level, int) and not isinstance(level, bool) and level >= 0 else None


def solve_probability(config: SimConfig, agent: int, difficulty: float, latent: float = 0.0,
                      level: int | None = None) -> float:
    """P(agent's first solution is right) on a problem of this difficulty, latent difficulty and level."""
    skill = config.skills[agent % len(config.skills)]
    logit = _logit(skill) - config.difficulty_weight * (difficulty - 0.5)
    if level is not None and level < len(config.level_offsets):
        logit += config.level_offsets[level]
    if config.problem_spread:
        logit -= config.problem_spread * latent
    return _sigmoid(logit)


_NORMAL = NormalDist()


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


class SimBackend:
    """The simulated LLM backend (see the module docstring for its model)."""

    def __init__(self, config: SimConfig | Mapping[str, Any] | str | os.PathLike | None = None, **knobs):
        if config is not None and knobs:
            raise TypeError("pass either a SimConfig or keyword knobs, not both")
        if config is not None and not isinstance(config, SimConfig):
            config = load_sim_config(config)
        try:
            self.config = config or SimConfig(**knobs)
        except TypeError as error:
            raise TypeError(f"{error}; SimConfig fields: {', '.join(SimConfig.__dataclass_fields__)}") from None
        self._distractors: dict[tuple[str, str], tuple[list[str], list[float]]] = {}
        """Per problem (its key and question: tasks built with other settings reuse ids): its distractors and their
        cumulative weights (what ``rng.choices`` sums from the weights)."""
        self._odds: dict[tuple[str, str, str, int], tuple[float, float]] = {}

    def identity(self) -> str:
        return "sim:" + ",".join(f"{k}={v}" for k, v in asdict(self.config).items()
                                 if k not in _ADDED_KNOBS or v != _ADDED_KNOBS[k])

    def __repr__(self) -> str:
        return f"SimBackend({self.config})"

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        return [self._answer(request) for request in requests]

    # ------------------------------------------------------------------
    def _answer(self, request: Request) -> Completion:
        context = sim_context(request)
        if context is None:
            raise ValueError(
                "SimBackend can only answer the pending requests of a live deliberation (it reads their SimContext "
                "there); use a real backend (transformers, openai) for free-form prompts"
            )
        rng = random.Random(request.seed)
        prompt_tokens = sum([estimate_tokens(m.content) for m in request.messages])
        if request.kind == "critic":
            return self._critic(request, context, rng, prompt_tokens)
        cfg, problem = self.config, context.problem
        difficulty, p_solve = self._problem_odds(context, request.agent)
        if request.kind == "solve":
            answer = problem.answer if rng.random() < p_solve else self._wrong(context, rng)
        else:
            answer = self._refined_answer(context, p_solve, rng)
        right = answer == problem.answer
        text = context.task.render_solution(problem, answer, rng)
        if rng.random() < (cfg.check_rate_right if right else cfg.check_rate_wrong):
            text = "I will work carefully and double-check each step.\n" + text
        if rng.random() < (cfg.hedge_rate_right if right else cfg.hedge_rate_wrong):
            text = "I'm not sure about this one, but here is my attempt.\n" + text
        mean = cfg.solve_tokens if request.kind == "solve" else cfg.refine_tokens
        tokens = max(16, int(rng.gauss(mean * (0.7 + 0.6 * difficulty), mean * 0.2)))
        token_logprobs = self._answer_token_logprobs(request, text, answer, right, rng) if request.token_logprobs else None
        return Completion(text=text, prompt_tokens=prompt_tokens, completion_tokens=min(tokens, request.max_tokens),
                          token_logprobs=token_logprobs)

    def _refined_answer(self, context: SimContext, p_solve: float, rng: random.Random) -> str | None:
        """The answer of a REFINE (see the module docstring)."""
        cfg, gold = self.config, context.problem.answer
        wrong_peers = [a for a, ok in zip(context.peer_answers, context.peer_correct) if a is not None and not ok]
        peers = len(context.peer_answers) or 1
        if cfg.copy_peer and any(a is not None for a in context.peer_answers) and rng.random() < cfg.copy_peer:
            return rng.choice([a for a in context.peer_answers if a is not None])
        if context.own_correct:
            switch = cfg.sycophancy * len(wrong_peers) / peers
            answer: str | None = rng.choice(wrong_peers) if wrong_peers and rng.random() < switch else gold
            if answer == gold and cfg.refine_break and rng.random() < cfg.refine_break:
                answer = self._wrong(context, rng)
            return answer
        share_right = sum(context.peer_correct) / peers
        if rng.random() < min(0.95, cfg.refine_self * p_solve + cfg.refine_peer_gain * share_right):
            return gold
        if wrong_peers and rng.random() < cfg.follow_wrong:
            return rng.choice(wrong_peers)
        return context.own_answer if context.own_answer is not None else self._wrong(context, rng)

    def _problem_odds(self, context: SimContext, agent: int) -> tuple[float, float]:
        """(difficulty, P(agent's first solution is right)) of the context's problem, computed once."""
        problem = context.problem
        key = (context.task.name, problem.id, problem.question, agent)
        odds = self._odds.get(key)
        if odds is None:
            if len(self._odds) > 100_000:
                self._odds.clear()
            difficulty = problem_difficulty(problem.id, problem.difficulty)
            p_solve = solve_probability(self.config, agent, difficulty, problem_latent(context.task.name, problem.id),
                                        problem_level(problem.metadata))
            odds = self._odds[key] = (difficulty, p_solve)
        return odds

    def _answer_token_logprobs(self, request: Request, text: str, answer: str | None, right: bool,
                               rng: random.Random) -> tuple[tuple[str, float], ...]:
        """For ``confidence="answer_logprobs"``: the text as three pieces, the answer's last occurrence carrying
        log(confidence), the confidence drawn as the critic's would be for this answer (drawn last, so the
        request's other draws are the same as without it)."""
        confidence = self._confidence(request.agent, answer, right, rng)
        start = text.rfind(answer) if answer else -1
        if start < 0:
            return ((text, math.log(confidence)),)
        end = start + len(answer)  # type: ignore[arg-type]
        pieces = ((text[:start], 0.0), (text[start:end], math.log(confidence)), (text[end:], 0.0))
        return tuple(piece for piece in pieces if piece[0])

    def _confidence(self, agent: int, answer: str | None, right: bool, rng: random.Random) -> float:
        """The confidence a critic gives an answer: informative, noisy, over-confident for some agents."""
        cfg = self.config
        if answer is None:
            return 0.15
        mean = (cfg.confidence_right if right else cfg.confidence_wrong) + cfg.overconfidence[agent % len(cfg.overconfidence)]
        return min(0.99, max(0.01, rng.gauss(mean, cfg.confidence_noise)))

    def _wrong(self, context, rng: random.Random) -> str | None:
        cfg = self.config
        if rng.random() < cfg.no_answer_rate:
            return None
        key = f"{context.task.name}/{context.problem.id}"
        cached = self._distractors.get((key, context.problem.question))
        if cached is None:
            options = context.task.distractors(context.problem, random.Random(key))
            cached = self._distractors[key, context.problem.question] = (
                options, list(itertools.accumulate(cfg.distractor_decay**k for k in range(len(options)))))
        options, cum_weights = cached
        if not options:
            return None
        return rng.choices(options, cum_weights=cum_weights)[0]

    def _critic(self, request: Request, context: SimContext, rng: random.Random, prompt_tokens: int) -> Completion:
        cfg = self.config
        confidence = self._confidence(request.agent, context.own_answer, context.own_correct, rng)
        verdict = "Yes" if confidence >= 0.5 else "No"
        text = f"{verdict}\nConfidence: {confidence:.2f}"
        tokens = max(4, int(rng.gauss(cfg.critic_tokens, 2)))
        return Completion(text=text, prompt_tokens=prompt_tokens, completion_tokens=min(tokens, request.max_tokens))
