"""The on-disk encoding of a replay set's chunks and problems: typed Parquet, checksummed in the card.

A record in memory (``dataset.RECORD_FIELDS``) keeps log-probabilities as the backend gave them:
``token_logprobs`` a list of ``[token, logprob]`` pairs, ``top_logprobs`` a ``{token: logprob}`` dict.
JSON of those mixes strings and numbers in one list and gives every critic a struct of other keys, which
``pyarrow`` and ``datasets`` cannot type. On disk each becomes two parallel columns of one type each
(``tokens`` + ``token_logprobs``, ``top_tokens`` + ``top_logprobs``) under a fixed schema, so any Parquet
reader (pyarrow, pandas, ``datasets``, the hub viewer) reads the files as they are.

Parquet strings are UTF-8, which cannot hold the lone surrogates a server's JSON can carry: a text, finish
reason or token list that holds one is stored JSON-quoted (ASCII, losslessly) and named in ``escaped``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from deliberation_env.core.roles import Role, role_task

CHUNK_SUFFIX = ".parquet"
OLD_CHUNK_GLOB = "*.jsonl.gz"
"""Chunks of format ``deliberation-replay/1`` (JSON lines); read only by ``replay.migrate``."""
MIGRATE_COMMAND = "python -m deliberation_env.replay.migrate"
COMPRESSION = "zstd"

_STRINGS = pa.list_(pa.string())
_FLOATS = pa.list_(pa.float64())
_MESSAGES = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
CHUNK_SCHEMA = pa.schema([
    ("key", pa.string()), ("split", pa.string()), ("problem", pa.string()), ("stream", pa.int64()),
    ("round", pa.int64()), ("agent", pa.int64()), ("kind", pa.string()), ("text", pa.string()),
    ("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()), ("finish_reason", pa.string()),
    ("tokens", _STRINGS), ("token_logprobs", _FLOATS), ("top_tokens", _STRINGS), ("top_logprobs", _FLOATS),
    ("escaped", _STRINGS),
])
PROBLEM_SCHEMA = pa.schema([
    ("id", pa.string()), ("split", pa.string()), ("position", pa.int64()), ("question", pa.string()),
    ("answer", pa.string()), ("level", pa.int64()), ("subject", pa.string()), ("difficulty", pa.float64()),
    ("metadata", pa.string()),
    ("solve_messages", _MESSAGES),
    ("solve_messages_by_role", pa.list_(pa.struct([("name", pa.string()), ("messages", _MESSAGES)]))),
])
"""One row per recorded problem: what the records' ``problem`` ids point to (gold answer, level, solve prompts:
the task's own, and each role's of a team with roles)."""
_ENCODED = ("tokens", "token_logprobs", "top_tokens", "top_logprobs", "escaped")
_PLAIN = tuple(name for name in CHUNK_SCHEMA.names if name not in _ENCODED)
_ESCAPABLE = ("text", "finish_reason", "tokens", "top_tokens")


DAMAGE_FIX = ("the set is damaged: restore it (download it again, or check it out again from git); recording the "
              "problems again makes a new set, not the original (a recording engine need not reproduce its "
              "completions: the card's `reproducibility`)")
"""What every damage error says to do."""


class DamagedSet(ValueError):
    """A file of a replay set that differs from its card (``dataset.ReplayError`` wraps it with the set's name)."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while block := stream.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def to_row(record: Mapping[str, Any]) -> dict[str, Any]:
    """A record as a chunk row (log-probabilities as parallel lists)."""
    row = {name: record[name] for name in _PLAIN}
    pairs, top = record.get("token_logprobs"), record.get("top_logprobs")
    row["tokens"] = None if pairs is None else [str(t) for t, _ in pairs]
    row["token_logprobs"] = None if pairs is None else [float(v) for _, v in pairs]
    row["top_tokens"] = None if top is None else list(top)
    row["top_logprobs"] = None if top is None else [float(v) for v in top.values()]
    row["escaped"] = [name for name in _ESCAPABLE if _escape(row, name)] or None
    return row


def _escape(row: dict[str, Any], name: str) -> bool:
    """JSON-quote ``row[name]`` (a string or a list of them) if UTF-8 cannot hold it; True if it did."""
    value = row[name]
    if value is None:
        return False
    try:
        ("".join(value) if isinstance(value, list) else value).encode("utf-8")
        return False
    except UnicodeEncodeError:
        row[name] = [json.dumps(v) for v in value] if isinstance(value, list) else json.dumps(value)
        return True


def _write(path: Path, table: pa.Table) -> dict[str, Any]:
    """Write ``table`` atomically (a reader never sees half a file); its card entry."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    pq.write_table(table, partial, compression=COMPRESSION)
    os.replace(partial, path)
    return entry_of(path)


def entry_of(path: Path) -> dict[str, Any]:
    """A data file's entry in the card's ``files`` table."""
    return {"sha256": sha256_file(path), "records": pq.ParquetFile(path).metadata.num_rows,
            "bytes": path.stat().st_size}


def write_chunk(path: Path, records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Write a chunk file; its card entry (``sha256``, ``records``, ``bytes``)."""
    return _write(path, pa.Table.from_pylist([to_row(r) for r in records], schema=CHUNK_SCHEMA))


def read_chunk(path: Path) -> list[dict[str, Any]]:
    """A chunk's records as the recorder wrote them (``to_row``'s inverse). Read column by column: converting
    whole rows with ``Table.to_pylist`` takes a third longer on a set's million tokens."""
    table = pq.read_table(path, schema=CHUNK_SCHEMA)
    columns = {name: table.column(name).to_pylist() for name in CHUNK_SCHEMA.names}
    records = []
    for i, values in enumerate(zip(*(columns[name] for name in _PLAIN))):
        record = dict(zip(_PLAIN, values))
        tokens, top = columns["tokens"][i], columns["top_tokens"][i]
        for name in columns["escaped"][i] or ():  # rare: the fields ``_escape`` quoted
            if name == "tokens":
                tokens = [json.loads(t) for t in tokens]
            elif name == "top_tokens":
                top = [json.loads(t) for t in top]
            else:
                record[name] = json.loads(record[name])
        record["top_logprobs"] = None if top is None else dict(zip(top, columns["top_logprobs"][i]))
        record["token_logprobs"] = None if tokens is None else [[t, v] for t, v in zip(tokens, columns["token_logprobs"][i])]
        records.append(record)
    return records


def problem_rows(task: Any, split: str, ids: Sequence[str], roles: Sequence[Role] | None = None) -> list[dict[str, Any]]:
    """The rows of ``problems/<split>.parquet`` for the recorded ``ids`` of ``split``, in recording order; with the
    team's ``roles``, each role's solve prompt too (in order of first appearance), as its agents see it."""
    positions = {p.id: (i, p) for i, p in enumerate(task.problems(split))}
    views = {role.name: role_task(task, role) for role in roles or ()}
    rows = []
    for problem_id in ids:
        position, problem = positions[problem_id]
        meta = problem.metadata
        level, subject = meta.get("level"), meta.get("subject")
        rows.append({"id": problem.id, "split": split, "position": position, "question": problem.question,
                     "answer": problem.answer, "level": int(level) if isinstance(level, int) else None,
                     "subject": None if subject is None else str(subject), "difficulty": problem.difficulty,
                     "metadata": json.dumps(meta, sort_keys=True, default=str),
                     "solve_messages": _plain(task.solve_messages(problem)),
                     "solve_messages_by_role": [{"name": name, "messages": _plain(view.solve_messages(problem))}
                                                for name, view in views.items()] or None})
    return rows


def _plain(messages: Sequence[Any]) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content} for m in messages]


