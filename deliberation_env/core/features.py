"""Agent states -> fixed-length float vectors: the observation contract.

Every agent is described by one row of ``NUM_FEATURES`` floats, all in [0, 1]:

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
"""

from __future__ import annotations

import re

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
PROFILE_OFFSET = 4
ACTION_OFFSET = PROFILE_OFFSET + len(PROFILE_FEATURES)

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
