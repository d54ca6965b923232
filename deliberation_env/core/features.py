"""Agent states -> fixed-length float vectors: the observation contract, and the feature sets that declare it.

Every agent is described by one row of floats, all in [0, 1]. The env option ``features`` picks the feature set, a
``FeatureSet`` registered in ``FEATURE_SETS``: its own columns (appended to those of the set it extends), the function
that fills them, its version and what it needs from the core (token log-probabilities, the team's roles). Each built-in
set (``BUILT_IN_FEATURE_SETS``: ``v1``, ``v2``, ``v3``) begins with the columns of the one before;
``feature_set_table()`` writes the table of the registered sets (width, the set extended, what it adds, what it needs)
from their declarations, and docs/reference.md shows the built-in ones' (``scripts/docs_tables.py`` writes it there). A
new feature set is one ``FeatureSet`` and one ``register_feature_set`` call, in its own module or in the user's code
(docs/reference.md, "Adding a feature set").

v1's columns (``FEATURES``):

| index | name              | meaning                                                             |
|-------|-------------------|---------------------------------------------------------------------|
| 0     | has_answer        | 1 if the agent currently holds a parsed answer (decision schema)    |
| 1     | support           | fraction of all agents holding the same answer (decision schema)    |
| 2     | in_consensus      | 1 if its answer is the team's plurality answer (decision schema)    |
| 3     | confidence        | introspective confidence from the critic call                       |
| 4-10  | profile_*         | reasoning profile, see ``PROFILE_FEATURES``                          |
| 11-14 | last_*            | one-hot: none (round 0), PERSIST, REFINE, CONCEDE                    |
| 15    | round             | rounds played / max_rounds                                          |

The reasoning profile (``z_prof``) is read off the agent's latest text:

| profile | name      | meaning                                              |
|---------|-----------|------------------------------------------------------|
| 0       | steps     | non-empty lines / 10, capped at 1                    |
| 1       | length    | completion tokens / max_tokens, capped at 1          |
| 2       | equations | '=' signs / 10, capped at 1                          |
| 3       | checked   | 1 if it says it checked or verified its work         |
| 4       | hedged    | 1 if it hedges ("not sure", "maybe", "I think", ...) |
| 5       | revisions | times this agent has refined / max_rounds            |
| 6       | changed   | 1 if its answer changed at its latest update         |

``features="v2"`` appends these (``SIGNAL_FEATURES``; the completion is the latest solution or refinement the agent
holds; a CONCEDE takes its target's). The core then asks the backend for every generated token's log-probability.

| index | name                | meaning                                                           | neutral |
|-------|---------------------|-------------------------------------------------------------------|---------|
| 16    | logprobs            | 1 if the completion came with token log-probabilities             | 0       |
| 17    | answer_prob         | P(the answer's tokens) = exp(sum of their log-probabilities), as  | 0.5     |
|       |                     | ``confidence="answer_logprobs"`` computes it                      |         |
| 18    | stopped             | 1 if the completion ended by itself, 0 if cut at max_tokens       | 1       |
| 19    | answer_repeats      | times the answer string occurs in the text / 5, capped at 1       | 0       |
| 20    | equations_valid     | share of the text's ``a op b = c`` equations that hold            | 0.5     |
| 21    | code                | 1 if the text holds a code block (three backticks)                | 0       |
| 22    | target_in_consensus | 1 if its concede target holds the team's plurality answer         | 0       |
|       |                     | (0 when CONCEDE is masked)                                        |         |

"The answer" is the one the agent gives: a program-aided agent's (``tool="python"``) is what its program printed
where it printed one (``core.tools``), so its ``answer_prob`` and ``answer_repeats`` read that answer in its text
(``FEATURE_FORMAT`` 2; format 1 read the text's own answer).

``features="v3"`` appends the agent's role (``core.roles``) and its tool's verdict to v2's 23 columns, 29 in all:

| index | name        | meaning                                                                             |
|-------|-------------|-------------------------------------------------------------------------------------|
| 23-26 | role_*      | one-hot: the agent's role, numbered by first appearance in ``roles`` (a homogeneous |
|       |             | team: role_0 for every agent)                                                       |
| 27    | tool_ran    | 1 if its role's tool read an answer off its latest solution (``core.tools``: the    |
|       |             | program ran and printed one); 0 without a tool                                      |
| 28    | tool_agrees | 1 if that answer equals the one its text states: an external check of the text      |

The neutral value is a column's value without what it reads: ``answer_prob`` from a backend that gives no
token log-probabilities (then ``logprobs`` is 0), ``stopped`` from one that names no finish reason,
``equations_valid`` for a text without checkable equations, the others without an answer, a code block or a
concede target. v2 holds the signals that separate right answers from wrong ones beyond v1 on a real model's
replay set (``bench/benchmark/replay_benchmark.py`` measures each); the raw values, among them the mean and lowest
token log-probabilities (no signal there), stay in ``AgentState.signals``.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from deliberation_env.core.confidence import answer_logprob, well_formed_logprobs
from deliberation_env.core.consensus import support
from deliberation_env.core.roles import MAX_ROLES
from deliberation_env.requests import Completion

PROFILE_FEATURES = ("steps", "length", "equations", "checked", "hedged", "revisions", "changed")
FEATURES = (
    "has_answer",
    "support",
    "in_consensus",
    "confidence",
    *(f"profile_{name}" for name in PROFILE_FEATURES),
    "last_none",
    "last_persist",
    "last_refine",
    "last_concede",
    "round",
)
NUM_FEATURES = len(FEATURES)
"""The width of a v1 row (the default feature set)."""
PROFILE_OFFSET = 4
ACTION_OFFSET = PROFILE_OFFSET + len(PROFILE_FEATURES)
SIGNAL_FEATURES = ("logprobs", "answer_prob", "stopped", "answer_repeats", "equations_valid", "code",
                   "target_in_consensus")
"""v2's columns after v1's (see the table above)."""
ROLE_FEATURES = (*(f"role_{k}" for k in range(MAX_ROLES)), "tool_ran", "tool_agrees")
"""v3's columns after v2's (see the table above)."""
FEATURE_FORMAT = 2
"""The version of the built-in sets' computation (the highest ``FeatureSet.version`` among them): what a policy
checkpoint records, so that what was fitted or compiled on older observations can tell. 1: the first sets; 2: a
program-aided agent's ``answer_prob`` and ``answer_repeats`` (and its ``answer_logprobs`` confidence) read the answer
its program printed, not its text's."""
SIGNAL_OFFSET = NUM_FEATURES
ROLE_OFFSET = SIGNAL_OFFSET + len(SIGNAL_FEATURES)
TOOL_OFFSET = ROLE_OFFSET + MAX_ROLES
NEUTRAL = 0.5
"""``answer_prob`` without token log-probabilities, ``equations_valid`` without equations to check."""
REPEATS_SCALE = 5.0
STOP_LENGTH = "length"
"""The finish reason of a completion cut at max_tokens (OpenAI's name; the local backends use it too)."""

