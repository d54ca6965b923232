"""Episode traces (``deliberation_env.analysis.traces``) grouped for the view: per policy label, per problem.

``python -m baselines.meta.evaluate --trace FILE.jsonl`` writes one line per episode, labelled with the entry's
name (a protocol, a trained policy), so one file holds several policies on the same problems: the view shows them
side by side, and marks each policy's first-round joint action on a replay set's grid.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from deliberation_env.analysis.traces import ACTIONS, Episode, read_traces

ProblemKey = tuple[str, str]
"""(split, problem id)."""


@dataclass
class Policy:
    """One label's episodes, by problem."""

    label: str
    episodes: dict[ProblemKey, list[Episode]] = field(default_factory=dict)

    def right(self, key: ProblemKey) -> float | None:
        """The share of its episodes on a problem whose final consensus is right (None: it did not play it)."""
        played = self.episodes.get(key)
        return None if not played else sum(e.rounds[-1].consensus_correct for e in played) / len(played)

    def joints(self, key: ProblemKey) -> list[tuple[int, ...]]:
        """The distinct joint actions of its first deliberation round on a problem (as action indices: a CONCEDE
        to a named peer reads as CONCEDE, the index a trace can name)."""
        found: list[tuple[int, ...]] = []
        for episode in self.episodes.get(key, []):
            joint = first_joint(episode)
            if joint is not None and joint not in found:
                found.append(joint)
        return found


    def plays(self, key: ProblemKey, references: Mapping[str, Sequence[tuple[int, ...]]]) -> list[str]:
        """How its first-round joint actions on a problem compare with those of ``references`` (a protocol's tag:
        its joint actions there): ``=TAG`` where it played one of them, ``!TAG`` where it played another, and
        ``!all`` where it played one that no reference played; empty where it did not play the problem."""
        joints = self.joints(key)
        if not joints:
            return []
        found = []
        for tag, theirs in references.items():
            found += [f"={tag}"] if any(joint in theirs for joint in joints) else []
            found += [f"!{tag}"] if any(joint not in theirs for joint in joints) else []
        if any(all(joint not in theirs for theirs in references.values()) for joint in joints):
            found.append("!all")
        return found


def plays_options(tags: Mapping[str, str]) -> list[tuple[str, str]]:
    """The options of a "plays" filter over ``Policy.plays``'s values (``tags``: a reference's tag and name)."""
    options = []
    for tag, name in tags.items():
        options += [(f"={tag}", f"as {tag} ({name})"), (f"!{tag}", f"unlike {tag} ({name})")]
    return [*options, ("!all", "unlike every one of them")]


def first_joint(episode: Episode) -> tuple[int, ...] | None:
    """The first round's actions as indices into ``ACTIONS`` (None for an episode that ended at round 0)."""
    if len(episode.rounds) < 2:
        return None
    return tuple(ACTIONS.index(agent.action) for agent in episode.rounds[1].agents if agent.action is not None)


def load_policies(paths: Sequence[str | os.PathLike], labels: Sequence[str] | None = None) -> list[Policy]:
    """The labels of the trace files (default: every one, in order of first appearance; an unlabelled episode takes
    its file's name); ``labels`` picks some, in that order."""
    policies: dict[str, Policy] = {}
    for path in paths:
        for episode in read_traces(path):
            label = episode.label or Path(path).stem
            if labels is None or label in labels:
                policy = policies.setdefault(label, Policy(label))
                policy.episodes.setdefault((episode.split, episode.problem_id), []).append(episode)
    if labels is None:
        return list(policies.values())
    missing = [label for label in labels if label not in policies]
    if missing:
        found = sorted({e.label or Path(path).stem for path in paths for e in read_traces(path)})
        raise ValueError(f"--labels: the trace files hold no label {missing[0]!r}; they hold {found}")
    return [policies[label] for label in labels]


def problem_keys(policies: Sequence[Policy]) -> list[ProblemKey]:
    """Every problem some policy played, in order of first appearance."""
    keys: dict[ProblemKey, None] = {}
    for policy in policies:
        keys.update(dict.fromkeys(policy.episodes))
    return list(keys)
