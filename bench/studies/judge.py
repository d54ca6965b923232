"""Judge baseline: the recording model itself picks one of its agents' round-0 solutions (LLM-as-judge aggregation).

    python bench/studies/judge.py run --start-server ~/.cache/deliberation-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \\
        --threads 2 --commit                                       # every set x split, chunk after chunk
    python bench/studies/judge.py run --backend openai --base-url http://127.0.0.1:8089/v1 --model NAME
    python bench/studies/judge.py report                           # the CSVs and the report from the chunks

For each problem of a replay set's split (the problems ``deliberation_env.replay`` lists for it at run time), the
three agents' round-0 solutions of stream 0 are taken from a ``replay_env`` reset on that problem, as the env's round
0 sees them (their text, parsed answer, correctness and round-0 tokens: solves and critics). The model is shown the
question and the three solutions, numbered in the agents' order, and asked for the number of the one to keep
(``JUDGE_SYSTEM``, ``JUDGE_PROMPT``: the one place the prompt is written; temperature 0, ``MAX_TOKENS``). The team's
answer is the kept solution's; where the reply names no solution (``parse_choice``), the plurality vote of the three
answers (self_consistency's answer: the round-0 consensus) is kept instead, and counted as a fallback. The solutions
are never permuted: the report measures the order bias (how often each position is kept against how often it is
right).

``run`` plays the problems ``--chunk`` at a time; each finished chunk is a JSON file under ``<out>/chunks/<set>-<split>/``
(the replies, not the verdicts, so that the parse can be read again), committed with ``--commit``; a rerun plays only
the problems no chunk holds, so a killed run loses at most the chunk in progress. A chunk made with another prompt or
model is refused. Then (and with ``report``) each set and split's per-problem outcomes are written as
``baselines.benchmark.Scores`` (label ``judge``, cell: the set, as the outcome is the same in every game of it;
tokens: the episode's round-0 tokens plus the judge call's prompt and completion) to ``<out>/<set>-<split>.csv``, and
the report to ``<out>.md``: accuracy with a 95% bootstrap interval over problems, tokens, the fallback rate, the
position bias, and the paired difference to self_consistency on the same problems.

``--start-server GGUF`` serves the file with llama-cpp-python's server (``deliberation_env.testing.llama_server``) for
the run, after checking its sha256 against the sets' cards: llama-cpp-python 0.3.36 vendors llama.cpp 0c1e570, the
build the sets were recorded with, and both read the chat template from the file. It answers one request at a time
(the judge sends one call per problem). Its sampler defaults differ from the recording server's (the backend sends
temperature and top_p only): top-k 40 and min-p 0.05 leave a greedy choice alone, and its repeat penalty 1.1 counts
generated tokens only, so it cannot touch a reply's first token (the replies measured were one token long).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

from baselines.benchmark import Scores, loaded
from baselines.evaluation.evaluate import play_episodes
from bench.common.results import RESULTS, command_line
from deliberation_env.analysis.metrics import bootstrap_interval, paired_bootstrap
from deliberation_env.chat import Message
from deliberation_env.cli import ArgumentParser, UserError, add_backend_arguments, backend_settings
from deliberation_env.make import replay_env
from deliberation_env.protocols import make_protocol
from deliberation_env.replay import ReplayError, shipped
from deliberation_env.requests import Request

SETS = ("qwen05-arith-v2", "qwen05-team-arith")
SPLITS = ("validation", "test")
OUT = os.path.join(RESULTS, "judge")
LABEL = "judge"

JUDGE_SYSTEM = "You are a careful math assistant."
"""The arithmetic task's own system prompt, the one the agents solved under."""
JUDGE_PROMPT = ("Problem: {question}\n\n"
                "Here are {count} candidate solutions to the problem.\n\n"
                "{solutions}\n\n"
                "Which solution is correct? Reply with the number of the solution to keep ({numbers}) and nothing "
                "else.")
SOLUTION = "### Solution {index}\n{text}"
MAX_TOKENS = 16
TEMPERATURE = 0.0