_CHECKED = re.compile(r"(?i)\b(?:double-check|check|checking|verify|verified|verifying|confirm)")
_HEDGED = re.compile(r"(?i)\b(?:not sure|unsure|maybe|perhaps|might be|i think|i guess|probably)\b")


def text_profile(text: str) -> tuple[float, float, float, float]:
    """The part of the profile read off the text alone: steps, equations, checked, hedged."""
    lines = sum(1 for line in text.splitlines() if line.strip())
    return (
        min(lines / 10.0, 1.0),
        min(text.count("=") / 10.0, 1.0),
        1.0 if _CHECKED.search(text) else 0.0,
        1.0 if _HEDGED.search(text) else 0.0,
    )


class AgentView(Protocol):
    """What a feature set reads of one agent (``core.deliberation.AgentState``)."""

    @property
    def answer(self) -> str | None: ...

    @property
    def confidence(self) -> float: ...

    @property
    def profile(self) -> tuple[float, ...]: ...

    @property
    def last_action(self) -> int | None: ...

    @property
    def signals(self) -> CompletionSignals: ...

    @property
    def tool_ran(self) -> bool: ...

    @property
    def tool_agrees(self) -> bool: ...


class TeamView(Protocol):
    """What a feature set reads of the team (``core.deliberation.Deliberation``): the agents now, the round, the
    config, the derived consensus and concede targets, and each agent's role index (None unless the set needs roles)."""

    @property
    def agents(self) -> Sequence[AgentView]: ...

    @property
    def round(self) -> int: ...

    @property
    def max_rounds(self) -> int: ...

    @property
    def role_of(self) -> Sequence[int] | None: ...

    def consensus(self) -> str | None: ...

    def concede_target(self, agent: int) -> int | None: ...


