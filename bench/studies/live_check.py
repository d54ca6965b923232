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

``plan --amend`` adds, in ``live_check/amendment/``, the row the leaderboard headlines when it is not a row of the
first plan (chosen on validation across cells after that plan was made: ``suite.headline``), with its cell's best
protocol, on the same problems; ``run --amendment`` plays it (the same cache answers the round-0 requests the two
games share) and ``report`` gives its table below the first.

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
from pathlib import Path

import numpy as np

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

from baselines.benchmark import Scores, loaded, parse_cell, shipped_cells
from baselines.evaluation.evaluate import episode_seed, play_episodes
from baselines.meta.evaluate import PolicyActor
from baselines.meta.policy import load_policy
from bench.common.results import RESULTS, command_line, write_report
from bench.common.suite import choices, folder_name, headline, read
from deliberation_env.analysis.metrics import hierarchical_bootstrap
from deliberation_env.cli import ArgumentParser, add_backend_arguments, backend_settings
from deliberation_env.env import DeliberationEnv
from deliberation_env.protocols import make_protocol
from deliberation_env.replay import ReplayBackend, env_settings

OUT = os.path.join(RESULTS, "live_check")
SUITE = os.path.join(RESULTS, "benchmark_suite")
AMENDMENT = os.path.join(OUT, "amendment")


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def suite_outcomes(cell: str, label: str, seed: int | None = None) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The suite's committed per-problem test outcomes (problem ids, accuracy, tokens) of a protocol (seed None) or of
    one final run."""
    folder = os.path.join(SUITE, folder_name(parse_cell(cell)))
    pattern = f"protocols/{label}-test.csv" if seed is None else f"{label}/final-*-seed{seed}-test.csv"
    (path,) = glob.glob(os.path.join(folder, pattern))
    scores = Scores.load(path)
    return scores.problem_ids, scores.accuracy, scores.tokens


def live_env(card, options: dict, num_problems: int, backend) -> DeliberationEnv:
    settings = env_settings(card)
    settings["task_kwargs"] = {**settings["task_kwargs"], "num_problems": num_problems}
    return DeliberationEnv(backend=backend, split="test", **settings, **options)


def plan(args) -> None:
    folder = AMENDMENT if args.amend else OUT
    path = os.path.join(folder, "plan.json")
    if os.path.exists(path):
        sys.exit(f"{path} exists: the plan is fixed once made (delete it only to start a new check)")
    if args.amend:
        first = read_plan(OUT)
        found = [(cell, read(os.path.join(SUITE, folder_name(cell)))) for cell in shipped_cells()]
        cell, trainer = headline([(cell, f) for cell, f in found if f["trainers"]])
        if (cell.name, trainer) in {(first["cell"], row["label"]) for row in first["rows"]}:
            sys.exit(f"the leaderboard's row to headline ({trainer} on {cell.name}) is in the first plan: "
                     "nothing to add")
        best, _ = choices(dict(found)[cell])
        trainers, (start, stop), chunk = [trainer], first["problems"], first["chunk"]
        chosen_on = ("validation across cells (bench/results/benchmark_suite.md: the row to headline), after the "
                     "first plan was made and before any live completion of this game")
    else:
        cell = parse_cell(args.cell)
        best, ordered = choices(read(os.path.join(SUITE, folder_name(cell))))
        trainers, (start, stop), chunk = [ordered[0][0], *args.also], args.problems, args.chunk
        chosen_on = "validation (bench/results/benchmark_suite.md), before any live completion"
    rows: list[dict] = [{"label": best, "kind": "protocol"}]
    os.makedirs(os.path.join(folder, "policies"), exist_ok=True)
    for trainer in dict.fromkeys(trainers):
        for source in sorted(glob.glob(os.path.join(args.runs, folder_name(cell), trainer, "final-*", "policy.pt"))):
            run = os.path.basename(os.path.dirname(source))
            target = os.path.join(folder, "policies", f"{trainer}-{run}.pt")
            shutil.copyfile(source, target)
            rows.append({"label": trainer, "kind": "policy", "seed": int(run.rsplit("seed", 1)[1]), "run": run,
                         "checkpoint": os.path.relpath(target, folder), "sha256": sha256(target)})
    dataset = loaded(cell.dataset)
    recorded = sorted(int(p.rsplit("-", 1)[1]) for p in dataset.card.splits["test"])
    if start <= recorded[-1]:
        sys.exit(f"--problems starts at {start}, inside the recorded test problems (0..{recorded[-1]})")
    check_replay(cell, rows, folder)
    document = {"cell": cell.name, "model": dataset.card.model, "problems": [start, stop], "chunk": chunk,
                "num_problems": stop, "episode_seed": "episode_seed(0, problem_index)", "rows": rows,
                "chosen_on": chosen_on, "made": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "command": command_line()}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(document, f, indent=1)
    print(f"wrote {path}: {len(rows)} rows, test problems {start}-{stop - 1}")


def actor(row: dict, folder: str):
    if row["kind"] == "protocol":
        return make_protocol(row["label"])
    return PolicyActor(load_policy(os.path.join(folder, row["checkpoint"])))


def differences(env, cell, row: dict, problems: int, folder: str) -> int:
    """On how many of the first ``problems`` test problems ``env`` played by a policy row departs from the row's
    leaderboard outcomes (the suite's committed per-problem scores)."""
    records = play_episodes([env], [actor(row, folder)], [(episode_seed(0, i), i) for i in range(problems)])
    played = np.array([float(r["correct"]) for r in records])
    return int((played != suite_outcomes(cell.name, row["label"], row["seed"])[1]).sum())


def check_replay(cell, rows: list[dict], folder: str) -> None:
    """Each policy row played on the replay's test split through the live code path gives the suite's outcomes."""
    env = cell.env("test")
    problems = len(env.problems)
    for row in rows:
        if row["kind"] == "policy" and (departed := differences(env, cell, row, problems, folder)):
            sys.exit(f"{row['label']} {row['run']}: played on replay it differs from the suite's outcomes on "
                     f"{departed} problems: not the leaderboard's policy")
    print(f"checked: every policy row reproduces its leaderboard outcomes on the {problems} replayed test problems")


def read_plan(folder: str) -> dict:
    path = os.path.join(folder, "plan.json")
    if not os.path.exists(path):
        sys.exit(f"no {path}: make it first (`python bench/studies/live_check.py plan"
                 f"{' --amend' if folder == AMENDMENT else ''}`)")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def check_live_env(document: dict, folder: str) -> None:
    """The live env (the set's settings, the cell's game, the extended split), answered by the replay backend, gives
    a policy row's leaderboard outcomes on the recorded test problems: the live game is the replay's, bar samples."""
    cell = parse_cell(document["cell"])
    dataset = loaded(cell.dataset)
    env = live_env(dataset.card, cell.options, document["num_problems"], ReplayBackend(dataset))
    row = next(row for row in document["rows"] if row["kind"] == "policy")
    if differences(env, cell, row, len(dataset.card.splits["test"]), folder):
        sys.exit("the live env answered by the replay backend does not give the leaderboard's outcomes: it plays "
                 "another game than the cell's")


def chunk_path(folder: str, first: int, last: int) -> str:
    return os.path.join(folder, f"chunk-{first:04d}-{last - 1:04d}.csv")


def run(args) -> None:
    folder = AMENDMENT if args.amendment else OUT
    document = read_plan(folder)
    check_live_env(document, folder)
    cell = parse_cell(document["cell"])
    card = loaded(cell.dataset).card
    backend = backend_settings(args).build()
    if document["model"] not in backend.identity():
        sys.exit(f"the backend is {backend.identity()!r}, not the recording's {document['model']!r}: serve the "
                 "set's own build (bench/record/llama_server.sh)")
    rows = document["rows"]
    actors = [actor(row, folder) for row in rows]
    first, last = document["problems"]
    size = document["chunk"]
    envs: list[DeliberationEnv] = []
    for start in range(first, last, size):
        stop = min(start + size, last)
        path = chunk_path(folder, start, stop)
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
            name = f"live check{' (amendment)' if folder == AMENDMENT else ''}: test problems {start}-{stop - 1}"
            subprocess.run(["git", "commit", "-q", "-m", name, "--", path], check=True)


def live_outcomes(folder: str) -> tuple[dict[tuple[str, int | None], dict[int, float]], dict[str, float]]:
    """The finished chunks of a plan: each (row, seed)'s outcome per problem, and each row's mean tokens per episode."""
    outcomes: dict[tuple[str, int | None], dict[int, float]] = {}
    spent: dict[str, list[float]] = {}
    for path in sorted(glob.glob(os.path.join(folder, "chunk-*.csv"))):
        with open(path, encoding="utf-8") as f:
            for r in csv.DictReader(f):
                key = (r["label"], int(r["seed"]) if r["seed"] else None)
                outcomes.setdefault(key, {})[int(r["problem_index"])] = float(r["correct"])
                spent.setdefault(r["label"], []).append(float(r["tokens"]))
    return outcomes, {label: float(np.mean(values)) for label, values in spent.items()}


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


def section(folder: str) -> list[str]:
    """One plan's table: each row's replay and live accuracy and tokens, its gains over the protocol and their gap."""
    document, (live, tokens) = read_plan(folder), live_outcomes(folder)
    cell, name = document["cell"], os.path.relpath(os.path.join(folder, "plan.json"), RESULTS)
    protocol = document["rows"][0]["label"]
    done = sorted(live.get((protocol, None), {}))
    if not done:
        return [f"## {cell}", "", f"Rows named in [{os.path.basename(name)}]({name}): no live chunk yet.", ""]
    replay_protocol, replay_tokens = suite_outcomes(cell, protocol)[1:]
    base = np.array([live[(protocol, None)][i] for i in done])
    lines = [f"## {cell}", "",
             f"Rows named in [{os.path.basename(name)}]({name}) ({document['chosen_on']}). Live: {len(done)} test "
             f"problems outside the recording ({done[0]}-{done[-1]} of the planned {document['problems'][0]}-"
             f"{document['problems'][1] - 1}), through {document['model']}; replay: the {len(replay_protocol)} recorded "
             f"test problems (the suite's outcomes). Differences in points to {protocol} with 95% intervals: "
             "hierarchical bootstrap over the seeds and, paired, the problems; live - replay resamples the seeds once "
             "for both sides. Tokens: mean per episode, round 0 included.", "",
             "| row | seeds | replay accuracy | live accuracy | replay tokens | live tokens | replay gain | live gain "
             "| live - replay |", "|---|---|---|---|---|---|---|---|---|",
             f"| {protocol} | - | {replay_protocol.mean():.3f} | {base.mean():.3f} | {replay_tokens.mean():.0f} | "
             f"{tokens[protocol]:.0f} | - | - | - |"]
    for label in dict.fromkeys(row["label"] for row in document["rows"][1:]):
        seeds = sorted(seed for (row, seed) in live if row == label)
        live_table = np.array([[live[(label, s)][i] for i in done] for s in seeds])
        replayed = [suite_outcomes(cell, label, s)[1:] for s in seeds]
        replay_table = np.array([accuracy for accuracy, _ in replayed])
        live_gain = hierarchical_bootstrap([live_table, base], [1, -1])
        replay_gain = hierarchical_bootstrap([replay_table, replay_protocol], [1, -1])
        gap = gap_interval(live_table - base, replay_table - replay_protocol)
        lines.append(f"| {label} | {len(seeds)} | {replay_table.mean():.3f} | {live_table.mean():.3f} | "
                     f"{np.mean([t.mean() for _, t in replayed]):.0f} | {tokens[label]:.0f} | "
                     + " | ".join(f"{100 * e:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"
                                  for e, lo, hi in (replay_gain, live_gain, gap)) + " |")
    return [*lines, ""]


def report(args) -> None:
    if not glob.glob(os.path.join(OUT, "chunk-*.csv")):
        sys.exit("no live chunk yet: run `python bench/studies/live_check.py run ...` first")
    lines = ["# Live check", "", f"`{command_line()}`", "", *section(OUT)]
    if os.path.exists(os.path.join(AMENDMENT, "plan.json")):
        lines += ["The amendment: the row the leaderboard headlines, chosen on validation across cells after the first "
                  "plan was made (`plan --amend`).", "", *section(AMENDMENT)]
    write_report("live_check", "\n".join(lines))


def main(argv=None) -> None:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    made = commands.add_parser("plan", help="name the rows and problems (once, before any live completion)")
    made.add_argument("--amend", action="store_true",
                      help="add the leaderboard's row to headline (and its cell's protocol) if the first plan lacks it")
    made.add_argument("--cell", default="qwen05-arith-v2:v2")
    made.add_argument("--also", nargs="*", default=["softrankpo"], help="trainers beyond the validation headline")
    made.add_argument("--runs", default=os.path.join("runs", "benchmark_suite"), help="the suite's trained runs")
    made.add_argument("--problems", type=lambda t: tuple(int(v) for v in t.split(":")), default=(500, 900))
    made.add_argument("--chunk", type=int, default=20)
    played = commands.add_parser("run", help="play the planned rows live, chunk after chunk")
    played.add_argument("--commit", action="store_true", help="git commit each finished chunk's CSV")
    played.add_argument("--amendment", action="store_true", help="play the amendment's plan (plan --amend)")
    add_backend_arguments(played, backend_default="openai")
    commands.add_parser("report", help="the live vs replay table from the finished chunks")
    args = parser.parse_args(argv)
    {"plan": plan, "run": run, "report": report}[args.command](args)


if __name__ == "__main__":
    main()