def judge_messages(question: str, texts: Sequence[str]) -> tuple[Message, ...]:
    """The judge's chat: the question and the solutions, numbered from 1 in the agents' order."""
    numbers = [str(i + 1) for i in range(len(texts))]
    shown = "\n\n".join(SOLUTION.format(index=n, text=t.strip()) for n, t in zip(numbers, texts))
    user = JUDGE_PROMPT.format(question=question, count=len(texts), solutions=shown,
                               numbers=", ".join(numbers[:-1]) + " or " + numbers[-1])
    return Message("system", JUDGE_SYSTEM), Message("user", user)


def fingerprint() -> str:
    """What makes two judge calls the same call: the prompt and the sampling (a chunk's record of it)."""
    text = json.dumps([JUDGE_SYSTEM, JUDGE_PROMPT, SOLUTION, MAX_TOKENS, TEMPERATURE])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


_ORDINALS = {"first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5}


def parse_choice(reply: str, count: int) -> int | None:
    """The solution a reply keeps (0-based), or None where it names none of 1..``count`` or several different ones.

    A reply that is a number alone (markdown and punctuation aside) names it; otherwise the solutions it names as
    "solution N" (or "#N", "the Nth"), and failing those its free-standing numbers in 1..count, must all be one."""
    text = reply.strip().lower()
    bare = re.fullmatch(r"[\s*_`#(\[]*(\d+)[\s*_`.)\]:]*", text)
    if bare:
        number = int(bare.group(1))
        return number - 1 if 1 <= number <= count else None
    named = [int(n) for n in re.findall(r"solution\s*(?:number\s*|no\.?\s*|#\s*)?(\d+)(?![.,]?\d)", text)]
    named += [int(n) for n in re.findall(r"#\s*(\d+)(?![.,]?\d)", text)]
    named += [_ORDINALS[w] for w in re.findall(r"\b(" + "|".join(_ORDINALS) + r")\b", text)]
    if not named:
        named = [int(n) for n in re.findall(r"(?<![\d.,])(\d+)(?![\d.,]*\d)", text)]
        named = [n for n in named if 1 <= n <= count]
    distinct = set(named)
    if len(distinct) != 1:
        return None
    (number,) = distinct
    return number - 1 if 1 <= number <= count else None


# ----------------------------------------------------------------------------- the round 0 of a problem
def round0(env: Any, index: int) -> dict[str, Any]:
    """Problem ``index`` of the env's split reset on stream 0: its question and each agent's solution, answer and
    correctness, the round-0 consensus (the plurality vote) and the round's tokens (solves and critics)."""
    _, infos = env.reset(seed=0, options={"problem_index": index})
    core = env.deliberation
    first = next(iter(infos.values()))
    return {"problem_id": core.problem.id, "question": core.problem.question,
            "texts": [agent.text for agent in core.agents], "answers": [agent.answer for agent in core.agents],
            "correct": [bool(agent.correct) for agent in core.agents], "consensus": first["consensus"],
            "consensus_correct": bool(first["consensus_correct"]),
            "round0_tokens": int(sum(info["tokens"] for info in infos.values()))}


# ----------------------------------------------------------------------------- chunks
def chunk_folder(out: str, name: str, split: str) -> str:
    return os.path.join(out, "chunks", f"{name}-{split}")


def read_chunks(folder: str) -> list[dict[str, Any]]:
    """Every finished chunk in ``folder`` (a ``.partial`` file is a chunk that did not finish: ignored)."""
    chunks = []
    for path in sorted(glob.glob(os.path.join(folder, "chunk-*.json"))):
        with open(path, encoding="utf-8") as f:
            chunks.append({**json.load(f), "path": path})
    return chunks


def recorded(folder: str, model: str | None = None) -> dict[str, dict[str, Any]]:
    """The records of the chunks in ``folder`` by problem id; SystemExit for a chunk made with another prompt or (when
    ``model`` is given) another model than this run's."""
    records: dict[str, dict[str, Any]] = {}
    for chunk in read_chunks(folder):
        if chunk["judge"] != fingerprint():
            sys.exit(f"{chunk['path']} was made with another judge prompt or sampling (fingerprint {chunk['judge']}, "
                     f"this script's is {fingerprint()}): delete {folder} to play it again")
        if model is not None and chunk["model"] != model:
            sys.exit(f"{chunk['path']} was judged by {chunk['model']!r}, this run by {model!r}: serve the same model "
                     f"or delete {folder}")
        for record in chunk["records"]:
            records[record["problem_id"]] = {**record, "model": chunk["model"], "command": chunk["command"]}
    return records


def write_chunk(folder: str, positions: Sequence[int], records: list[dict], model: str, commit: bool) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"chunk-{positions[0]:04d}-{positions[-1]:04d}.json")
    document = {"judge": fingerprint(), "model": model, "command": command_line(),
                "made": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "records": records}
    with open(path + ".partial", "w", encoding="utf-8") as f:
        json.dump(document, f, indent=1)
    os.replace(path + ".partial", path)
    if commit:
        subprocess.run(["git", "add", path], check=True)
        subprocess.run(["git", "commit", "-q", "-m", f"judge: {os.path.basename(folder)} problems "
                        f"{positions[0]}-{positions[-1]}", "--", path], check=True)
    return path