Fill = Callable[[TeamView, np.ndarray], None]
"""Fills a feature set's own columns: ``fill(team, rows)`` writes ``rows``, a zeroed float32 (N, own columns) view,
one row per agent, every value in [0, 1]."""


@dataclass(frozen=True)
class FeatureSet:
    """One feature set: its own columns (after those of the set it ``extends``), the function that fills them, the
    version of that computation and what it needs from the core. Register it with ``register_feature_set``."""

    name: str
    columns: tuple[str, ...]
    """Its own column names, in order, appended to the columns of ``extends``."""
    fill: Fill
    extends: str | None = None
    """The registered set whose columns come first (None: these are all its columns)."""
    version: int = 1
    """Bump when the computation of its columns changes (``FEATURE_FORMAT`` is the built-in sets' highest)."""
    logprobs: bool = False
    """Needs the log-probability of every generated token: solutions and refinements ask for them, and the core keeps
    each agent's ``CompletionSignals`` (``AgentView.signals``)."""
    roles: bool = False
    """Reads each agent's role index (``TeamView.role_of``; the core checks the roles against ``MAX_ROLES``)."""
    summary: str = ""
    """What its columns add, in a few words (``feature_set_table``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a feature set's name must be a non-empty str, got {self.name!r}")
        columns = tuple(self.columns)
        if not columns or not all(isinstance(c, str) and c for c in columns) or len(set(columns)) != len(columns):
            raise ValueError(f"feature set {self.name!r}: columns must be distinct non-empty strs, got {self.columns!r}")
        object.__setattr__(self, "columns", columns)
        if not callable(self.fill):
            raise TypeError(f"feature set {self.name!r}: fill must be a callable (team, rows) -> None")
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 1:
            raise ValueError(f"feature set {self.name!r}: version must be an int >= 1, got {self.version!r}")


FEATURE_SETS: dict[str, FeatureSet] = {}
"""Feature set name -> its declaration (``register_feature_set`` adds one)."""


def register_feature_set(feature_set: FeatureSet, *, overwrite: bool = False) -> FeatureSet:
    """Make ``feature_set`` a value of the env option ``features``; returns it."""
    if feature_set.name in FEATURE_SETS and not overwrite:
        raise ValueError(f"feature set {feature_set.name!r} is already registered; pass overwrite=True to replace it")
    if feature_set.extends is not None:
        inherited = feature_names(feature_set.extends)
        clash = sorted(set(inherited) & set(feature_set.columns))
        if clash:
            raise ValueError(f"feature set {feature_set.name!r} repeats columns of {feature_set.extends!r}: {clash}")
    FEATURE_SETS[feature_set.name] = feature_set
    return feature_set


def lineage(feature_set: str = "v1") -> tuple[FeatureSet, ...]:
    """The declarations whose columns make up a feature set's row, in column order (the root first); ValueError for
    an unknown name."""
    chain: list[FeatureSet] = []
    name: str | None = feature_set
    while name is not None:
        try:
            declaration = FEATURE_SETS[name]
        except (KeyError, TypeError):
            raise ValueError(f"features must be one of {tuple(FEATURE_SETS)}, got {feature_set!r}") from None
        chain.append(declaration)
        name = declaration.extends
    return tuple(reversed(chain))


def feature_names(feature_set: str = "v1") -> tuple[str, ...]:
    """The column names of a feature set (``FEATURE_SETS``); ValueError for an unknown one."""
    return tuple(column for declaration in lineage(feature_set) for column in declaration.columns)


def num_features(feature_set: str = "v1") -> int:
    """The width F of one agent's row under a feature set."""
    return len(feature_names(feature_set))


