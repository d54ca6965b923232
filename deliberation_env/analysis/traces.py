"""Episode traces: one JSON line per finished episode, and a strict reader.

    env = deliberation_env.parallel_env(backend=..., trace="traces.jsonl", trace_label="debate")
    env = TraceWrapper(deliberation_env.parallel_env(backend=...), "traces.jsonl", "debate")   # the same
    episodes = read_traces("traces.jsonl")         # list[Episode]

A trace records what a run did and what it cost, per round and agent, so that the simulator
can be calibrated on it (``deliberation_env.analysis.calibrate``). ``trace=`` takes a path (the wrapper opens
it in append mode and closes it in ``env.close()``) or a ``TraceWriter`` that many envs of one
process share. ``TraceWrapper`` reads the env through its public state: ``deliberation`` (each round's
requests and their token counts are in ``deliberation.round_requests``), ``last_actions`` and ``last_outcome``.
Each episode is written and flushed when it ends, so a killed run keeps every finished episode; an
episode cut short (a reset before its end) is not written.
The fields are documented in ``docs/calibration.md``. A policy that returns its actions as ``PolicyActions``
(a dict with the probability of every action index per agent) has those probabilities recorded with each agent's
action (``AgentRound.probabilities``); traces written before, and actions given as a plain dict, have none.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pettingzoo.utils.wrappers import BaseParallelWrapper

from deliberation_env.core.deliberation import Action
from deliberation_env.core.tools import request_kinds
from deliberation_env.grouping import answer_pending
from deliberation_env.replay.backend import replay_backend

TRACE_VERSION = 1
ACTIONS: tuple[str, ...] = tuple(action.name for action in Action)


class PolicyActions(dict):
    """One step's actions (agent -> action index) with the acting policy's probability of every action index, per
    agent: what a policy returns from ``act`` to have its probabilities traced. The env reads it as the dict it is."""

    def __init__(self, actions: Mapping[str, int], probabilities: Mapping[str, Sequence[float]]):
        super().__init__(actions)
        self.probabilities = {agent: tuple(float(p) for p in row) for agent, row in probabilities.items()}


class TraceError(ValueError):
    """A trace file that cannot be read: names the file, the line and what is wrong."""


@dataclass(frozen=True)
class RequestRecord:
    """One generation an agent asked for in a round."""

    kind: str
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class AgentRound:
    """One agent's state at the end of a round, and what the round cost it."""

    action: str | None
    requests: tuple[RequestRecord, ...]
    text: str
    answer: str | None
    correct: bool
    confidence: float
    confidence_source: str
    probabilities: tuple[float, ...] | None = None
    """The acting policy's probability of each action index when it chose ``action`` (None: not exposed)."""


@dataclass(frozen=True)
class Round:
    """One round: index 0 is the solve round (no actions, no rewards)."""

    index: int
    agents: tuple[AgentRound, ...]
    consensus: str | None
    consensus_correct: bool
    rewards: tuple[float, ...] | None
    reward_components: tuple[dict[str, float], ...] | None


