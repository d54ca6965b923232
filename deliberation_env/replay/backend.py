"""``backend="replay"``: answer an env's requests from a recorded replay set (see ``replay.dataset``).

    env = deliberation_env.parallel_env(backend="replay", backend_kwargs={"dataset": "qwen05-arith-v2"},
                                        split="train")      # the set's recorded game, for what is not given
    env = deliberation_env.replay_env("qwen05-arith-v2", split="train")   # the same: the set's own settings

At env construction the backend checks that the set serves every episode the env can play
(``ReplaySet.check``): the same task prompts and problems, the same request-determining settings, no
more rounds than recorded, a recorded confidence source and the request format of this code. A set
that passes never misses in the middle of a run. The env's problems become the set's recorded
problems of the split, and its episodes draw one of the set's S streams per episode seed
(``DeliberationConfig.streams``).

A request outside the recording (a custom env driven past the check) raises ``ReplayMiss`` naming the
problem, stream, round, agent and the command that records it; with ``fallback=`` a live backend
answers it instead, and ``write_back=True`` appends those answers to the set as a chunk marked
``fallback`` (listed, with its checksum, in the card).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from deliberation_env.backends.base import Backend
from deliberation_env.core.deliberation import Deliberation, DeliberationConfig
from deliberation_env.core.seeds import request_seed, stream_seed
from deliberation_env.core.tools import request_kinds
from deliberation_env.replay.dataset import (
    ReplayError,
    ReplaySet,
    env_settings,
    record_of,
    rich_request,
    task_split,
    write_card,
)
from deliberation_env.replay.format import write_chunk
from deliberation_env.replay.markdown import card_markdown
from deliberation_env.requests import Completion, Request
from deliberation_env.tasks.base import Problem, Task

SAMPLING_SETTINGS = ("max_tokens", "critic_max_tokens", "temperature", "critic_temperature")
"""The card settings a request's sampling comes from (named when an unchecked env's request is refused)."""


class ReplayMiss(LookupError):
    """A request that the replay set does not hold (and no fallback backend answered)."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Binding:
    """What a replay set imposes on the env that uses it (one per env: the split is the env's, not the backend's)."""

    split: str
    problems: list[Problem]
    streams: int
    request_format: int
    """How the set's stream seeds were derived (``core.seeds``); the env plays under it."""


