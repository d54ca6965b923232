"""Record a model's whole deliberation tree: every request reachable under any joint meta-action sequence.

The walk drives the core state machine itself (``core.Deliberation``): a *path* is a problem, a sample
stream, a confidence source and a prefix of joint actions. Each wave replays every open path from the
start against what is recorded so far; the requests that are missing, deduplicated by ``request_key``
across paths and problems, go to the backend in one call through the request grouper (``deliberation_env.grouping``;
the backend batches them). When
no path of a depth misses anything, every path is extended by each legal joint action (CONCEDE only
where the core offers a target; with ``all_targets``, one CONCEDE per peer that holds another answer, which
covers every concede-target rule), up to ``rounds`` rounds. Replaying a path from the start costs
dictionary lookups, not generations.

With 3 agents a state has up to 27 joint actions (64 with ``all_targets``), so round r holds up to 27^r paths. Past the first
round, ``branch_limit=K`` keeps K of each state's joint actions, drawn with a seeded generator (all-PERSIST
and all-REFINE always among them): a documented, bounded tree, marked ``partial`` in the set's card.

Nothing is lost on interruption: each backend answer is appended to ``chunks/<chunk>.partial.jsonl``
at once, and a finished chunk becomes ``chunks/<chunk>.parquet`` (then the card lists it and its problems).
A rerun skips finished chunks and reuses the partial file.
"""

from __future__ import annotations

import itertools
import json
import os
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from deliberation_env.backends.base import Backend
from deliberation_env.core.deliberation import Action, Deliberation, DeliberationConfig
from deliberation_env.core.seeds import mix_seed
from deliberation_env.grouping import generate_grouped
from deliberation_env.replay.dataset import ReplaySet, completion_for, record_of, request_key, rich_request
from deliberation_env.requests import Completion, Request
from deliberation_env.tasks.base import Problem, Task

Move = tuple[Action, int | None]
"""One agent's move: its meta-action and, for a CONCEDE, the peer it adopts (None: the config's rule picks)."""
Prefix = tuple[tuple[Move, ...], ...]


@dataclass(frozen=True)
class Walk:
    """One path of the tree: a problem, a stream, a confidence source and the joint actions played so far."""

    problem: Problem
    stream: int
    config: DeliberationConfig
    prefix: Prefix = ()


@dataclass
class TreeStats:
    """Unique requests per problem and per round (the tree's size), and paths per depth."""

    requests: Counter = field(default_factory=Counter)
    """(problem id, round) -> unique requests."""
    paths: Counter = field(default_factory=Counter)
    """depth -> number of paths (joint action prefixes over all problems, streams and sources)."""
    generated: int = 0