@dataclass(frozen=True)
class Episode:
    """One finished episode (see ``docs/calibration.md`` for every field)."""

    task: str
    task_settings: dict[str, Any]
    split: str
    problem_id: str
    difficulty: float | None
    seed: int
    label: str | None
    num_agents: int
    max_rounds: int
    backends: tuple[str, ...]
    options: dict[str, Any]
    rounds: tuple[Round, ...]
    version: int = TRACE_VERSION
    extra: dict[str, Any] = field(default_factory=dict)
    replay_set: str | None = None
    """``<name>#<digest>`` of the replay set the episode was played on (``ReplaySet.identity``); None off replay and
    in traces written before it was recorded."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


class TraceWriter:
    """Appends episodes to a JSON-lines file; one writer may serve many envs of one process."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - open until close()
        except OSError as error:
            raise OSError(f"cannot open trace file {str(self.path)!r} for appending: {error}") from None
        self._lock = threading.Lock()

    def write(self, episode: Episode) -> None:
        line = episode.to_json() + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def task_settings(task: Any, task_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The task's constructor settings that rebuild it (``TASKS.make(name, **settings)``), JSON-safe.

    The keyword arguments the env got, plus every constructor parameter the task keeps as an
    attribute of the same name (e.g. arithmetic's ``levels``); ``data_dir`` is never recorded.
    """
    settings = {k: v for k, v in task_kwargs.items() if k != "data_dir"}
    parameters: Mapping[str, inspect.Parameter]
    try:
        parameters = inspect.signature(type(task).__init__).parameters
    except (TypeError, ValueError):
        parameters = {}
    for name in parameters:
        if name not in ("self", "data_dir") and name not in settings and hasattr(task, name):
            settings[name] = getattr(task, name)
    safe = {}
    for name, value in settings.items():
        value = list(value) if isinstance(value, tuple) else value
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            continue
        safe[name] = value
    return safe


class TraceWrapper(BaseParallelWrapper):
    """A ``DeliberationEnv`` that writes each finished episode to a trace (``parallel_env(trace=...)`` makes it).

    ``trace``: a path (opened in append mode, closed by ``close()``) or a shared ``TraceWriter``; ``label`` tags its
    episodes; ``task_kwargs``: the task's keywords, recorded with the task's own settings. Every stepping path goes
    through it: ``reset``/``step``, and the phased ``end_reset``/``end_step`` that batching runners call."""

    def __init__(self, env: Any, trace: str | os.PathLike | TraceWriter, label: str | None = None,
                 task_kwargs: Mapping[str, Any] | None = None):
        if isinstance(trace, TraceWriter):
            writer, owned = trace, False
        elif isinstance(trace, (str, os.PathLike)):
            writer, owned = TraceWriter(trace), True
        else:
            raise TypeError(f"trace must be a path or a TraceWriter, got {type(trace).__name__}")
        if label is not None and not isinstance(label, str):
            raise TypeError(f"trace_label must be a string, got {type(label).__name__}")
        super().__init__(env)
        self.writer, self.label, self.owns_writer = writer, label, owned
        self.task_settings = task_settings(env.task, dict(task_kwargs or {}))
        self.backend_ids = tuple(_identity(b) for b in env.backends)
        replays = [r for r in map(replay_backend, env.backends) if r is not None]
        self.replay_set = replays[0].set.identity if replays else None
        self.options = {k: v for k, v in asdict(env.config).items() if k not in ("num_agents", "max_rounds")}
        self.options["reward_weights"] = dict(self.options["reward_weights"])
        self.rounds: list[Round] = []
        """The rounds of the episode in progress."""
        self.probabilities: Mapping[str, tuple[float, ...]] = {}
        """The acting policy's probabilities for the step in progress (``PolicyActions``), by agent."""

    phased = True
    """Runners may drive it in phases (``deliberation_env.vector``): its ``end_reset``/``end_step`` record."""

    def reset(self, seed: int | None = None, options: Mapping[str, Any] | None = None):
        self.env.begin_episode(seed, options)
        answer_pending([self.env])
        return self.end_reset()

    def step(self, actions: Mapping[str, Any]):
        self.begin_step(actions)
        answer_pending([self.env])
        return self.end_step()

    def begin_step(self, actions: Mapping[str, Any]) -> None:
        self.probabilities = checked_probabilities(actions, self.env.deliberation.num_actions)
        self.env.begin_step(actions)

    def end_reset(self):
        result = self.env.end_reset()
        self.rounds = []
        self._record_round(None)
        return result

    def end_step(self):
        result = self.env.end_step()
        self._record_round(self.env.last_outcome)
        return result

    def render(self, mode: str | None = None) -> str | None:
        return self.env.render(mode)

    def close(self) -> None:
        self.env.close()
        if self.owns_writer:
            self.writer.close()

    def _record_round(self, outcome: Any) -> None:
        core = self.env.deliberation
        requests: list[list[RequestRecord]] = [[] for _ in core.agents]
        for agent, kind, prompt_tokens, completion_tokens in core.round_requests:
            requests[agent].append(RequestRecord(kind, prompt_tokens, completion_tokens))
        actions = self.env.last_actions if outcome is not None else [None] * len(core.agents)
        names = self.env.possible_agents
        probabilities = self.probabilities if outcome is not None else {}
        self.probabilities = {}
        agents = tuple(
            AgentRound(None if action is None else action.name, tuple(requests[i]), state.text, state.answer,
                       bool(state.correct), float(state.confidence), state.confidence_source,
                       probabilities.get(names[i]))
            for i, (state, action) in enumerate(zip(core.agents, actions))
        )
        consensus = core.consensus()
        self.rounds.append(Round(
            index=core.round, agents=agents, consensus=consensus, consensus_correct=bool(core.grade(consensus)),
            rewards=None if outcome is None else tuple(float(r) for r in outcome.rewards),
            reward_components=None if outcome is None else tuple(
                {k: float(v) for k, v in c.items()} for c in outcome.components),
        ))
        if outcome is not None and outcome.done:
            problem = core.problem
            self.writer.write(Episode(
                task=self.env.task.name, task_settings=self.task_settings, split=self.env.split,
                problem_id=problem.id, difficulty=problem.difficulty, seed=core.seed, label=self.label,
                num_agents=core.config.num_agents, max_rounds=core.config.max_rounds,
                backends=self.backend_ids, options=self.options, rounds=tuple(self.rounds),
                replay_set=self.replay_set,
            ))
            self.rounds = []


def checked_probabilities(actions: Mapping[str, Any], width: int) -> dict[str, tuple[float, ...]]:
    """The probabilities a ``PolicyActions`` carries (empty for a plain dict), checked: one per action index,
    each in [0, 1], summing to 1."""
    given = getattr(actions, "probabilities", None)
    if given is None:
        return {}
    for agent, row in given.items():
        if len(row) != width or not all(math.isfinite(p) and 0.0 <= p <= 1.0 for p in row) or \
                abs(sum(row) - 1.0) > 1e-4:
            raise ValueError(f"the probabilities of {agent}'s action must be {width} numbers in [0, 1] (one per action "
                             f"index) summing to 1, got {list(row)}")
    return dict(given)


def _identity(backend: Any) -> str:
    identity = getattr(backend, "identity", None)
    return str(identity()) if callable(identity) else repr(backend)


# ---------------------------------------------------------------------------------------- reading
def read_traces(path: str | os.PathLike) -> list[Episode]:
    """Every episode of a trace file, in order; raises ``TraceError`` (file, line, problem) on a bad line.

    Blank lines are allowed; nothing else is skipped.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise TraceError(f"{path}: no such trace file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise TraceError(f"{path}: cannot read the trace file: {error}") from None
    episodes = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            episodes.append(episode_from_dict(json.loads(line)))
        except json.JSONDecodeError as error:
            raise TraceError(f"{path}:{number}: not a JSON line ({error.msg} at column {error.colno})") from None
        except _Malformed as error:
            raise TraceError(f"{path}:{number}: {error}") from None
    return episodes


class _Malformed(Exception):
    pass


def _get(record: Any, key: str, kinds: tuple[type, ...], where: str, optional: bool = False) -> Any:
    if not isinstance(record, dict):
        raise _Malformed(f"{where or 'the line'} must be a JSON object, got {type(record).__name__}")
    if key not in record:
        raise _Malformed(f"missing field {where + '.' if where else ''}{key}")
    value = record[key]
    if value is None and optional:
        return None
    numeric = float in kinds and isinstance(value, int) and not isinstance(value, bool)
    if isinstance(value, bool) and bool not in kinds or not (isinstance(value, kinds) or numeric):
        names = " or ".join(k.__name__ for k in kinds) + (" or null" if optional else "")
        raise _Malformed(f"field {where + '.' if where else ''}{key} must be {names}, got {value!r:.60}")
    if isinstance(value, float) and not math.isfinite(value):
        raise _Malformed(f"field {where + '.' if where else ''}{key} must be finite, got {value!r}")
    return float(value) if numeric else value


def episode_from_dict(record: Any) -> Episode:
    """An ``Episode`` from one decoded JSON line (raises on anything malformed)."""
    version = _get(record, "version", (int,), "")
    if version != TRACE_VERSION:
        raise _Malformed(f"trace format version {version} is not supported (this reader reads version {TRACE_VERSION})")
    num_agents = _get(record, "num_agents", (int,), "")
    if num_agents < 1:
        raise _Malformed(f"num_agents must be >= 1, got {num_agents}")
    backends = _get(record, "backends", (list,), "")
    if len(backends) != num_agents or not all(isinstance(b, str) for b in backends):
        raise _Malformed(f"backends must list one identity string per agent ({num_agents})")
    raw_rounds = _get(record, "rounds", (list,), "")
    if not raw_rounds:
        raise _Malformed("rounds is empty: an episode has at least its solve round")
    rounds = tuple(_round(r, i, num_agents) for i, r in enumerate(raw_rounds))
    return Episode(
        task=_get(record, "task", (str,), ""), task_settings=_get(record, "task_settings", (dict,), ""),
        split=_get(record, "split", (str,), ""), problem_id=_get(record, "problem_id", (str,), ""),
        difficulty=_get(record, "difficulty", (float,), "", optional=True), seed=_get(record, "seed", (int,), ""),
        label=_get(record, "label", (str,), "", optional=True), num_agents=num_agents,
        max_rounds=_get(record, "max_rounds", (int,), ""), backends=tuple(backends),
        options=_get(record, "options", (dict,), ""), rounds=rounds,
        version=version, extra=_get(record, "extra", (dict,), "") if "extra" in record else {},
        replay_set=_get(record, "replay_set", (str,), "", optional=True) if "replay_set" in record else None,
    )


def _round(record: Any, position: int, num_agents: int) -> Round:
    where = f"rounds[{position}]"
    index = _get(record, "index", (int,), where)
    if index != position:
        raise _Malformed(f"{where}.index is {index}; rounds must be numbered 0, 1, 2, ... in order")
    raw_agents = _get(record, "agents", (list,), where)
    if len(raw_agents) != num_agents:
        raise _Malformed(f"{where}.agents has {len(raw_agents)} entries, expected num_agents = {num_agents}")
    agents = tuple(_agent(a, f"{where}.agents[{i}]", position) for i, a in enumerate(raw_agents))
    rewards = _get(record, "rewards", (list,), where, optional=True)
    components = _get(record, "reward_components", (list,), where, optional=True)
    if position > 0 and (rewards is None or components is None):
        raise _Malformed(f"{where} needs rewards and reward_components (only round 0 has none)")
    for name, values, kind in (("rewards", rewards, (int, float)), ("reward_components", components, (dict,))):
        if values is not None and (len(values) != num_agents or not all(
                isinstance(v, kind) and not isinstance(v, bool) for v in values)):
            raise _Malformed(f"{where}.{name} must have one entry per agent ({num_agents})")
    return Round(
        index=index, agents=agents, consensus=_get(record, "consensus", (str,), where, optional=True),
        consensus_correct=_get(record, "consensus_correct", (bool,), where),
        rewards=None if rewards is None else tuple(float(r) for r in rewards),
        reward_components=None if components is None else tuple(
            {k: _get(c, k, (float,), f"{where}.reward_components") for k in c} for c in components),
    )


def _agent(record: Any, where: str, round_index: int) -> AgentRound:
    action = _get(record, "action", (str,), where, optional=True)
    if round_index == 0 and action is not None or round_index > 0 and action not in ACTIONS:
        expected = "null in round 0" if round_index == 0 else f"one of {ACTIONS}"
        raise _Malformed(f"{where}.action must be {expected}, got {action!r}")
    requests = []
    for j, raw in enumerate(_get(record, "requests", (list,), where)):
        at = f"{where}.requests[{j}]"
        kind = _get(raw, "kind", (str,), at)
        if kind not in request_kinds():
            raise _Malformed(f"{at}.kind must be one of {request_kinds()}, got {kind!r}")
        counts = [_get(raw, name, (int,), at) for name in ("prompt_tokens", "completion_tokens")]
        if min(counts) < 0:
            raise _Malformed(f"{at} has a negative token count")
        requests.append(RequestRecord(kind, *counts))
    confidence = _get(record, "confidence", (float,), where)
    if not 0.0 <= confidence <= 1.0:
        raise _Malformed(f"{where}.confidence must be in [0, 1], got {confidence}")
    probabilities = _get(record, "probabilities", (list,), where, optional=True) if "probabilities" in record else None
    if probabilities is not None and (action is None or not all(
            isinstance(p, (int, float)) and not isinstance(p, bool) and 0.0 <= p <= 1.0 for p in probabilities)):
        raise _Malformed(f"{where}.probabilities must be null, or numbers in [0, 1] with an action")
    return AgentRound(
        action=action, requests=tuple(requests), text=_get(record, "text", (str,), where),
        answer=_get(record, "answer", (str,), where, optional=True), correct=_get(record, "correct", (bool,), where),
        confidence=confidence, confidence_source=_get(record, "confidence_source", (str,), where),
        probabilities=None if probabilities is None else tuple(float(p) for p in probabilities),
    )