def judge(backend: Any, problem: dict[str, Any]) -> dict[str, Any]:
    """One judge call on a problem's round 0: the reply, its tokens and how long it took."""
    request = Request(judge_messages(problem["question"], problem["texts"]), kind=LABEL, agent=0, seed=0,
                      max_tokens=MAX_TOKENS, temperature=TEMPERATURE, problem=problem["problem_id"])
    began = time.perf_counter()
    (completion,) = backend.generate([request])
    seconds = time.perf_counter() - began
    kept = {key: problem[key] for key in ("problem_id", "answers", "correct", "consensus", "consensus_correct",
                                          "round0_tokens")}
    return {**kept, "reply": completion.text, "finish_reason": completion.finish_reason,
            "prompt_tokens": completion.prompt_tokens, "completion_tokens": completion.completion_tokens,
            "cached": completion.cached, "seconds": round(seconds, 3)}


def play(backend: Any, model: str, name: str, split: str, args: Any) -> None:
    """Judge every problem of the set's split that no chunk holds yet, ``args.chunk`` at a time."""
    env = replay_env(loaded(name), split)
    ids = [p.id for p in env.problems]
    folder = chunk_folder(args.out, name, split)
    done = recorded(folder, model)
    stale = sorted(set(done) - set(ids))
    if stale:
        print(f"{name} {split}: {len(stale)} judged problems are not in the split now: left out", flush=True)
    limit = len(ids) if args.limit is None else min(args.limit, len(ids))
    todo = [i for i in range(limit) if ids[i] not in done]
    for start in range(0, len(todo), args.chunk):
        positions = todo[start:start + args.chunk]
        began = time.perf_counter()
        records = [judge(backend, round0(env, i)) for i in positions]
        path = write_chunk(folder, positions, records, model, args.commit)
        print(f"{name} {split}: wrote {path} ({len(records)} problems, {time.perf_counter() - began:.0f} s)",
              flush=True)


# ----------------------------------------------------------------------------- scores and report
def outcome(record: dict[str, Any]) -> tuple[int | None, bool]:
    """(the kept solution or None for the fallback, whether the team's answer is right)."""
    choice = parse_choice(record["reply"], len(record["answers"]))
    if choice is None:
        return None, bool(record["consensus_correct"])
    return choice, bool(record["correct"][choice])


def scores(name: str, env: Any, records: dict[str, dict[str, Any]]) -> tuple[Scores, list[dict[str, Any]]]:
    """The judge's ``Scores`` on the judged problems of ``env``'s split (in the split's order) and their records."""
    rows = [{**records[p.id], "set": name} for p in env.problems if p.id in records]
    accuracy = np.array([float(outcome(r)[1]) for r in rows])
    tokens = np.array([float(r["round0_tokens"] + r["prompt_tokens"] + r["completion_tokens"]) for r in rows])
    return Scores(LABEL, name, env.split, [r["problem_id"] for r in rows], accuracy, tokens), rows