def write_problems(path: Path, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return _write(path, pa.Table.from_pylist(list(rows), schema=PROBLEM_SCHEMA))


def verify(folder: Path, files: Mapping[str, Mapping[str, Any]], *, strict: bool = True) -> list[Path]:
    """The set's chunk files, checked against the card's ``files`` table: each listed file present, with its
    sha256 and record count. ``strict``: a chunk the card does not list is damage too (else it is returned
    unchecked, for a recording that was stopped between writing a chunk and its card). DamagedSet if not."""
    if any((folder / "chunks").glob(OLD_CHUNK_GLOB)):
        raise DamagedSet(f"{folder} holds chunks in the old JSON-lines encoding (deliberation-replay/1); convert "
                         f"them once with `{MIGRATE_COMMAND} {folder}`")
    fix = DAMAGE_FIX
    for name, entry in files.items():
        path = folder / name
        if not path.is_file():
            raise DamagedSet(f"{name} is missing ({entry['records']} records listed in card.json); {fix}")
        if sha256_file(path) != entry["sha256"]:
            raise DamagedSet(f"{name} differs from the sha256 in card.json (truncated or altered); {fix}")
        count = pq.ParquetFile(path).metadata.num_rows
        if count != entry["records"]:
            raise DamagedSet(f"{name} holds {count} records, card.json lists {entry['records']}; {fix}")
    chunks = sorted((folder / "chunks").glob("*" + CHUNK_SUFFIX))
    unlisted = [p for p in chunks if p.relative_to(folder).as_posix() not in files]
    if unlisted and strict:
        raise DamagedSet(f"{unlisted[0].relative_to(folder).as_posix()} is not listed in card.json (a recording "
                         "stopped before its card was written, or a foreign file): rerun the recording command to "
                         "finish it, or remove the file")
    return chunks
