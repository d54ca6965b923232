"""Replay sets: a real model's whole deliberation tree, recorded once and read back at dictionary speed.

A replay set is a folder (format in docs/replay.md; readable without this package)::

    card.json               what made it: model, weights (sha256, source), backend, library versions, task,
                            env and sampling settings, prompt fingerprint, streams, recorded problem ids per
                            split, request format, coverage, commands, and each data file's sha256 and records
    README.md               the human dataset card (written by the recorder from card.json)
    chunks/*.parquet        one row per completion (``RECORD_FIELDS``; encoding in ``replay.format``)
    problems/<split>.parquet  each recorded problem: question, gold answer, level/subject, solve prompt

Every completion is keyed by what determines it (``request_key``: messages, seed, max_tokens,
temperature, top_p) and stored with all the signals the model gave: solutions and refinements with
every token's log-probability, critic calls with the first token's top log-probabilities. A replayed
request gets back the fields it asked for (``completion_for``), so one recording serves the ``critic``,
``critic_text`` and ``answer_logprobs`` confidence sources alike.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from deliberation_env.backends.base import Completion, Request
from deliberation_env.core.deliberation import Deliberation, DeliberationConfig
from deliberation_env.core.roles import roles_setting
from deliberation_env.replay.card import (  # noqa: F401 - re-exported: the set's card, where sets are found
    EMPTY_DIGEST,
    FORMAT,
    HUB_PREFIX,
    KEY_JSON,
    OLD_FORMATS,
    PINNED,
    SETS_DIR,
    ReplayCard,
    ReplayError,
    departures,
    env_settings,
    load_card,
    problem_digests,
    read_card,
    resolve,
    set_digest,
    shipped,
    write_card,
)
from deliberation_env.replay.format import DAMAGE_FIX, DamagedSet, read_chunk, verify
from deliberation_env.tasks.base import PeerView, Problem, Task

SETTING_FIELDS = ("num_agents", "concede_target", "reintrospect_concede", "max_tokens", "critic_max_tokens",
                  "temperature", "critic_temperature")
"""The ``DeliberationConfig`` fields that change which requests an episode makes (besides rounds and confidence)."""
RECORD_FIELDS = ("key", "split", "problem", "stream", "round", "agent", "kind", "text", "prompt_tokens",
                 "completion_tokens", "finish_reason", "top_logprobs", "token_logprobs")
LOOKUP_MEMO = 1 << 16
"""Completions ``ReplaySet.lookup`` remembers at most (then it starts over)."""
DERIVED_SPLITS = {"validation": "train", "fit": "train"}
"""Splits carved from a recorded one (docs/benchmark.md): ``validation`` holds a third of the recorded ``train``
problems, stratified by level (``validation_ids``), ``fit`` the others. Fixed by the set's problem ids and levels, so
every run and machine carves them alike; a set that records a split of one of these names plays its own."""
VALIDATION_FRACTION = 1 / 3


_KEYS: dict[tuple, str] = {}
"""Keys computed lately, by what they hash: the recorder's walk and an episode ask for the same request many
times, and hashing its fields is cheaper than encoding and digesting them again."""
_KEYS_KEPT = 8192


def request_key(request: Request) -> str:
    """The key of a request in a replay set: a hash of the messages, the seed and the sampling settings.

    Which log-probabilities a request asks for is not part of it: a recording keeps them all."""
    fields = (request.messages, request.seed, request.max_tokens, request.temperature, request.top_p)
    key = _KEYS.get(fields)
    if key is None:
        payload = KEY_JSON.encode({"messages": [[m.role, m.content] for m in request.messages],
                                    "seed": int(request.seed), "max_tokens": request.max_tokens,
                                    "temperature": float(request.temperature), "top_p": float(request.top_p)})
        key = hashlib.sha256(payload.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        if len(_KEYS) >= _KEYS_KEPT:
            _KEYS.clear()
        _KEYS[fields] = key
    return key


def rich_request(request: Request) -> Request:
    """The request as the recorder sends it: critics with first-token top log-probabilities, generations with
    every token's log-probability (the model's text does not depend on which log-probabilities are asked for)."""
    critic = request.kind == "critic"
    return replace(request, logprobs=critic, token_logprobs=not critic)


def completion_for(request: Request, record: Mapping[str, Any]) -> Completion:
    """The recorded completion as the live backend would have answered ``request``."""
    tokens = record.get("token_logprobs")
    return Completion(
        text=record["text"], prompt_tokens=record["prompt_tokens"], completion_tokens=record["completion_tokens"],
        top_logprobs=dict(record["top_logprobs"]) if request.logprobs and record.get("top_logprobs") else None,
        finish_reason=record["finish_reason"], cached=True,
        token_logprobs=tuple((str(t), float(v)) for t, v in tokens) if request.token_logprobs and tokens is not None else None,
    )


def record_of(request: Request, completion: Completion, *, split: str, problem: str, stream: int,
              round: int) -> dict[str, Any]:
    """One line of a chunk file."""
    tokens = completion.token_logprobs
    return {"key": request_key(request), "split": split, "problem": problem, "stream": stream, "round": round,
            "agent": request.agent, "kind": request.kind, "text": completion.text,
            "prompt_tokens": completion.prompt_tokens, "completion_tokens": completion.completion_tokens,
            "finish_reason": completion.finish_reason, "top_logprobs": completion.top_logprobs,
            "token_logprobs": None if tokens is None else [[t, v] for t, v in tokens]}


def prompt_fingerprint(task: Task) -> str:
    """A hash of the task's three prompts on a fixed probe problem: a prompt change changes it."""
    probe = Problem(id="probe", question="What is 2 + 3?", answer="5")
    peers = [PeerView("5", "2 + 3 = 5."), PeerView(None, "I could not finish.")]
    messages = (task.solve_messages(probe), task.refine_messages(probe, "2 + 3 = 6. The answer is 6", peers),
                task.critic_messages(probe, "2 + 3 = 5. The answer is 5"))
    text = KEY_JSON.encode([[[m.role, m.content] for m in group] for group in messages])
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def settings_of(config: DeliberationConfig) -> dict[str, Any]:
    """``SETTING_FIELDS`` of ``config``, and its ``roles`` as plain data when the team has roles (a homogeneous
    team's settings hold no ``roles`` key, as every set recorded before roles existed)."""
    settings = {name: getattr(config, name) for name in SETTING_FIELDS}
    if config.roles is not None:
        settings["roles"] = roles_setting(config.roles)
    return settings


