"""Record a replay set: a model's whole deliberation tree on a range of problems (``replay.recorder``).

    python -m deliberation_env.record --out runs/qwen05-arith --task arithmetic \\
        --task-option levels=[0,1] --split test --problems 0:400 --num-agents 3 --max-rounds 1 \\
        --max-tokens 256 --confidence critic_text --backend transformers --model Qwen.gguf

Every stream, confidence source (``--sources``) and legal joint action sequence up to ``--max-rounds`` is
recorded. Problems are recorded ``--chunk`` at a time: each finished chunk is a file of its own and is
listed in the card, so an interrupted run rerun with the same command loses nothing and goes on where
it stopped. ``--branch-limit K`` bounds rounds past the first (see ``replay.recorder``). The card, and
the README dataset card written from it, say what made the set.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from deliberation_env.cli import (
    OLD_TEAM_FLAGS,
    TEAM_FLAGS,
    ArgumentParser,
    KeyValueAction,
    UserError,
    add_backend_arguments,
    add_env_arguments,
    backend_settings,
    env_arguments,
    env_options,
    positive_int,
    report_user_errors,
    user_input,
)
from deliberation_env.core.config import CONFIDENCE_SOURCES, DeliberationConfig
from deliberation_env.replay.dataset import (
    ReplayCard,
    prompt_fingerprint,
    read_records,
    records_per_problem,
    settings_of,
    write_card,
)
from deliberation_env.replay.format import problem_rows, write_chunk, write_problems
from deliberation_env.replay.markdown import card_markdown
from deliberation_env.replay.provenance import library_versions, sampling_of, weights_of
from deliberation_env.replay.recorder import PartialFile, TreeRecorder, unrecorded
from deliberation_env.replay.stats import round0_accuracy

RECORD_FLAGS = (*TEAM_FLAGS, "confidence", "streams")
"""The env settings a recording is made with, their flags from ``DeliberationConfig``'s declaration."""
RECORD_DEFAULTS = {"max_rounds": 1, "confidence": "critic_text", "streams": 1}
"""A recording's own defaults: one round (it walks every joint action), the confidence source servers without
log-probabilities can record (``replay_env()`` uses it by default), one sample stream per problem."""


def parse_args(argv: list[str] | None) -> Any:
    parser = ArgumentParser(prog="python -m deliberation_env.record", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="the replay set's folder (created, or resumed)")
    parser.add_argument("--name", default=None, help="the set's name (default: the folder's name)")
    parser.add_argument("--task", default="arithmetic")
    parser.add_argument("--task-option", dest="task_options", action=KeyValueAction, default={}, metavar="KEY=VALUE",
                        help="a task constructor keyword, e.g. levels=[0,1] or prompt=no_code")
    parser.add_argument("--data-dir", default=None, help="benchmark data folder (tasks that read files)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--problems", default=None, metavar="START:END",
                        help="positions in the split to record (default: all)")
    parser.add_argument("--problem-ids", nargs="+", default=None, metavar="ID", help="record these problems instead")
    add_env_arguments(parser, RECORD_FLAGS, defaults=RECORD_DEFAULTS, aliases=OLD_TEAM_FLAGS)
    parser.add_argument("--sources", nargs="+", default=list(CONFIDENCE_SOURCES), choices=CONFIDENCE_SOURCES,
                        help="confidence sources whose trees are recorded (default: all; they share most requests)")
    parser.add_argument("--branch-limit", type=positive_int, default=None, metavar="K",
                        help="past round 1, keep K sampled joint actions per state (marks the set partial)")
    parser.add_argument("--concede-targets", choices=("rule", "all"), default="all",
                        help="record CONCEDE to every peer holding another answer (all: serves every concede-target "
                             "rule and chosen targets; default) or only to the --concede-target rule's peer (rule)")
    parser.add_argument("--chunk", type=positive_int, default=50, help="problems per chunk file (default 50)")
    parser.add_argument("--wave", type=positive_int, default=8, help="problems whose trees are walked together")
    parser.add_argument("--weights-source", default=None, metavar="URL",
                        help="where the model file comes from, for the card (its sha256 is computed)")
    parser.add_argument("--weights-license", default=None, help="the model's license, for the card")
    parser.add_argument("--weights-file", default=None, metavar="PATH",
                        help="openai backend: the file the server loaded, hashed for the card")
    parser.add_argument("--server-info", default=None, metavar="TEXT",
                        help="openai backend: the server's software and sampler settings, for the card's sampling "
                             "(e.g. 'llama.cpp llama-server 0c1e570, --top-k 0 --min-p 0')")
    parser.add_argument("--check", action="store_true",
                        help="record nothing: check that --out (a folder, a shipped set's name or hf://...) holds "
                             "every request of every joint action sequence of its recorded problems")
    add_backend_arguments(parser, backend_default="transformers")
    return parser.parse_args(argv)


