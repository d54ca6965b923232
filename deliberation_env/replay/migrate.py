"""Convert a replay set of format ``deliberation-replay/1`` (JSON-lines chunks) to the current format.

    python -m deliberation_env.replay.migrate deliberation_env/replay/sets/qwen05-arith \\
        --weights ~/.cache/deliberation-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \\
        --weights-source https://huggingface.co/Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF --weights-license Apache-2.0

Each ``chunks/*.jsonl.gz`` becomes ``chunks/*.parquet`` with the same records (``replay.format``), the
problems of every split are written to ``problems/<split>.parquet``, and the card gains the sha256 and
record count of every file, every sampling parameter and, with ``--weights``, the model file's sha256.
Before anything is written the old chunks are counted against the card's ``stats.completions``, so a
damaged set is not sealed with fresh checksums. Rerunning it is safe: a set already converted only has
its card's tables refreshed. Partial files of a recording in progress are left as they are.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path
from typing import Any

from deliberation_env.cli import ArgumentParser, UserError, report_user_errors, user_input
from deliberation_env.replay.dataset import FORMAT, OLD_FORMATS, ReplayCard, records_per_problem, write_card
from deliberation_env.replay.format import (
    OLD_CHUNK_GLOB,
    entry_of,
    problem_rows,
    read_chunk,
    write_chunk,
    write_problems,
)
from deliberation_env.replay.markdown import card_markdown
from deliberation_env.replay.provenance import sampling_of, weights_of

UNRECORDED_VERSIONS = ("Library versions were not recorded with this set (its card predates the field; its chunks "
                       "were converted to Parquet by deliberation_env.replay.migrate).")


def read_old_chunk(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as stream:
        return [json.loads(line) for line in stream if line.strip()]


def chunk_problems(name: str, task: Any, card: ReplayCard) -> list[str]:
    """The recorded problems a chunk named by the recorder (``chunks/<split>-<first>-<last>.parquet``, positions in the
    task's split) was written for; none for another name."""
    found = re.fullmatch(r"chunks/(.+)-(\d+)-(\d+)\.parquet", name)
    if found is None or found[1] not in card.splits:
        return []
    split, first, last = found[1], int(found[2]), int(found[3])
    recorded = set(card.splits[split])
    return [p.id for i, p in enumerate(task.problems(split)) if first <= i <= last and p.id in recorded]


def migrate(folder: Path, weights: Path | None = None, source: str | None = None,
            license: str | None = None) -> ReplayCard:
    """Convert the set in ``folder`` in place (see the module docstring); its new card."""
    from deliberation_env.registry import TASKS

    card_path = folder / "card.json"
    if not card_path.is_file():
        raise UserError(f"{folder} has no card.json: not a replay set")
    card = ReplayCard.from_json(card_path.read_text(encoding="utf-8"), str(card_path), formats=(FORMAT, *OLD_FORMATS))
    old = sorted((folder / "chunks").glob(OLD_CHUNK_GLOB))
    converted = {path: read_old_chunk(path) for path in old}
    expected = card.stats.get("completions")
    if old and card.format in OLD_FORMATS and expected is not None:
        found = sum(len(records) for records in converted.values())
        if found != expected:
            raise UserError(f"{folder}'s chunks hold {found} records, its card counts {expected}: the set is damaged "
                            "(a chunk missing or cut); restore it from git before converting (recording it again makes a new set)")
    task = TASKS.make(card.task, **card.task_kwargs)
    for path, records in converted.items():
        target = path.with_name(path.name.removesuffix(".jsonl.gz") + ".parquet")
        write_chunk(target, records)
        name = target.relative_to(folder).as_posix()
        card.index[name] = records_per_problem(records, chunk_problems(name, task, card))
        if read_chunk(target) != records:  # pragma: no cover - the encoding's round trip is tested
            raise RuntimeError(f"{target} does not read back as {path}; nothing removed")
        path.unlink()
    card.files = {}
    for path in sorted((folder / "chunks").glob("*.parquet")):
        card.files[path.relative_to(folder).as_posix()] = entry_of(path)
    for split, ids in card.splits.items():
        card.files[f"problems/{split}.parquet"] = write_problems(folder / "problems" / f"{split}.parquet",
                                                                 problem_rows(task, split, ids, card.config().roles))
    first = next(iter(card.splits.items()), None)
    if first is not None:
        problem = next(p for p in task.problems(first[0]) if p.id == first[1][0])
        card.sampling = sampling_of(task, card.config(), problem)
    if weights is not None:
        card.weights = weights_of("file", str(weights), source, license)
    if not card.versions and UNRECORDED_VERSIONS not in card.notes:
        card.notes.append(UNRECORDED_VERSIONS)
    card.format = FORMAT
    card.stats["bytes"] = sum(e["bytes"] for name, e in card.files.items() if name.startswith("chunks/"))
    write_card(folder, card)
    (folder / "README.md").write_text(card_markdown(card), encoding="utf-8")
    return card


@report_user_errors("python -m deliberation_env.replay.migrate")
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m deliberation_env.replay.migrate", description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path, help="the replay set's folder")
    parser.add_argument("--weights", type=Path, default=None, help="the model file the set was recorded with (hashed)")
    parser.add_argument("--weights-source", default=None, metavar="URL", help="where the model file comes from")
    parser.add_argument("--weights-license", default=None, help="the model's license")
    args = parser.parse_args(argv)
    if args.weights is not None and not args.weights.expanduser().is_file():
        raise UserError(f"--weights {args.weights}: no such file")
    with user_input(str(args.folder)):
        card = migrate(args.folder, args.weights, args.weights_source, args.weights_license)
    print(f"{args.folder}: {card.format}, {len(card.files)} files checksummed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