class ReplaySet:
    """A loaded replay set: its card and its completions by ``request_key``."""

    def __init__(self, path: str | os.PathLike[str], digest: str | None = None):
        """``path``: a folder, a shipped set's name or ``hf://owner/name[@revision]``, optionally ``#<digest>``;
        ``digest``: the set digest it must have (``card.read_card``; a shipped set must have its ``PINNED`` one)."""
        self.path, self.card, self.digest = read_card(
            path, digest, "not a replay set (record one with `python -m deliberation_env.record`)")
        self.records: dict[str, dict[str, Any]] = {}
        self._found: dict[tuple[Any, ...], Completion] = {}
        self._passed: set[tuple[Any, ...]] = set()
        self._held: dict[str, list[dict[str, Any]]] | None = None
        """Each problem's records, grouped at the first check (``_check_index``)."""
        self.checks_run = 0
        """How many times ``check`` checked a split's solve requests against the records (it remembers each pass,
        by split, request settings, prompts and problem questions)."""
        for record in read_records(self.path, self.card):
            self.records[record["key"]] = record

    def __len__(self) -> int:
        return len(self.records)

    def __repr__(self) -> str:
        return (f"ReplaySet({self.card.name!r}, digest {self.digest}, {len(self)} completions, "
                f"splits {self.problem_counts()})")

    @property
    def identity(self) -> str:
        """How results name the set: ``<name>#<digest>`` (``ReplaySet("<name>#<digest>")`` loads only that set)."""
        return f"{self.card.name}#{self.digest}"

    def problem_counts(self) -> dict[str, int]:
        return {split: len(ids) for split, ids in self.card.splits.items()}

    def lookup(self, request: Request) -> Completion | None:
        """The recorded completion of ``request``, or None. Found completions are remembered by what determines
        them (hashing the request's JSON is most of a lookup's cost); Completions are frozen, so sharing is safe."""
        memo_key = (request.messages, request.seed, request.max_tokens, request.temperature, request.top_p,
                    request.logprobs, request.token_logprobs)
        found = self._found.get(memo_key)
        if found is None:
            record = self.records.get(request_key(request))
            if record is None:
                return None
            found = completion_for(request, record)
            if len(self._found) >= LOOKUP_MEMO:
                self._found.clear()
            self._found[memo_key] = found
        return found

    def check(self, task: Task, config: DeliberationConfig, split: str) -> list[Problem]:
        """The recorded problems of ``split`` if this set serves every episode of ``task`` under ``config``;
        else a ReplayError naming the first difference and the fix. Runs at env construction; its costly part (a
        recorded solve request per problem) runs once per split, settings, prompts and problems, and is remembered."""
        card = self.card
        where = f"replay set {card.name!r} ({self.path})"
        if config.request_format != card.request_format:
            raise ReplayError(f"{where} was recorded with request format {card.request_format}, the env derives "
                              f"format {config.request_format}; pass request_format={card.request_format} "
                              "(replay_env() does)")
        if getattr(task, "name", None) != card.task:
            raise ReplayError(task_mismatch(card, where, getattr(task, "name", task)))
        fingerprint = prompt_fingerprint(task)
        if fingerprint != card.prompt_fingerprint:
            raise ReplayError(f"{where} was recorded with other prompts (task_kwargs {card.task_kwargs}); build the "
                              "env with deliberation_env.replay_env(), or record the set again for these prompts")
        if config.concede_to_peer and card.concede_targets != "all":
            raise ReplayError(f"{where} was recorded with CONCEDE to the {card.settings.get('concede_target')!r} "
                              "rule's peer only, so it cannot serve concede_to_peer=True; use a set recorded with "
                              "--concede-targets all, or record one")
        if card.settings.get("roles") != roles_setting(config.roles):
            raise ReplayError(f"{where} was recorded with roles={card.settings.get('roles')!r}, the env has "
                              f"roles={roles_setting(config.roles)!r}; pass the set's roles (replay_env() does)")
        for name, recorded in card.settings.items():
            if name == "roles":
                continue  # compared above, as plain data
            if name == "concede_target" and card.concede_targets == "all":
                continue  # every peer a CONCEDE can adopt is recorded
            if getattr(config, name) != recorded:
                raise ReplayError(f"{where} was recorded with {name}={recorded!r}, the env has "
                                  f"{name}={getattr(config, name)!r}; pass {name}={recorded!r} (replay_env() does)")
        generated = config.max_rounds if config.refine_rounds is None else min(config.max_rounds, config.refine_rounds)
        if generated > card.rounds:
            raise ReplayError(f"{where} holds {card.rounds} round(s); the env asks for max_rounds={config.max_rounds} "
                              f"with REFINE in {generated} of them: pass refine_rounds={card.rounds} to play the later "
                              "rounds with PERSIST and CONCEDE only (exact, from the answers the set holds), or record "
                              "more rounds")
        if config.confidence not in card.confidence_sources:
            raise ReplayError(f"{where} records confidence sources {card.confidence_sources}, not "
                              f"{config.confidence!r}")
        if config.streams != card.streams:
            raise ReplayError(f"{where} holds {card.streams} stream(s) per problem; the env has streams={config.streams}")
        recorded = split_problem_ids(card, split)
        if recorded is None:
            raise ReplayError(split_mismatch(card, where, split))
        by_id = {problem.id: problem for problem in task.problems(task_split(card, split))}
        missing = next((problem_id for problem_id in recorded if problem_id not in by_id), None)
        if missing is not None:
            raise ReplayError(f"{where} holds problem {missing!r}, which split {split!r} of the task does not "
                              f"have (task_kwargs {card.task_kwargs}); build the env with replay_env()")
        problems = [by_id[problem_id] for problem_id in recorded]
        key = (split, fingerprint, tuple((p.id, p.question) for p in problems),
               *(getattr(config, name) for name in SETTING_FIELDS))
        if key not in self._passed:
            self._check_index(problems)
            self._check_solve_requests(task, config, problems)  # first: another task's problems are named as such
            self._check_problem_table(split, problems)
            self._passed.add(key)
        return problems

    def _check_index(self, problems: Sequence[Problem]) -> None:
        """Every chunk of the card's index is among its files, and each problem holds the records its chunk held
        when recorded (a count per problem): a chunk removed with its card entry, or a record removed and the card
        resealed, is refused here rather than missing mid-episode. Counted once per set."""
        card, where = self.card, f"replay set {self.card.name!r} ({self.path})"
        fix = DAMAGE_FIX
        for name, counts in card.index.items():
            if name not in card.files:
                listed = ", ".join(list(counts)[:3]) + (", ..." if len(counts) > 3 else "")
                raise ReplayError(f"{where}: {name} is missing (card.json's index lists it with the records of "
                                  f"{len(counts)} problems: {listed}, but its files table does not); {fix}")
        if not card.index:
            return  # recorded before the index: `python -m deliberation_env.record --check` walks its trees
        if self._held is None:
            self._held = {}
            for record in self.records.values():
                self._held.setdefault(record["problem"], []).append(record)
        expected = {problem: (name, count) for name, counts in card.index.items() for problem, count in counts.items()}
        for problem in problems:
            if problem.id not in expected:
                raise ReplayError(f"{where}: problem {problem.id!r} is recorded (card.json's splits) but no chunk of "
                                  f"its index holds it; {fix}")
            name, count = expected[problem.id]
            held = self._held.get(problem.id, [])
            if len(held) < count:
                raise ReplayError(f"{where}: problem {problem.id!r} holds {len(held)} records, {name} held "
                                  f"{count} of it when recorded (a record was removed); {fix}")
            recorded = card.contents.get(problem.id)
            if recorded is not None and problem_digests(held).get(problem.id, EMPTY_DIGEST) != recorded:
                raise ReplayError(f"{where}: the records of problem {problem.id!r} differ from those {name} held when "
                                  f"recorded (card.json's contents: a record removed, replaced, added or edited); "
                                  f"{fix}")

    def _check_problem_table(self, split: str, problems: Sequence[Problem]) -> None:
        """The set's problems table (``problems/<split>.parquet``: the questions and gold answers the card's
        statistics and any reader of the set use) is the task's: a gold answer changed in the table is refused."""
        name = f"problems/{task_split(self.card, split)}.parquet"
        if name not in self.card.files:
            return  # a set written before problem tables (migrated sets have one)
        table = pq.read_table(self.path / name, columns=["id", "question", "answer"]).to_pydict()
        rows = {pid: (question, answer) for pid, question, answer in zip(table["id"], table["question"], table["answer"])}
        for problem in problems:
            row = rows.get(problem.id)
            if row != (problem.question, problem.answer):
                what = "lacks it" if row is None else ("has another question" if row[0] != problem.question else
                                                       f"has gold answer {row[1]!r}, the task {problem.answer!r}")
                raise ReplayError(f"replay set {self.card.name!r} ({self.path}): {name} {what} for problem "
                                  f"{problem.id!r}: the table is not the task's (task_kwargs {self.card.task_kwargs}); "
                                  f"{DAMAGE_FIX}")

    def _check_solve_requests(self, task: Task, config: DeliberationConfig, problems: Sequence[Problem]) -> None:
        """Each problem's first request (its solve prompt under ``config``) is in the set."""
        self.checks_run += 1
        card, where = self.card, f"replay set {self.card.name!r} ({self.path})"
        core = Deliberation(task, config)
        for problem in problems:
            core.start(problem, 0)
            if request_key(core.pending_requests()[0]) not in self.records:
                raise ReplayError(f"{where}: the task's solve prompt for problem {problem.id!r} is not the recorded "
                                  f"one (recorded with task_kwargs {card.task_kwargs}; replay_env() builds the task "
                                  "with them); if the task's problems changed, record the set again")