def check_set(args: Any) -> int:
    """``--check``: walk every recorded tree of the set on its records alone; 0 when nothing is missing."""
    from deliberation_env.registry import TASKS
    from deliberation_env.replay.dataset import ReplayError, ReplaySet

    try:
        dataset = ReplaySet(args.out)
    except ReplayError as error:
        raise UserError(f"--out: {error}") from None
    card = dataset.card
    with user_input("the set's task"):
        task = TASKS.make(card.task, data_dir=args.data_dir, **card.task_kwargs)
    complete = True
    for split, ids in card.splits.items():
        started = time.perf_counter()
        missing = unrecorded(dataset, task, split)
        if missing:
            complete = False
            first = missing[0]
            print(f"{card.name} {split}: requests missing (at least {len(missing)}), the first of problem {first['problem']} "
                  f"(stream {first['stream']}, round {first['round']}): this version of deliberation_env asks for "
                  "requests the set was not recorded with (it was recorded with deliberation-env "
                  f"{card.versions.get('deliberation-env', '?')}); record the set again into a new folder",
                  file=sys.stderr)
        else:
            print(f"{card.name} {split}: every request of {len(ids)} problems' trees is recorded "
                  f"({time.perf_counter() - started:.0f} s)")
    return 0 if complete else 1


def selected(problems: list, args: Any) -> list[tuple[int, Any]]:
    """(position in the split, problem) of the problems to record."""
    if args.problem_ids:
        by_id = {p.id: (i, p) for i, p in enumerate(problems)}
        unknown = [pid for pid in args.problem_ids if pid not in by_id]
        if unknown:
            raise UserError(f"--problem-ids: split {args.split!r} has no problem {unknown[0]!r}")
        return [by_id[pid] for pid in args.problem_ids]
    if args.problems is None:
        return list(enumerate(problems))
    start, sep, end = args.problems.partition(":")
    if not sep or not start.isdigit() or not end.isdigit() or int(start) >= int(end):
        raise UserError(f"--problems must be START:END with START < END, got {args.problems!r}")
    if int(end) > len(problems):
        raise UserError(f"--problems {args.problems}: split {args.split!r} has {len(problems)} problems")
    return [(i, problems[i]) for i in range(int(start), int(end))]


RECORDING_SETTINGS = ("task", "task_kwargs", "settings", "rounds", "streams", "prompt_fingerprint",
                      "confidence_sources", "branch_limit", "request_format", "concede_targets")
"""What a resumed recording must share with the set it adds to (besides the model, checked once it is loaded)."""


def check_same(card: ReplayCard, fresh: ReplayCard, names: tuple[str, ...] = RECORDING_SETTINGS) -> None:
    for name in names:
        if getattr(card, name) != getattr(fresh, name):
            raise UserError(f"--out holds a set recorded with {name}={getattr(card, name)!r}, not "
                            f"{getattr(fresh, name)!r}: record a new set into another folder, or use the set's "
                            "settings (its card.json lists the commands that made it)")


def card_stats(task: Any, card: ReplayCard, out: Path, seconds: float) -> dict[str, Any]:
    """Coverage, tree size per round, round-0 accuracy (of the agents' answers as the env grades them, per level and
    role: ``replay.stats``; and of the solve completions' texts, per level), size on disk and recording time."""
    problems = {p.id: p for split in card.splits for p in task.problems(split) if p.id in set(card.splits[split])}
    per_round: Counter = Counter()
    tokens = 0
    solved: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    count = 0
    records: dict[str, dict[str, Any]] = {}
    for record in read_records(out, card):
        records[record["key"]] = record
        if record["problem"] not in problems:
            continue
        count += 1
        per_round[record["round"]] += 1
        tokens += record["prompt_tokens"] + record["completion_tokens"]
        if record["kind"] == "solve":
            problem = problems[record["problem"]]
            level = str(problem.metadata.get("level", "all"))
            solved[level][0] += bool(task.grade(problem, task.extract_answer(record["text"])))
            solved[level][1] += 1
    n = max(len(problems), 1)
    return {
        "problems": len(problems), "completions": count,
        "coverage": f"all joint actions up to round 1, K={card.branch_limit} sampled after" if card.partial
        else f"every joint action sequence up to round {card.rounds}",
        "requests_per_problem": {str(r): round(per_round[r] / n, 2) for r in sorted(per_round)},
        "tokens_per_problem": round(tokens / n, 1),
        "round0_accuracy": round0_accuracy(task, card, records),
        "solve_accuracy_by_level": {level: {"correct": c, "solves": t, "accuracy": round(c / t, 3)}
                                    for level, (c, t) in sorted(solved.items())},
        "bytes": sum(entry["bytes"] for name, entry in card.files.items() if name.startswith("chunks/")),
        "recording_seconds": round(seconds, 1),
    }


