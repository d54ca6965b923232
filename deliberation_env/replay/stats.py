"""A replay set's figures as the env computes them: round-0 accuracy of the answers its agents give.

A recorded solve completion is not an agent's answer where the agent's role has a tool that answers (``core.tools``:
a program-aided agent's answer is what its program printed, where it printed one). So the card's accuracy is read off
the core itself, played on the records: round 0 of every recorded problem and stream, each agent's answer graded as the
env grades it (``Deliberation.grade``), per level and, for a team with roles, per role.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from deliberation_env.core.deliberation import Deliberation
from deliberation_env.replay.dataset import ReplayCard, ReplayError, completion_for, request_key
from deliberation_env.tasks.base import Task


def round0_accuracy(task: Task, card: ReplayCard, records: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``{"team": tally, "roles": {name: tally}}`` (``roles`` only for a team with roles), where a tally is
    ``{"correct", "answers", "accuracy", "by_level": {level: {"correct", "answers", "accuracy"}}}`` over every agent's
    round-0 answer on every recorded problem and stream of ``card``. ``records`` by ``request_key``; a ReplayError
    names a problem whose round 0 they lack."""
    config = card.config()
    core = Deliberation(task, config)
    roles = [role.name for role in config.roles] if config.roles is not None else None
    counts: dict[tuple[str | None, str], list[int]] = defaultdict(lambda: [0, 0])  # (role, level) -> right, answers
    for split, ids in card.splits.items():
        recorded = set(ids)
        for problem in (p for p in task.problems(split) if p.id in recorded):
            level = str(problem.metadata.get("level", "all"))
            for stream in range(card.streams):
                core.start(problem, stream)
                while requests := core.pending_requests():
                    found = [records.get(request_key(request)) for request in requests]
                    if any(record is None for record in found):
                        raise ReplayError(f"replay set {card.name!r} lacks a round-0 request of problem {problem.id!r} "
                                          f"(stream {stream}): record that problem again")
                    core.receive([completion_for(r, record) for r, record in zip(requests, found)])  # type: ignore[arg-type]
                for i, agent in enumerate(core.agents):
                    for role in (None, roles[i]) if roles else (None,):  # the team's tally, and the agent's role's
                        counts[role, level][0] += agent.correct
                        counts[role, level][1] += 1
    result: dict[str, Any] = {"team": _tally(counts, None)}
    if roles:
        result["roles"] = {name: _tally(counts, name) for name in dict.fromkeys(roles)}
    return result


def _tally(counts: Mapping[tuple[str | None, str], list[int]], role: str | None) -> dict[str, Any]:
    levels = {level: _row(*counts[role, level]) for level in sorted(level for who, level in counts if who == role)}
    return {**_row(sum(r["correct"] for r in levels.values()), sum(r["answers"] for r in levels.values())),
            "by_level": levels}


def _row(correct: int, answers: int) -> dict[str, Any]:
    return {"correct": correct, "answers": answers, "accuracy": round(correct / answers, 3) if answers else None}