class ReplayBackend:
    """Answers requests from a replay set; see the module docstring."""

    answers_tools = True
    """It answers a program-aided role's runs from their records too: the request grouper sends it a tool's requests
    instead of running the tool (``core.tools``), so a replayed team runs no code."""

    def __init__(self, dataset: str | os.PathLike[str] | ReplaySet, fallback: Backend | None = None,
                 write_back: bool = False, fallback_model: str | None = None):
        self.set = dataset if isinstance(dataset, ReplaySet) else ReplaySet(dataset)
        if write_back and fallback is None:
            raise ValueError("write_back=True needs a fallback= backend to fill the gaps it writes")
        if fallback is not None:
            found = fallback.identity()
            if found != (fallback_model or self.set.card.model):
                raise ReplayError(
                    f"replay set {self.set.card.name!r} was recorded with model {self.set.card.model!r}; the fallback "
                    f"backend is {found!r}. Its answers would pass for the recorded model's: use a fallback of that "
                    f"model, or pass fallback_model={found!r} to accept this one on purpose")
        self.fallback, self.write_back = fallback, write_back
        self._admitted: set[tuple[str, int, float]] = set()
        """(kind, max_tokens, temperature) of the requests the envs that bound this backend make: a request with other
        settings comes from an env whose integrity check never ran (one behind a wrapper that hides this backend)."""
        self._splits: dict[str, str] = {}
        """The split of each problem of the bound envs' tasks, for naming misses and fallback chunks (problem ids are
        distinct across splits: a train env and a test env on this backend never overwrite each other's)."""
        self.hits = self.misses = 0

    def identity(self) -> str:
        return self.set.card.model

    def __repr__(self) -> str:
        return f"ReplayBackend({self.set!r})"

    @property
    def bound(self) -> bool:
        """Whether an env bound this backend (so the set's integrity check ran for what it asks)."""
        return bool(self._admitted)

    def bind(self, task: Task, config: DeliberationConfig, split: str) -> Binding:
        """Check that the set serves the env (ReplayError if not) and say which problems and streams it has."""
        card = self.set.card
        streams = card.streams if config.streams is None else config.streams
        config = replace(config, streams=streams, request_format=card.request_format)
        problems = self.set.check(task, config, split)
        core = Deliberation(task, config)
        self._admitted.update((kind, *core.sampling(agent, kind)) for agent in range(config.num_agents)
                              for kind in request_kinds())
        self._splits.update((problem.id, task_split(card, split)) for problem in problems)
        return Binding(split, problems, streams, card.request_format)

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        stranger = next((r for r in requests if (r.kind, r.max_tokens, r.temperature) not in self._admitted), None)
        if stranger is not None:
            raise ReplayError(self._describe_stranger(stranger))
        completions: list[Completion | None] = [self.set.lookup(request) for request in requests]
        gaps = [i for i, completion in enumerate(completions) if completion is None]
        self.hits += len(requests) - len(gaps)
        self.misses += len(gaps)
        if gaps:
            if self.fallback is None:
                for i in gaps:  # a request of a game the set was not recorded for is refused as such, not a miss
                    if (refusal := self._refusal(requests[i])) is not None:
                        raise ReplayError(refusal)
                raise ReplayMiss(self._describe_miss(requests[gaps[0]], len(gaps)))
            filled = self.fallback.generate([rich_request(requests[i]) for i in gaps])
            by_split: dict[str, list[dict[str, Any]]] = {}
            for i, completion in zip(gaps, filled):
                record = record_of(rich_request(requests[i]), completion, **self._place(requests[i]))
                self.set.records[record["key"]] = record
                by_split.setdefault(record["split"], []).append(record)
                completions[i] = self.set.lookup(requests[i])
            if self.write_back:
                self._write_back(by_split)
        return cast("list[Completion]", completions)  # the gaps are filled above

    def _write_back(self, by_split: dict[str, list[dict[str, Any]]]) -> None:
        """One chunk per split of the filled records, listed in the card (and its README)."""
        assert self.fallback is not None
        for split, records in by_split.items():
            # named <split>-... so that the README's per-split data files take it in
            name = f"chunks/{split}-fallback-{time.time_ns()}.parquet"
            entry = write_chunk(self.set.path / name, records)
            entry["model"] = self.fallback.identity()  # these records' model (the card's, or fallback_model)
            self.set.card.files[name] = entry
        write_card(self.set.path, self.set.card)
        (self.set.path / "README.md").write_text(card_markdown(self.set.card), encoding="utf-8")

    def _place(self, request: Request) -> dict[str, Any]:
        """Where a request sits in the tree (split, problem, stream, round): the split of the problem in the bound
        tasks, the stream and round those whose seed (``core.seeds``) is the request's."""
        card = self.set.card
        problem = request.problem if request.problem is not None else "?"
        split = self._splits.get(problem, "?")
        for stream in range(card.streams):
            episode = stream_seed(stream, problem, card.request_format)
            for round_ in range(card.rounds + 2):
                if request_seed(episode, round_, request.agent, request.kind) == request.seed:
                    return {"split": split, "problem": problem, "stream": stream, "round": round_}
        return {"split": split, "problem": problem, "stream": -1, "round": -1}

    def _describe_stranger(self, request: Request) -> str:
        """The error of a request that no env bound to this backend makes, so that no integrity check covered it."""
        fix = ("a wrapper that hides the replay backend does this: give the ReplayBackend to the env itself, or have "
               "the wrapper expose it as its `inner` attribute")
        name, settings = self.set.card.name, self.set.card.settings
        sampling = ", ".join(f"{key}={settings[key]}" for key in SAMPLING_SETTINGS if key in settings)
        if not self._admitted:
            return (f"replay set {name!r} was asked for completions before an env bound it, so its integrity check "
                    f"never ran ({fix})")
        return (f"replay set {name!r} was asked for a {request.kind} completion with max_tokens={request.max_tokens}, "
                f"temperature={request.temperature}, which no env bound to it asks for: the env that sent it was never "
                f"checked against the set ({fix}; the set was recorded with {sampling})")

    def _refusal(self, request: Request) -> str | None:
        """Why a request the set lacks comes from another game than the recorded one (the error's text), or None
        for a plain miss. A set holds every request of its recorded problems' trees (the index and contents are
        checked at bind), so a miss of an env that plays the recorded game is damage or a partial set's branch; one
        that plays another game (an env behind a wrapper that hides the backend, so never checked) is named here,
        at the first request that differs: its reset for problems, levels, prompts, roles, agents beyond the recorded
        team and streams; its first step for a smaller team or another concede rule (their round-0 requests are all
        recorded)."""
        card, place = self.set.card, self._place(request)
        name = f"replay set {card.name!r} ({self.set.path})"
        recorded = {pid for ids in card.splits.values() for pid in ids}
        unchecked = ("the env that sent it plays another game than the recording (behind a wrapper that hides the "
                     "backend, no check ran: give the ReplayBackend to the env itself, or expose it as `inner`, and "
                     "the env is checked at construction)")
        if request.problem is not None and request.problem not in recorded:
            split = place["split"] if place["split"] != "?" else "SPLIT"
            return (f"{name} holds no problem {request.problem!r} (its splits: {self.set.problem_counts()}; asked: "
                    f"a {request.kind} request of round {place['round']}, agent {request.agent}): {unchecked}; a "
                    f"split past the recorded problems or other task_kwargs ({card.task_kwargs} recorded). To add the "
                    f"problem, record it with `python -m deliberation_env.record --out {self.set.path} --split "
                    f"{split} --problem-ids {request.problem} ...`, or pass fallback=<live backend>")
        agents = card.settings.get("num_agents")
        if isinstance(agents, int) and request.agent >= agents:
            return f"{name} was recorded with num_agents={agents}; a request of agent {request.agent}: {unchecked}"
        if place["stream"] < 0:
            return (f"{name} holds {card.streams} stream(s) per problem (request format {card.request_format}); the "
                    f"{request.kind} request of problem {request.problem!r}, agent {request.agent} has the seed of no "
                    f"recorded stream and round: {unchecked} (streams= or request_format=)")
        if request.kind == "solve":
            return (f"{name}: the solve prompt of problem {request.problem!r} (stream {place['stream']}, agent "
                    f"{request.agent}) is not the recorded one: {unchecked} (other task_kwargs, such as levels or "
                    f"the prompt style, or other roles; recorded task_kwargs {card.task_kwargs})")
        if 0 <= place["round"] <= (0 if card.partial else card.rounds):
            return (f"{name} holds every request of problem {request.problem!r}'s tree up to round {card.rounds}, "
                    f"but not this {request.kind} request of round {place['round']}, agent {request.agent}: "
                    f"{unchecked} (a team of another size, another concede rule or confidence source)")
        return None

    def _describe_miss(self, request: Request, count: int) -> str:
        place, card = self._place(request), self.set.card
        where = (f"problem {place['problem']!r} (split {place['split']!r}), stream {place['stream']}, "
                 f"round {place['round']}, agent {request.agent}")
        missing = (f"replay set {card.name!r} has no {request.kind} completion for {where}"
                   f"{f' (and {count - 1} more in this batch)' if count > 1 else ''}")
        if place["round"] > card.rounds or place["round"] < 0:
            return (f"{missing}: the set was recorded with {card.rounds} round(s) and these settings, and a set "
                    "cannot grow rounds or change settings; record a new set with `python -m deliberation_env.record "
                    "--out NEW_FOLDER ...`, or pass fallback=<live backend> to fill gaps")
        return (f"{missing}. Record it with `python -m deliberation_env.record --out {self.set.path} --split "
                f"{place['split']} --problem-ids {place['problem']} --max-rounds {card.rounds} BACKEND FLAGS` "
                f"(the card's commands show the flags), or pass fallback=<live backend> to fill gaps")