def self_consistency(env: Any, rows: list[dict]) -> Scores:
    """self_consistency played (as ``baselines.benchmark`` plays the protocols: reset seed 0) on the judged problems of
    ``env``'s split; SystemExit unless it is right exactly where the judged round-0 consensus is (the fallback's
    answer is its answer)."""
    where = {p.id: k for k, p in enumerate(env.problems)}
    ids = [r["problem_id"] for r in rows]
    played = play_episodes([env], [make_protocol("self_consistency")], [(0, where[pid]) for pid in ids])
    sc = Scores("self_consistency", rows[0]["set"], env.split, ids, np.array([float(p["correct"]) for p in played]),
                np.array([float(p["tokens"]) for p in played]))
    differ = sum(float(r["consensus_correct"]) != a for r, a in zip(rows, sc.accuracy))
    if differ:
        sys.exit(f"{sc.cell} {env.split}: self_consistency's outcome differs from the judged round-0 consensus on "
                 f"{differ} problems: the chunks were not made from this set's round 0")
    return sc


def interval(values: np.ndarray) -> str:
    low, high = bootstrap_interval(values)
    return f"{values.mean():.3f} [{low:.3f}, {high:.3f}]"


def section(name: str, split: str, judged: Scores, rows: list[dict], sc: Scores, total: int) -> tuple[str, list[str]]:
    """The summary table's row and the position-bias rows of one set and split."""
    count = len(rows[0]["answers"])
    choices = [outcome(r)[0] for r in rows]
    fallbacks = sum(c is None for c in choices)
    right = np.array([r["correct"] for r in rows], float)
    diff, low, high = paired_bootstrap(judged.accuracy, sc.accuracy)
    judge_tokens = np.mean([r["prompt_tokens"] + r["completion_tokens"] for r in rows])
    seconds = np.mean([r["seconds"] for r in rows if not r["cached"]] or [float("nan")])
    row = (f"| {name} | {split} | {len(rows)} / {total} | {interval(judged.accuracy)} | {sc.accuracy.mean():.3f} | "
           f"{100 * diff:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}] | {judged.tokens.mean():.0f} | "
           f"{sc.tokens.mean():.0f} | {judge_tokens:.0f} | {fallbacks} ({fallbacks / len(rows):.1%}) | "
           f"{right.any(1).mean():.3f} | {right.mean():.3f} | {seconds:.1f} |")
    parsed = [c for c in choices if c is not None]
    bias = []
    for k in range(count):
        kept = [i for i, c in enumerate(choices) if c == k]
        share = len(kept) / len(parsed) if parsed else float("nan")
        when_kept = f"{right[kept, k].mean():.3f}" if kept else "-"
        bias.append(f"| {name} | {split} | {k + 1} | {share:.3f} ({len(kept)}) | {right[:, k].mean():.3f} | "
                    f"{when_kept} |")
    return row, bias


def report(args: Any) -> str:
    """Each set and split's Scores CSV from its chunks, and the report (``<out>.md``)."""
    summary, bias, commands, models, sections = [], [], set(), set(), 0
    for name in args.sets:
        for split in args.splits:
            records = recorded(chunk_folder(args.out, name, split))
            if not records:
                continue
            env = replay_env(loaded(name), split)
            judged, rows = scores(name, env, records)
            if not rows:
                continue
            path = judged.save(os.path.join(args.out, f"{name}-{split}.csv"))
            print(f"wrote {path}", flush=True)
            row, positions = section(name, split, judged, rows, self_consistency(env, rows), len(env.problems))
            summary.append(row)
            bias += positions
            commands |= {r["command"] for r in rows}
            models |= {r["model"] for r in rows}
            sections += 1
    if not sections:
        sys.exit(f"no judged problem under {os.path.join(args.out, 'chunks')}: run `python bench/studies/judge.py run "
                 "...` first")
    example = judge_messages("{question}", ["{solution 1}", "{solution 2}", "{solution 3}"])
    lines = ["# Judge baseline: the recording model keeps one of its agents' round-0 solutions", "",
             f"Report: `{command_line()}`; chunks played by " + "; ".join(f"`{c}`" for c in sorted(commands)) + ".",
             "", f"Judge model: {', '.join(sorted(models))}. Temperature {TEMPERATURE:g}, max_tokens {MAX_TOKENS}, "
             f"the solutions in the agents' order (never permuted). The prompt (bench/studies/judge.py, "
             f"`judge_messages`; fingerprint {fingerprint()}):", "",
             "```text", *(f"[{m.role}] {m.content}" for m in example), "```", "",
             "Accuracy with a 95% bootstrap interval over problems; judge - sc: the paired difference to "
             "self_consistency (the plurality vote of the same round-0 answers) in points, with its interval; "
             "tokens per problem: the round 0's (solves and critics) plus, for the judge, its call; fallback: "
             "replies that named no single solution, where the plurality answer was kept; any right: problems with "
             "at least one right solution (a judge's ceiling); blind pick: a uniformly random solution's accuracy; "
             "s / call: seconds per judge call (uncached).", "",
             "| set | split | problems | judge accuracy | self_consistency | judge - sc | judge tokens | sc tokens "
             "| judge call tokens | fallback | any right | blind pick | s / call |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|", *summary, "",
             "Position bias: how often the judge keeps each position (share of the replies that named one, and "
             "count), how often that position's solution is right, and how often it is right when kept. A judge "
             "that always keeps solution 1 scores position 1's right share: agent 0's answer, the `single` "
             "protocol's.", "",
             "| set | split | position | kept | right | right when kept |", "|---|---|---|---|---|---|", *bias, ""]
    text = "\n".join(lines)
    path = args.out.rstrip(os.sep) + ".md"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
    return path


