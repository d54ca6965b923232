"""Agent states -> fixed-length float vectors: the observation contract.

Every agent is described by one row of floats, all in [0, 1]. The env option ``features`` picks the
feature set (``FEATURE_SETS``): ``"v1"`` (the default, ``NUM_FEATURES`` = 16 columns), ``"v2"`` (v1's
16 columns, then ``SIGNAL_FEATURES``: 7 read off the agent's latest completion and its concede target,
23 in all) or ``"v3"`` (v2, then the agent's role and tool: 29). Each set begins with the columns of the one before.

| index | name              | meaning                                                             |
|-------|-------------------|---------------------------------------------------------------------|
| 0     | has_answer        | 1 if the agent currently holds a parsed answer (decision schema)    |
| 1     | support           | fraction of all agents holding the same answer (decision schema)    |
| 2     | in_consensus      | 1 if its answer is the team's plurality answer (decision schema)    |
| 3     | confidence        | introspective confidence from the critic call                       |
| 4-10  | profile           | reasoning profile, see ``PROFILE_FEATURES``                          |
| 11-14 | last_action       | one-hot: none (round 0), PERSIST, REFINE, CONCEDE                    |
| 15    | round             | rounds played / max_rounds                                          |

The reasoning profile (``z_prof``) is read off the agent's latest text:

| index | name            | meaning                                                      |
|-------|-----------------|--------------------------------------------------------------|
| 0     | steps           | non-empty lines / 10, capped at 1                            |
| 1     | length          | completion tokens / max_tokens, capped at 1                  |
| 2     | equations       | '=' signs / 10, capped at 1                                  |
| 3     | checked         | 1 if it says it checked or verified its work                 |
| 4     | hedged          | 1 if it hedges ("not sure", "maybe", "I think", ...)         |
| 5     | revisions       | times this agent has refined / max_rounds                    |
| 6     | changed         | 1 if its answer changed at its latest update                 |

``features="v2"`` appends these (the completion is the latest solution or refinement the agent holds; a
CONCEDE takes its target's). The core then asks the backend for every generated token's log-probability.

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
| 23-26 | role        | one-hot: the agent's role, numbered by first appearance in ``roles`` (a homogeneous |
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
from dataclasses import dataclass, replace

from deliberation_env.backends.base import Completion
from deliberation_env.core.confidence import answer_logprob, well_formed_logprobs
from deliberation_env.core.roles import MAX_ROLES

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
FEATURE_SETS: dict[str, tuple[str, ...]] = {"v1": FEATURES, "v2": FEATURES + SIGNAL_FEATURES,
                                            "v3": FEATURES + SIGNAL_FEATURES + ROLE_FEATURES}
"""Feature set name -> its column names, in order."""
FEATURE_FORMAT = 2
"""The version of the columns' computation: bump when a column's computation changes, so that what was fitted or
compiled on older observations (a policy checkpoint records it) can tell. 1: the first sets; 2: a program-aided
agent's ``answer_prob`` and ``answer_repeats`` (and its ``answer_logprobs`` confidence) read the answer its program
printed, not its text's."""
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


def feature_names(feature_set: str = "v1") -> tuple[str, ...]:
    """The column names of a feature set (``FEATURE_SETS``); ValueError for an unknown one."""
    try:
        return FEATURE_SETS[feature_set]
    except (KeyError, TypeError):
        raise ValueError(f"features must be one of {tuple(FEATURE_SETS)}, got {feature_set!r}") from None


def num_features(feature_set: str = "v1") -> int:
    """The width F of one agent's row under a feature set."""
    return len(feature_names(feature_set))


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


def completion_signals(completion: Completion, answer: str | None) -> CompletionSignals:
    """The raw v2 signals of a solution or refinement whose parsed answer is ``answer``."""
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
