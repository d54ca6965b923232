"""Live check: do the leaderboard's replay-trained policies gain live what they gain on replay?

    python bench/studies/live_check.py plan                      # once, before any live completion (committed)
    source bench/record/llama_server.sh && serve_gguf ~/.cache/deliberation-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
    python bench/studies/live_check.py run "${RECORD_FLAGS[@]:0:8}" --cache runs/live-check.sqlite --commit
    python bench/studies/live_check.py report

``plan`` names the rows before anything is played live (bench/results/live_check/plan.json): the best protocol
chosen on validation, the headline trainer chosen on validation and the trainer the replay issue named, each with
every seed of its leaderboard row (checkpoints copied beside the plan, with their sha256), and the problems:
test problems outside the recording (the arithmetic test split extended past its 500 with ``num_problems``: the
first 500 stay what they are, the rest are new draws of the same generator, disjoint from train). It checks
that each checkpoint, played on the replay's test split through the same actor code as live, gives the
leaderboard's per-problem outcomes.

``run`` first checks that the live env, answered by the replay backend, gives the leaderboard's outcomes (the same
game, bar the samples); then it plays every row on a chunk of problems at a time, all rows in one wave (their round-0 requests are the
same, so the cache answers them once, and the server batches every row's round-1 requests together), with the
set's own settings (env_settings of its card, the cell's game) through the backend flags (the recording's own
server: bench/record/llama_server.sh). Each finished chunk is written to its CSV (and committed with
``--commit``); a rerun skips finished chunks and the SQLite cache keeps an interrupted chunk's completions.

``report`` compares each trainer's live gain over the protocol with its replay gain (the suite's committed
per-problem test outcomes): hierarchical bootstrap over the seeds and, paired, the problems; the live - replay
difference resamples the seeds once for both sides and each side's problems on their own.
"""

from __future__ import annotations

import csv
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
from _results import RESULTS, command_line, write_report
from _suite import choices, read

from baselines.benchmark import loaded, parse_cell
from baselines.evaluation.evaluate import episode_seed, play_episodes
from baselines.meta.evaluate import PolicyActor
from baselines.meta.policy import load_policy
from deliberation_env.analysis.metrics import hierarchical_bootstrap
from deliberation_env.cli import ArgumentParser, add_backend_arguments, backend_settings
from deliberation_env.env import DeliberationEnv
from deliberation_env.protocols import make_protocol
from deliberation_env.replay import ReplayBackend, env_settings

OUT = os.path.join(RESULTS, "live_check")
SUITE = os.path.join(RESULTS, "benchmark_suite")
PLAN = os.path.join(OUT, "plan.json")


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def suite_outcomes(cell: str, label: str, seed: int | None = None) -> tuple[list[str], np.ndarray]:
    """The suite's committed per-problem test outcomes of a protocol (seed None) or of one final run."""
    folder = os.path.join(SUITE, cell.replace(":", "-"))
    pattern = f"protocols/{label}-test.csv" if seed is None else f"{label}/final-*-seed{seed}-test.csv"
    (path,) = glob.glob(os.path.join(folder, pattern))
    with open(path, encoding="utf-8") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    return [r["problem_id"] for r in rows], np.array([float(r["accuracy"]) for r in rows])


def live_env(card, options: dict, num_problems: int, backend) -> DeliberationEnv:
    settings = env_settings(card)
    settings["task_kwargs"] = {**settings["task_kwargs"], "num_problems": num_problems}
    return DeliberationEnv(backend=backend, split="test", **settings, **options)