class TreeRecorder:
    """Walks the deliberation trees of problems and records every completion (see the module docstring)."""

    def __init__(self, task: Task, config: DeliberationConfig, backend: Backend | None, *, rounds: int,
                 confidence_sources: Sequence[str], records: dict[str, dict[str, Any]] | None = None,
                 branch_limit: int | None = None, all_targets: bool = False):
        if config.streams is None:
            raise ValueError("the recording config needs streams=S (the number of sample streams per problem)")
        self.task, self.rounds, self.branch_limit = task, rounds, branch_limit
        self.backends = [backend] * config.num_agents if backend is not None else None
        """Each agent's backend, as the request grouper takes them (one model answers the whole team)."""
        self.all_targets = all_targets
        """Branch on every peer a CONCEDE can adopt (a superset of every concede-target rule's tree)."""
        self.configs = [replace(config, confidence=source, max_rounds=rounds, early_stop=False)
                        for source in confidence_sources]
        self.records = {} if records is None else records

    # ------------------------------------------------------------------ the walk
    def record(self, problems: Sequence[Problem], split: str, on_generated: Callable[[list[dict]], None],
               on_wave: Callable[[int, int], None] | None = None) -> TreeStats:
        """Record the trees of ``problems`` (every stream and confidence source) into ``self.records``;
        ``on_generated`` gets each batch of new records as soon as the backend answers."""
        def fill(missing: list[tuple[Request, dict[str, Any]]]) -> bool:
            self._generate(missing, on_generated)
            return True

        return self._walk(problems, split, fill, on_wave)

    def missing(self, problems: Sequence[Problem], split: str) -> list[dict[str, Any]]:
        """Where the records lack a request of the trees of ``problems``: the places (problem, stream, round,
        split) of the first wave that lacks any, none when every path is recorded. Generates nothing."""
        found: list[dict[str, Any]] = []

        def stop(missing: list[tuple[Request, dict[str, Any]]]) -> bool:
            found.extend(place for _, place in missing)
            return False

        self._walk(problems, split, stop)
        return found

    def _walk(self, problems: Sequence[Problem], split: str,
              fill: Callable[[list[tuple[Request, dict[str, Any]]]], bool],
              on_wave: Callable[[int, int], None] | None = None) -> TreeStats:
        """Play every path of the trees, depth by depth; ``fill`` gets each wave's missing requests and says
        whether they are now recorded (False ends the walk)."""
        stats = TreeStats()
        streams = range(self.configs[0].streams or 1)
        paths = [Walk(p, s, c) for p in problems for s in streams for c in self.configs]
        used: dict[str, tuple[str, int]] = {}
        for depth in range(self.rounds + 1):
            stats.paths[depth] += len(paths)
            while True:
                missing: dict[str, tuple[Request, dict[str, Any]]] = {}
                ended: list[tuple[Walk, Deliberation]] = []
                waiting: list[tuple[Walk, Deliberation]] = []  # alive until answered: a sim asks them for context
                used = {}  # a pass of the last depth that misses nothing has played every request of the tree
                for path in paths:
                    core, gaps = self._play(path, used)
                    for request, place in gaps:
                        missing.setdefault(request_key(request), (request, {**place, "split": split}))
                    (waiting if gaps else ended).append((path, core))
                if not missing:
                    break
                if on_wave is not None:
                    on_wave(depth, len(missing))
                if not fill(list(missing.values())):
                    return stats
                stats.generated += len(missing)
            if depth == self.rounds:
                break
            paths = [replace(path, prefix=path.prefix + (joint,))
                     for path, core in ended if not core.done for joint in self._joint_actions(path, core)]
        stats.requests.update(used.values())
        return stats

    def _play(self, path: Walk, used: dict[str, tuple[str, int]]) -> tuple[Deliberation, list[tuple[Request, dict[str, Any]]]]:
        """Drive the core along ``path`` on recorded completions; the requests it still lacks, if any. Each
        answered request's key goes into ``used`` (first seen: its problem id and round)."""
        core = Deliberation(self.task, path.config)
        core.start(path.problem, path.stream)
        gaps = self._answer(core, path, used)
        for moves in path.prefix:
            if gaps:
                break
            _begin(core, moves)
            gaps = self._answer(core, path, used)
            if not gaps:
                core.finish_round()
        return core, gaps

    def _answer(self, core: Deliberation, path: Walk,
                used: dict[str, tuple[str, int]]) -> list[tuple[Request, dict[str, Any]]]:
        while requests := core.pending_requests():
            keys = [request_key(r) for r in requests]
            found = [self.records.get(key) for key in keys]
            if any(record is None for record in found):
                place = {"problem": path.problem.id, "stream": path.stream, "round": core.request_round}
                return [(r, place) for r, record in zip(requests, found) if record is None]
            for key in keys:
                used.setdefault(key, (path.problem.id, core.request_round))
            records = cast("list[dict[str, Any]]", found)  # none is None: checked above
            core.receive([completion_for(r, record) for r, record in zip(requests, records)])
        return []

    def _generate(self, missing: list[tuple[Request, dict[str, Any]]], on_generated) -> None:
        if self.backends is None:
            raise RuntimeError("this TreeRecorder has no backend: it can only look for missing records")
        rich = [rich_request(request) for request, _ in missing]
        completions: list[Completion] = generate_grouped(rich, self.backends)
        if len(completions) != len(rich):
            raise RuntimeError(f"the backend answered {len(completions)} of {len(rich)} requests")
        batch = [record_of(request, completion, **place)
                 for request, completion, (_, place) in zip(rich, completions, missing)]
        for record in batch:
            self.records[record["key"]] = record
        on_generated(batch)

    def _joint_actions(self, path: Walk, core: Deliberation) -> list[tuple[Move, ...]]:
        joint = list(itertools.product(*[self._moves(core, i) for i in range(core.config.num_agents)]))
        if self.branch_limit is None or len(path.prefix) == 0 or len(joint) <= self.branch_limit:
            return joint
        everyone = [tuple([(a, None)] * core.config.num_agents) for a in (Action.PERSIST, Action.REFINE)]
        rest = [j for j in joint if j not in everyone]
        seed = mix_seed(path.stream, len(path.prefix), *[int(a) * 16 + (-1 if target is None else target) + 1
                                                         for moves in path.prefix for a, target in moves])
        keep = max(self.branch_limit - len(everyone), 0)
        return everyone + random.Random(seed).sample(rest, min(keep, len(rest)))

    def _moves(self, core: Deliberation, agent: int) -> list[Move]:
        """PERSIST, REFINE and the CONCEDEs open to ``agent``: one per peer it can adopt, or the rule's one."""
        concede: list[Move]
        if self.all_targets:
            concede = [(Action.CONCEDE, peer) for peer in core.concede_options(agent)]
        else:
            concede = [(Action.CONCEDE, None)] if core.concede_target(agent) is not None else []
        return [(Action.PERSIST, None), (Action.REFINE, None), *concede]


def unrecorded(dataset: ReplaySet, task: Task, split: str,
               problems: Sequence[Problem] | None = None) -> list[dict[str, Any]]:
    """Where ``dataset`` lacks a request of the trees its card says it holds (every joint action sequence, stream
    and confidence source of its recorded problems of ``split``, or of ``problems``): the places of the first wave
    that lacks any, none for a whole set. ``task`` is the card's task."""
    card = dataset.card
    recorder = TreeRecorder(task, card.config(), None, rounds=card.rounds, confidence_sources=card.confidence_sources,
                            records=dataset.records, branch_limit=card.branch_limit,
                            all_targets=card.concede_targets == "all")
    if problems is None:
        recorded = set(card.splits.get(split, []))
        problems = [p for p in task.problems(split) if p.id in recorded]
    return recorder.missing(problems, split)


def _begin(core: Deliberation, moves: Sequence[Move]) -> None:
    core.begin_round([action for action, _ in moves], [target for _, target in moves])


class PartialFile:
    """The append-only file of a chunk's records so far (flushed per batch)."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def read(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        records = []
        with open(self.path, encoding="utf-8") as stream:
            for line in stream:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:  # a line cut by a kill: it is generated again
                    break
        return records

    def append(self, records: list[dict[str, Any]]) -> None:
        with open(self.path, "a", encoding="utf-8") as stream:
            for record in records:
                stream.write(json.dumps(record, separators=(",", ":")) + "\n")
            stream.flush()
            os.fsync(stream.fileno())

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