def check_served_model_flags(args: Any) -> None:
    """``--weights-file`` and ``--server-info`` describe a served model: only with a backend that serves one."""
    from deliberation_env.registry import BACKENDS

    if (args.weights_file or args.server_info) and BACKENDS.spec(args.backend).weights != "served":
        raise UserError("--weights-file and --server-info describe a served model (--backend openai); with "
                        f"--backend {args.backend} the card reads the model itself")
    if args.weights_file and not Path(args.weights_file).expanduser().is_file():
        raise UserError(f"--weights-file {args.weights_file}: no such file (name the model file the server loaded)")


def fresh_card(args: Any, out: Path, task: Any, config: DeliberationConfig, chosen: list[tuple[int, Any]]) -> ReplayCard:
    """The card this command would write for a new set (the model is filled in once it is loaded)."""
    return ReplayCard(name=args.name or out.resolve().name, model="", backend="",
                      task=task.name, task_kwargs=dict(args.task_options), settings=settings_of(config),
                      rounds=config.max_rounds, confidence=config.confidence, confidence_sources=list(args.sources),
                      streams=config.streams or 1, prompt_fingerprint=prompt_fingerprint(task),
                      partial=args.branch_limit is not None and config.max_rounds > 1, branch_limit=args.branch_limit,
                      concede_targets=args.concede_targets, sampling=sampling_of(task, config, chosen[0][1]),
                      versions=library_versions())


def describe_model(card: ReplayCard, args: Any, settings: Any, backend: Any) -> None:
    """Fill in what made the set: the loaded model's identity, its weights and the server's description."""
    card.model, card.backend = backend.identity(), f"{type(backend).__name__} ({settings.backend})"
    card.weights = weights_of(settings.backend, settings.model, args.weights_source, args.weights_license,
                              file=args.weights_file)
    if args.server_info:
        card.sampling["server"] = args.server_info


def resumed_card(recorded: ReplayCard, fresh: ReplayCard) -> ReplayCard:
    """The recorded card, checked against this command's model (and weights), with what a migrated set lacks."""
    check_same(recorded, fresh, ("model",))
    if recorded.weights.get("sha256") and fresh.weights.get("sha256") not in (None, recorded.weights["sha256"]):
        raise UserError(f"--model's file has sha256 {fresh.weights['sha256']}, the set was recorded with "
                        f"{recorded.weights['sha256']}: record a new set into another folder")
    for name in ("sampling", "versions"):  # a migrated set may lack them
        if not getattr(recorded, name):
            setattr(recorded, name, getattr(fresh, name))
    if not recorded.weights.get("sha256"):
        recorded.weights = fresh.weights
    return recorded


def chunk_name(split: str, chunk: list[tuple[int, Any]]) -> str:
    """A chunk's file name: its split and the positions of its first and last problem."""
    return f"{split}-{chunk[0][0]:05d}-{chunk[-1][0]:05d}"