def feature_set_table(names: Sequence[str] | None = None) -> str:
    """The markdown table of feature sets (name, width, the set it extends, what it adds, what it needs), written from
    their declarations: the docstrings and docs show it (``names``: these sets; default: every registered one)."""
    rows = [("features", "F", "extends", "adds", "needs")]
    for name in FEATURE_SETS if names is None else names:
        declaration = FEATURE_SETS[name]
        needs = [need for need, flag in (("logprobs", declaration.logprobs), ("roles", declaration.roles)) if flag]
        rows.append((f"``{name}``", str(num_features(name)),
                     "" if declaration.extends is None else f"``{declaration.extends}``", declaration.summary,
                     ", ".join(needs)))
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    lines = ["| " + " | ".join(cell.ljust(width) for cell, width in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (width + 2) for width in widths) + "|")
    return "\n".join(lines)


@dataclass(frozen=True)
class CompletionSignals:
    """What an agent's latest completion says of itself, beyond its text profile (the raw v2 signals)."""

    logprobs: bool = False
    """Whether the completion came with token log-probabilities (else the three below are None)."""
    answer_logprob: float | None = None
    """Sum of the log-probabilities of the answer's tokens (its last occurrence), as ``answer_logprobs``
    confidence reads them; the mean token log-probability where the answer is not spelled out."""
    mean_logprob: float | None = None
    min_logprob: float | None = None
    completion_tokens: int = 0
    stopped: bool = True
    """False when the completion was cut at max_tokens."""
    answer_repeats: int = 0
    equations_right: int = 0
    equations_wrong: int = 0
    code: bool = False

    def row(self) -> tuple[float, ...]:
        """The completion's v2 columns (``SIGNAL_FEATURES`` but the last, which needs the team), each in [0, 1]."""
        checked = self.equations_right + self.equations_wrong
        answer = math.exp(min(self.answer_logprob or 0.0, 0.0)) if self.logprobs else NEUTRAL
        return (float(self.logprobs), answer, float(self.stopped), min(self.answer_repeats / REPEATS_SCALE, 1.0),
                self.equations_right / checked if checked else NEUTRAL, float(self.code))


NO_SIGNALS = CompletionSignals()
"""The signals of an agent that has no completion yet (every column at its neutral value)."""


_SIGNALS: dict[int, tuple[Completion, str | None, CompletionSignals]] = {}
"""``completion_signals`` of recent completions, by the completion object's id (kept alive beside its result, so the
id is not reused): replayed completions are the same objects episode after episode, and reading their token
log-probabilities is the cost."""
_SIGNALS_KEPT = 16_384


def completion_signals(completion: Completion, answer: str | None) -> CompletionSignals:
    """The raw v2 signals of a solution or refinement whose parsed answer is ``answer``."""
    kept = _SIGNALS.get(id(completion))
    if kept is not None and kept[0] is completion and kept[1] == answer:
        return kept[2]
    if len(_SIGNALS) >= _SIGNALS_KEPT:
        _SIGNALS.clear()
    signals = _completion_signals(completion, answer)
    _SIGNALS[id(completion)] = (completion, answer, signals)
    return signals


def _completion_signals(completion: Completion, answer: str | None) -> CompletionSignals:
    repeats, right, wrong, code = _text_signals(completion.text, answer)
    text = CompletionSignals(completion_tokens=completion.completion_tokens,
                             stopped=completion.finish_reason != STOP_LENGTH, answer_repeats=repeats,
                             equations_right=right, equations_wrong=wrong, code=code)
    pieces = well_formed_logprobs(completion.token_logprobs)
    if not pieces:
        return text
    values = [value for _, value in pieces]
    mean = sum(values) / len(values)
    spelled = answer_logprob(pieces, answer)
    return replace(text, logprobs=True, answer_logprob=mean if spelled is None else spelled, mean_logprob=mean,
                   min_logprob=min(values))


