"""The team's answer: a plurality vote with deterministic tie-breaks, and leave-one-out."""

from __future__ import annotations

from collections.abc import Sequence


def plurality(answers: Sequence[str | None], confidences: Sequence[float], exclude: int | None = None) -> str | None:
    """The plurality answer among agents (``None`` answers do not vote).

    Ties are broken by the summed confidence of the tied answers' holders, then by the
    smallest answer string, so the result never depends on agent order or randomness.
    ``exclude`` leaves one agent out (the leave-one-out consensus). Returns None when no
    agent holds an answer.
    """
    votes: dict[str, list[float]] = {}
    for index, answer in enumerate(answers):
        if answer is None or index == exclude:
            continue
        tally = votes.setdefault(answer, [0.0, 0.0])
        tally[0] += 1.0
        tally[1] += confidences[index]
    if not votes:
        return None
    return min(votes, key=lambda answer: (-votes[answer][0], -votes[answer][1], answer))


def support(answers: Sequence[str | None]) -> list[float]:
    """For each agent, the fraction of all agents (itself included) holding its answer."""
    count = len(answers)
    return [0.0 if answer is None else answers.count(answer) / count for answer in answers]