def record_chunk(recorder: TreeRecorder, chunk: list[tuple[int, Any]], args: Any, out: Path, card: ReplayCard,
                 records: dict[str, dict[str, Any]], bar: Any) -> Counter:
    """Record one chunk's problems, ``--wave`` at a time, into its partial file, then write its Parquet file and add
    it to the card; returns the unique requests per round."""
    name = chunk_name(args.split, chunk)
    partial = PartialFile(out / "chunks" / f"{name}.partial.jsonl")
    for record in partial.read():
        records[record["key"]] = record
    rounds: Counter = Counter()
    ids = [p.id for _, p in chunk]
    for k in range(0, len(chunk), args.wave):
        wave = [p for _, p in chunk[k:k + args.wave]]
        stats = recorder.record(wave, args.split, partial.append,
                                on_wave=lambda depth, n: bar.set_postfix(round=depth, requests=n))
        for (_, round_), count in stats.requests.items():
            rounds[round_] += count
        bar.update(len(wave))
    chunk_ids = set(ids)
    written = sorted((r for r in records.values() if r["problem"] in chunk_ids and r["split"] == args.split),
                     key=lambda r: (r["problem"], r["stream"], r["round"], r["agent"], r["kind"], r["key"]))
    card.files[f"chunks/{name}.parquet"] = write_chunk(out / "chunks" / f"{name}.parquet", written)
    card.index[f"chunks/{name}.parquet"] = records_per_problem(written, ids)
    partial.remove()
    card.splits[args.split] = [*card.splits.get(args.split, []), *ids]
    return rounds


def write_set_files(card: ReplayCard, task: Any, config: DeliberationConfig, out: Path, split: str,
                    seconds: float) -> None:
    """The split's problems, the card's statistics, the card and its README, after each chunk."""
    card.files[f"problems/{split}.parquet"] = write_problems(
        out / "problems" / f"{split}.parquet", problem_rows(task, split, card.splits[split], config.roles))
    card.stats = card_stats(task, card, out, seconds)
    write_card(out, card)
    (out / "README.md").write_text(card_markdown(card), encoding="utf-8")


@report_user_errors("python -m deliberation_env.record")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.check:
        return check_set(args)
    from deliberation_env.registry import TASKS

    check_served_model_flags(args)
    with user_input("--task"):
        task = TASKS.make(args.task, data_dir=args.data_dir, **args.task_options)
        problems = list(task.problems(args.split))
    chosen = selected(problems, args)
    with user_input("env settings"):
        config = DeliberationConfig(**env_arguments(args, RECORD_FLAGS), **env_options(args))
    out = Path(args.out)
    card_path = out / "card.json"
    with user_input("--out"):
        recorded = ReplayCard.from_json(card_path.read_text(encoding="utf-8"), str(card_path)) if card_path.is_file() else None
    fresh = fresh_card(args, out, task, config, chosen)
    if recorded is not None:
        check_same(recorded, fresh)  # before the early exit: a finished range under other settings is no answer
        if {p.id for _, p in chosen} <= set(recorded.splits.get(args.split, [])):
            # before loading the model: a resumed recording skips its finished ranges in seconds
            print(f"{out}: every chosen problem is already recorded", file=sys.stderr)
            return 0
    settings = backend_settings(args)
    backend = settings.build()
    describe_model(fresh, args, settings, backend)
    card = fresh if recorded is None else resumed_card(recorded, fresh)
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m deliberation_env.record " + shlex.join(sys.argv[1:] if argv is None else argv)
    command = command.replace(str(Path.home()), "~")  # no home folder of the recording machine in the card
    if command not in card.commands:
        card.commands.append(command)
    done = set(card.splits.get(args.split, []))
    # not strict: a chunk written just before a kill, and not yet in the card, is recorded again from its records
    with user_input("--out"):
        records = {r["key"]: r for r in read_records(out, card, strict=False)}
    recorder = TreeRecorder(task, config, backend, rounds=config.max_rounds, confidence_sources=args.sources,
                            records=records, branch_limit=args.branch_limit,
                            all_targets=args.concede_targets == "all")
    todo = [(i, p) for i, p in chosen if p.id not in done]
    from tqdm.auto import tqdm

    bar = tqdm(total=len(todo), unit="problem", desc=f"recording {card.name}", dynamic_ncols=True)
    seconds = card.stats.get("recording_seconds", 0.0)
    for chunk in (todo[k:k + args.chunk] for k in range(0, len(todo), args.chunk)):
        started = time.perf_counter()
        rounds = record_chunk(recorder, chunk, args, out, card, records, bar)
        seconds += time.perf_counter() - started
        write_set_files(card, task, config, out, args.split, seconds)
        tree = ", ".join(f"round {r}: {rounds[r] / len(chunk):.1f}" for r in sorted(rounds))
        bar.write(f"chunk {chunk_name(args.split, chunk)}: {len(chunk)} problems, unique requests per problem {tree}, "
                  f"{time.perf_counter() - started:.0f} s")
    bar.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