@functools.lru_cache(maxsize=4)
def loaded(dataset: str) -> ReplaySet:
    """A replay set read once per process, by the name, folder or ``hf://`` id it is given (reading one takes
    seconds): the trainers, the compiler and the benchmark share it. A set changed on disk is read again by a new
    process, not by this one."""
    return ReplaySet(dataset)


def task_mismatch(card: ReplayCard, where: str, task: object) -> str:
    """The error of an env that asks a replay set for another task than the recorded one."""
    return (f"{where} records task {card.task!r} with task_kwargs {card.task_kwargs}, not {task!r}: drop task= and "
            f"task_kwargs= (replay_env() builds the recorded task), or record a set for {task!r} with "
            f"`python -m deliberation_env.record --task {task} ...`")


def validation_ids(card: ReplayCard) -> frozenset[str]:
    """The recorded ``train`` problems of the derived ``validation`` split: within each stratum (a problem's level in
    the set's problems table, else its subject; one stratum where the set has no table), the problems ordered by the
    sha256 of their id, the first ``VALIDATION_FRACTION`` of them (rounded), so validation has test's mix of levels."""
    strata = problem_strata(card)
    groups: dict[object, list[str]] = {}
    for problem_id in card.splits.get("train", []):
        groups.setdefault(strata.get(problem_id), []).append(problem_id)
    chosen: set[str] = set()
    for ids in groups.values():
        ordered = sorted(ids, key=lambda pid: hashlib.sha256(pid.encode("utf-8")).hexdigest())
        chosen.update(ordered[:round(len(ordered) * VALIDATION_FRACTION)])
    return frozenset(chosen)