def recorded_settings(backends: Sequence[Any]) -> dict[str, Any]:
    """The recorded game (``env_settings``) of the replay set the backends replay, also under wrappers; {} when none
    does. Envs on a replay backend take these for every setting not given, so that they play the set's own game."""
    replays = [r for r in map(replay_backend, backends) if r is not None]
    return env_settings(replays[0].set.card) if replays else {}


def replay_backend(backend: Any) -> ReplayBackend | None:
    """The replay backend a backend is or wraps (a wrapper exposes its backend as ``inner``), or None.

    A replay backend under a cache is refused: replay needs no cache, and a cache shared with a live run of the same
    model could answer a replayed request with a live completion."""
    wrappers = []
    while backend is not None and not isinstance(backend, ReplayBackend):
        wrappers.append(type(backend).__name__)
        backend = getattr(backend, "inner", None)
    if backend is not None and "CachedBackend" in wrappers:
        raise ReplayError(f"replay set {backend.set.card.name!r} under a cache (cache=): replay answers from the set "
                          "itself and needs none; drop cache=")
    return backend


def bind_replay(backends: Sequence[Any], task: Task, config: DeliberationConfig, split: str) -> Binding | None:
    """The binding of the env's replay backends, also under wrappers (all must agree), or None when none replays."""
    replays = {id(r): r for r in map(replay_backend, backends) if r is not None}
    bindings = [replay.bind(task, config, split) for replay in replays.values()]
    if not bindings:
        return None
    first = bindings[0]
    for other in bindings[1:]:
        if ([p.id for p in other.problems] != [p.id for p in first.problems] or other.streams != first.streams
                or other.request_format != first.request_format):
            raise ReplayError("the env's replay backends hold different problems or streams; give every agent the same set")
    return first