# ----------------------------------------------------------------------------- command line
def check_weights(gguf: str, names: Sequence[str]) -> None:
    """SystemExit unless ``gguf`` is the file every set was recorded with (the card's sha256)."""
    if not os.path.isfile(gguf):
        sys.exit(f"judge.py: no file {gguf}: --start-server takes the sets' GGUF ({loaded(names[0]).card.weights.get('file')}, "
                 f"from {loaded(names[0]).card.weights.get('source')})")
    with open(gguf, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    for name in names:
        recorded_sha = loaded(name).card.weights.get("sha256")
        if recorded_sha != digest:
            sys.exit(f"{gguf} (sha256 {digest[:12]}...) is not the model {name} was recorded with "
                     f"({loaded(name).card.weights.get('file')}, sha256 {str(recorded_sha)[:12]}...)")


def run(args: Any) -> None:
    for name in args.sets:
        for split in args.splits:
            try:
                replay_env(loaded(name), split)
            except ReplayError as error:
                sys.exit(f"judge.py: {' '.join(str(error).split())}")
    with contextlib.ExitStack() as stack:
        if args.start_server:
            from deliberation_env.testing.llama_server import llama_server

            check_weights(args.start_server, args.sets)
            args.backend, args.base_url = "openai", [stack.enter_context(
                llama_server(args.start_server, threads=args.threads, n_ctx=args.n_ctx))]
            args.model = f"{Path(args.start_server).stem}@llama-cpp-python-{metadata.version('llama-cpp-python')}"
        try:
            backend = backend_settings(args).build()
        except UserError as error:
            sys.exit(f"judge.py: {error}")
        stack.callback(getattr(backend, "close", lambda: None))
        model = backend.identity()
        for name in args.sets:
            for split in args.splits:
                play(backend, model, name, split, args)
    report(args)


def main(argv: Sequence[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    played = commands.add_parser("run", help="judge the problems no chunk holds yet, then write the CSVs and report")
    played.add_argument("--start-server", metavar="GGUF",
                        help="serve this GGUF with llama-cpp-python's server for the run (it must be the sets' model)")
    played.add_argument("--threads", type=int, default=1, help="the started server's CPU threads")
    played.add_argument("--n-ctx", type=int, default=4096, help="the started server's context length")
    played.add_argument("--chunk", type=int, default=25, help="problems per chunk file")
    played.add_argument("--limit", type=int, help="judge only the first N problems of each split (a dev run)")
    played.add_argument("--commit", action="store_true", help="git commit each finished chunk")
    add_backend_arguments(played, backend_default="openai")
    shown = commands.add_parser("report", help="the CSVs and the report from the finished chunks")
    for sub in (played, shown):
        sub.add_argument("--sets", nargs="+", default=list(SETS), choices=shipped())
        sub.add_argument("--splits", nargs="+", default=list(SPLITS))
        sub.add_argument("--out", default=OUT, help="the results folder (chunks, CSVs; the report is <out>.md)")
    args = parser.parse_args(argv)
    if args.command == "run":
        if min(args.chunk, args.threads, args.limit or 1) < 1:
            parser.error("--chunk, --threads and --limit must be >= 1")
        run(args)
    else:
        report(args)


if __name__ == "__main__":
    main()