_NUMBER = r"-?\d+(?:\.\d+)?"
_OPERATOR = r"(?:[-+*/×÷]|\\times|\\cdot|\\div)"
_EQUATION = re.compile(rf"(?<![\d.])((?:{_NUMBER}\s*{_OPERATOR}\s*)+{_NUMBER})\s*=\s*({_NUMBER})(?![\d.])")
_TERM = re.compile(rf"({_NUMBER})\s*({_OPERATOR})?\s*")
_MULTIPLY = {"*", "×", r"\times", r"\cdot"}
_DIVIDE = {"/", "÷", r"\div"}
_TOLERANCE = 1e-6


@functools.lru_cache(maxsize=8192)
def _text_signals(text: str, answer: str | None) -> tuple[int, int, int, bool]:
    """(answer occurrences, equations that hold, equations that do not, has a code block) of a text."""
    right = wrong = 0
    for expression, result in _EQUATION.findall(text):
        value = evaluate(expression)
        if value is None:
            continue
        if math.isclose(value, float(result), rel_tol=_TOLERANCE, abs_tol=_TOLERANCE):
            right += 1
        else:
            wrong += 1
    return (text.count(answer) if answer else 0), right, wrong, "```" in text


def evaluate(expression: str) -> float | None:
    """The value of ``a op b op c ...`` (+ - * / with the usual precedence), None on division by zero."""
    terms: list[float] = []
    pending = "+"
    for number, operator in _TERM.findall(expression):
        value = float(number)
        if pending in _MULTIPLY:
            terms[-1] *= value
        elif pending in _DIVIDE:
            if value == 0:
                return None
            terms[-1] /= value
        else:
            terms.append(-value if pending == "-" else value)
        pending = operator
    return sum(terms)


_LAST_ACTION = {None: (1.0, 0.0, 0.0, 0.0), 0: (0.0, 1.0, 0.0, 0.0), 1: (0.0, 0.0, 1.0, 0.0), 2: (0.0, 0.0, 0.0, 1.0)}
"""The one-hot ``last_*`` columns of each last action (none in round 0; PERSIST, REFINE, CONCEDE)."""
_ROLE = [tuple(float(k == role) for k in range(MAX_ROLES)) for role in range(MAX_ROLES)]
"""The one-hot ``role_*`` columns of each role index."""


# Each fill builds its rows in Python and writes the block in one assignment: several times faster than writing
# cell by cell (feature_matrix runs at every reset and step).
def _fill_v1(team: TeamView, rows: np.ndarray) -> None:
    consensus = team.consensus()
    agents = team.agents
    supports = support([agent.answer for agent in agents])
    progress = team.round / team.max_rounds
    rows[:] = [(agent.answer is not None, supports[i], agent.answer is not None and agent.answer == consensus,
                agent.confidence, *agent.profile, *_LAST_ACTION[agent.last_action], progress)
               for i, agent in enumerate(agents)]


def _fill_signals(team: TeamView, rows: np.ndarray) -> None:
    consensus = team.consensus()
    agents = team.agents
    targets = [team.concede_target(i) for i in range(len(agents))]
    rows[:] = [(*agent.signals.row(), target is not None and agents[target].answer == consensus)
               for agent, target in zip(agents, targets)]


def _fill_roles(team: TeamView, rows: np.ndarray) -> None:
    roles = team.role_of
    assert roles is not None  # the core gives role indices to a set that needs roles
    rows[:] = [(*_ROLE[role], agent.tool_ran, agent.tool_agrees) for agent, role in zip(team.agents, roles)]


register_feature_set(FeatureSet("v1", FEATURES, _fill_v1, version=1,
                                summary="answer schema, critic confidence, reasoning profile, last action, round"))
register_feature_set(FeatureSet("v2", SIGNAL_FEATURES, _fill_signals, extends="v1", version=2, logprobs=True,
                                summary="signals of the latest completion and of the concede target"))
register_feature_set(FeatureSet("v3", ROLE_FEATURES, _fill_roles, extends="v2", version=2, roles=True,
                                summary="the agent's role and its tool's verdict"))
BUILT_IN_FEATURE_SETS = ("v1", "v2", "v3")