def problem_strata(card: ReplayCard) -> dict[str, object]:
    """Each recorded ``train`` problem's stratum: its level in ``problems/train.parquet``, else its subject; {} where
    the set has no problems table (format 1 sets before migration, a card read without its folder)."""
    entry = card.files.get("problems/train.parquet")
    if card.folder is None or entry is None:
        return {}
    return dict(_strata(card.folder / "problems" / "train.parquet", str(entry.get("sha256"))))


@functools.lru_cache(maxsize=16)
def _strata(path: Path, sha256: str) -> tuple[tuple[str, object], ...]:
    """(id, stratum) of a problems table (cached by its path and checksum)."""
    table = pq.read_table(path, columns=["id", "level", "subject"]).to_pylist()
    return tuple((row["id"], row["level"] if row["level"] is not None else row["subject"]) for row in table)


def split_problem_ids(card: ReplayCard, split: str) -> list[str] | None:
    """The problem ids a set holds for ``split``: a recorded split's, a derived split's (``DERIVED_SPLITS``), or None
    when it has neither."""
    if split in card.splits:
        return list(card.splits[split])
    parent = DERIVED_SPLITS.get(split)
    if parent is None or parent not in card.splits:
        return None
    chosen = validation_ids(card)
    return [pid for pid in card.splits[parent] if (pid in chosen) == (split == "validation")]