def plan(args) -> None:
    if os.path.exists(PLAN):
        sys.exit(f"{PLAN} exists: the plan is fixed once made (delete it only to start a new check)")
    cell = parse_cell(args.cell)
    best, ordered = choices(read(os.path.join(SUITE, cell.name.replace(":", "-"))))
    rows: list[dict] = [{"label": best, "kind": "protocol"}]
    os.makedirs(os.path.join(OUT, "policies"), exist_ok=True)
    for trainer in dict.fromkeys([ordered[0][0], *args.also]):
        for source in sorted(glob.glob(os.path.join(args.runs, cell.name.replace(":", "-"), trainer, "final-*",
                                                   "policy.pt"))):
            run = os.path.basename(os.path.dirname(source))
            seed = int(run.rsplit("seed", 1)[1])
            target = os.path.join(OUT, "policies", f"{trainer}-{run}.pt")
            shutil.copyfile(source, target)
            rows.append({"label": trainer, "kind": "policy", "seed": seed, "run": run,
                         "checkpoint": os.path.relpath(target, OUT), "sha256": sha256(target)})
    dataset = loaded(cell.dataset)
    recorded = sorted(int(p.rsplit("-", 1)[1]) for p in dataset.card.splits["test"])
    first, last = args.problems
    if first <= recorded[-1]:
        sys.exit(f"--problems starts at {first}, inside the recorded test problems (0..{recorded[-1]})")
    check_replay(cell, rows)
    document = {"cell": cell.name, "model": dataset.card.model, "problems": [first, last], "chunk": args.chunk,
                "num_problems": last, "episode_seed": "episode_seed(0, problem_index)", "rows": rows,
                "chosen_on": "validation (bench/results/benchmark_suite.md), before any live completion",
                "made": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": command_line()}
    with open(PLAN, "w", encoding="utf-8") as f:
        json.dump(document, f, indent=1)
    print(f"wrote {PLAN}: {len(rows)} rows, test problems {first}-{last - 1}")


def actor(row: dict):
    if row["kind"] == "protocol":
        return make_protocol(row["label"])
    return PolicyActor(load_policy(os.path.join(OUT, row["checkpoint"])))


def differences(env, cell, row: dict, problems: int) -> int:
    """On how many of the first ``problems`` test problems ``env`` played by a policy row departs from the row's
    leaderboard outcomes (the suite's committed per-problem scores)."""
    records = play_episodes([env], [actor(row)], [(episode_seed(0, i), i) for i in range(problems)])
    played = np.array([float(r["correct"]) for r in records])
    return int((played != suite_outcomes(cell.name, row["label"], row["seed"])[1]).sum())


def check_replay(cell, rows: list[dict]) -> None:
    """Each policy row played on the replay's test split through the live code path gives the suite's outcomes."""
    env = cell.env("test")
    problems = len(env.problems)
    for row in rows:
        if row["kind"] == "policy" and (departed := differences(env, cell, row, problems)):
            sys.exit(f"{row['label']} {row['run']}: played on replay it differs from the suite's outcomes on "
                     f"{departed} problems: not the leaderboard's policy")
    print(f"checked: every policy row reproduces its leaderboard outcomes on the {problems} replayed test problems")


def read_plan() -> dict:
    with open(PLAN, encoding="utf-8") as f:
        return json.load(f)


def check_live_env(document: dict) -> None:
    """The live env (the set's settings, the cell's game, the extended split), answered by the replay backend, gives
    a policy row's leaderboard outcomes on the recorded test problems: the live game is the replay's, bar samples."""
    cell = parse_cell(document["cell"])
    dataset = loaded(cell.dataset)
    env = live_env(dataset.card, cell.options, document["num_problems"], ReplayBackend(dataset))
    row = next(row for row in document["rows"] if row["kind"] == "policy")
    if differences(env, cell, row, len(dataset.card.splits["test"])):
        sys.exit("the live env answered by the replay backend does not give the leaderboard's outcomes: it plays "
                 "another game than the cell's")


def chunk_path(first: int, last: int) -> str:
    return os.path.join(OUT, f"chunk-{first:04d}-{last - 1:04d}.csv")


def run(args) -> None:
    document = read_plan()
    check_live_env(document)
    cell = parse_cell(document["cell"])
    card = loaded(cell.dataset).card
    backend = backend_settings(args).build()
    if document["model"] not in backend.identity():
        sys.exit(f"the backend is {backend.identity()!r}, not the recording's {document['model']!r}: serve the "
                 "set's own build (bench/record/llama_server.sh)")
    rows = document["rows"]
    actors = [actor(row) for row in rows]
    first, last = document["problems"]
    size = document["chunk"]
    envs: list[DeliberationEnv] = []
    for start in range(first, last, size):
        stop = min(start + size, last)
        path = chunk_path(start, stop)
        if os.path.exists(path):
            continue
        problems = range(start, stop)
        while len(envs) < len(rows) * len(problems):
            envs.append(live_env(card, cell.options, document["num_problems"], backend))
        began = time.perf_counter()
        episodes = [(episode_seed(0, i), i) for _ in rows for i in problems]
        slots = [a for a in actors for _ in problems]
        records = play_episodes(envs[: len(episodes)], slots, episodes, progress=f"live {start}-{stop - 1}")
        with open(path + ".partial", "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["label", "seed", "problem_index", "correct", "tokens", "actions"])
            for k, record in enumerate(records):
                row, index = rows[k // len(problems)], problems[k % len(problems)]
                actions = ",".join(f"{a}:{n}" for a, n in sorted(record["actions"].items()))
                writer.writerow([row["label"], row.get("seed", ""), index, int(bool(record["correct"])),
                                 record["tokens"], actions])
        os.replace(path + ".partial", path)
        print(f"chunk {start}-{stop - 1}: {time.perf_counter() - began:.0f} s", flush=True)
        if args.commit:
            subprocess.run(["git", "add", path], check=True)
            subprocess.run(["git", "commit", "-q", "-m", f"live check: test problems {start}-{stop - 1}", "--", path],
                           check=True)


def live_outcomes() -> dict[tuple[str, int | None], dict[int, float]]:
    outcomes: dict[tuple[str, int | None], dict[int, float]] = {}
    for path in sorted(glob.glob(os.path.join(OUT, "chunk-*.csv"))):
        with open(path, encoding="utf-8") as f:
            for r in csv.DictReader(f):
                key = (r["label"], int(r["seed"]) if r["seed"] else None)
                outcomes.setdefault(key, {})[int(r["problem_index"])] = float(r["correct"])
    return outcomes


def gap_interval(live: np.ndarray, replay: np.ndarray, resamples: int = 4000, level: float = 0.95
                 ) -> tuple[float, float, float]:
    """(live gain - replay gain) and its interval; ``live``/``replay``: per-seed x per-problem differences to the
    protocol (the same seeds in both rows); seeds drawn once for both sides, each side's problems on their own."""
    rng = np.random.default_rng(0)
    values = np.empty(resamples)
    for b in range(resamples):
        seeds = rng.integers(0, len(live), len(live))
        sides = []
        for table in (live, replay):
            columns = rng.integers(0, table.shape[1], table.shape[1])
            sides.append(table[seeds][:, columns].mean())
        values[b] = sides[0] - sides[1]
    tail = 50.0 * (1.0 - level)
    return (float(live.mean() - replay.mean()), float(np.percentile(values, tail)),
            float(np.percentile(values, 100 - tail)))


def report(args) -> None:
    document = read_plan()
    cell = document["cell"]
    live = live_outcomes()
    protocol = document["rows"][0]["label"]
    done = sorted(live.get((protocol, None), {}))
    if not done:
        sys.exit("no live chunk yet: run `python bench/studies/live_check.py run ...` first")
    _, replay_protocol = suite_outcomes(cell, protocol)
    base = np.array([live[(protocol, None)][i] for i in done])
    lines = [f"# Live check: {cell}", "", f"`{command_line()}`", "",
             f"Rows named in [plan.json](live_check/plan.json) on validation before any live completion. Live: "
             f"{len(done)} test problems outside the recording ({done[0]}-{done[-1]} of the planned "
             f"{document['problems'][0]}-{document['problems'][1] - 1}), through {document['model']}; replay: the "
             f"{len(replay_protocol)} recorded test problems (the suite's outcomes). Differences in points to "
             f"{protocol} with 95% intervals: hierarchical bootstrap over the seeds and, paired, the problems; live - "
             "replay resamples the seeds once for both sides.", "",
             "| row | seeds | replay accuracy | live accuracy | replay gain | live gain | live - replay |",
             "|---|---|---|---|---|---|---|",
             f"| {protocol} | - | {replay_protocol.mean():.3f} | {base.mean():.3f} | - | - | - |"]
    for label in dict.fromkeys(row["label"] for row in document["rows"][1:]):
        seeds = sorted(seed for (name, seed) in live if name == label)
        live_table = np.array([[live[(label, s)][i] for i in done] for s in seeds])
        replay_table = np.array([suite_outcomes(cell, label, s)[1] for s in seeds])
        live_gain = hierarchical_bootstrap([live_table, base], [1, -1])
        replay_gain = hierarchical_bootstrap([replay_table, replay_protocol], [1, -1])
        gap = gap_interval(live_table - base, replay_table - replay_protocol)
        lines.append(f"| {label} | {len(seeds)} | {replay_table.mean():.3f} | {live_table.mean():.3f} | "
                     + " | ".join(f"{100 * e:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"
                                  for e, lo, hi in (replay_gain, live_gain, gap)) + " |")
    text = "\n".join(lines) + "\n"
    write_report("live_check", text)


def main(argv=None) -> None:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    made = commands.add_parser("plan", help="name the rows and problems (once, before any live completion)")
    made.add_argument("--cell", default="qwen05-arith-v2:v2")
    made.add_argument("--also", nargs="*", default=["softrankpo"], help="trainers beyond the validation headline")
    made.add_argument("--runs", default=os.path.join("runs", "benchmark_suite"), help="the suite's trained runs")
    made.add_argument("--problems", type=lambda t: tuple(int(v) for v in t.split(":")), default=(500, 900))
    made.add_argument("--chunk", type=int, default=20)
    played = commands.add_parser("run", help="play the planned rows live, chunk after chunk")
    played.add_argument("--commit", action="store_true", help="git commit each finished chunk's CSV")
    add_backend_arguments(played, backend_default="openai")
    commands.add_parser("report", help="the live vs replay table from the finished chunks")
    args = parser.parse_args(argv)
    {"plan": plan, "run": run, "report": report}[args.command](args)


if __name__ == "__main__":
    main()