def task_split(card: ReplayCard, split: str) -> str:
    """The task's split whose problems ``split`` holds (a derived split's parent)."""
    return split if split in card.splits else DERIVED_SPLITS.get(split, split)


def derived_splits(card: ReplayCard) -> list[str]:
    """The splits carved from the set's recorded ones (``DERIVED_SPLITS`` whose parent it recorded), sorted."""
    return sorted(name for name, parent in DERIVED_SPLITS.items() if parent in card.splits)


def split_mismatch(card: ReplayCard, where: str, split: str) -> str:
    """The error of an env that asks a replay set for a split it did not record."""
    derived = derived_splits(card)
    carved = f" (and {derived}, carved from them)" if derived else ""
    return (f"{where} has no split {split!r}; it holds splits {sorted(card.splits)}{carved}: pass one of them as "
            "split=, or "
            f"record {split!r} into the set with `python -m deliberation_env.record --split {split} ...` (the card's "
            "commands show the other flags)")


def records_per_problem(records: Iterable[Mapping[str, Any]], problems: Iterable[str] = ()) -> dict[str, int]:
    """How many of ``records`` each problem has, ``problems`` first (0 for one whose requests are all another
    problem's: the same question and seed); a chunk's entry in ``card.index``."""
    counts = dict.fromkeys(problems, 0)
    counts.update(Counter(record["problem"] for record in records))
    return counts


def chunk_files(path: Path) -> list[Path]:
    return sorted((path / "chunks").glob("*.parquet"))


def read_records(path: Path, card: ReplayCard | None = None, *, strict: bool = True) -> Iterator[dict[str, Any]]:
    """Every record of a set's chunks, after checking each file against the card (``format.verify``: present,
    sha256, record count; ``strict``: no chunk the card does not list). ReplayError naming the damaged file."""
    if card is None:
        card = load_card(path)
    try:
        chunks = verify(path, card.files, strict=strict)
    except DamagedSet as error:
        raise ReplayError(f"replay set {card.name!r} ({path}): {error}") from error
    for chunk in chunks:
        yield from read_chunk(chunk)
