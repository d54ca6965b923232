"""Fine-tune the LLM agents themselves: a study of reward x credit, in resumable chunks.

Every cell trains the same untrained team (one LoRA adapter per agent) on the same problems with the same
normalisation (group mean baseline divided by the group's std), and is evaluated on the same held-out test
problems. The cells (``--design``; a cell is <reward>-<credit>):

| reward     | what an agent's turn is paid                                                              |
|------------|-------------------------------------------------------------------------------------------|
| team       | the team's consensus is right, on the final round only (the round term ``team``)          |
| teamturn   | the consensus of the answers held after the turn is right, at every turn (``team_turn``)  |
| own        | the agent's own answer is right, at every solve and refine turn (``correct``)             |

| credit     | what a completion's advantage compares                                                    |
|------------|-------------------------------------------------------------------------------------------|
| shared     | the joint action's summed return, one group per node                                      |
| own        | the agent's own return, one group per (node, agent)                                       |

(plus format 0.1 everywhere: an answer the task's extractor can read; the core's per-round terms are off.)

- ``--design turns`` (default): teamturn-shared (MAGRPO as CoMLRL pays it: a joint reward at every turn),
  team-shared (the terminal form), own-shared, own-own (independent GRPO learners). Every pair's advantages differ
  on a tree with mixed correctness (tests/test_llm_study_cells.py). Credit is crossed with the own reward only: under
  a team reward shared and own credit are the same algorithm wherever the answers are readable
  (``SAME_BY_CONSTRUCTION``).
- ``--design 2x2``: the first study, team/own reward x shared/own credit (results/train_llm_2x2), which held such a
  pair.

The rollouts are MAGRPO's aligned turn trees (``--joint align``): G siblings branch from one shared history at each
turn, and returns are returns-to-go.

A chunk is one (cell, seed): train (saving its state under ``--out`` after every update: a killed chunk resumes
from its last update), evaluate on the held-out problems (through a SQLite cache per agent: a killed evaluation
resumes too), then write the chunk's result and learning curve to ``results/<--stem>/<cell>-seed<k>.json``, a few
kB that are kept with the repository (``--commit`` commits each one), so that a study spread over machines that do
not keep ``--out`` loses at most the chunk it was in. A rerun skips finished chunks, so the study runs in the
background across sessions:

    python bench/studies/llm_study.py --model ~/.cache/deliberation-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
    python bench/studies/llm_study.py --model ... --report-only      # the report from the chunks finished so far

``--workers 2`` trains two cells' chunks side by side (after the untrained team's evaluation), one process and
``--threads / 2`` torch threads each: for CPUs whose cores one chunk does not keep busy. On this project's 2 cores
(Qwen2.5-Coder-0.5B, the same first update of both cells, one script) an update took 181 s in series on 2 threads and
324 s side by side on 1 thread each, 1.12x the updates per hour (the whole command 605 s vs 527 s). Not for one GPU:
on an H200 two chunks side by side took 38 s per update each against 15-20 s in series (results/gpu_workers_h200.md).

The report (results/<--stem>.md, .png; bench/studies/_llm_study_report.py): per cell, each training run's held-out accuracy,
the spread between runs (their sd), and 95% intervals over the evaluation problems only (Wilson) and over training
runs and problems (a hierarchical bootstrap: runs resampled within each cell, then the problems, paired across
cells); the same two intervals against the untrained team, for every pair of cells and, for the 2x2, its main
effects (also per seed); the gap between cells that are one algorithm by construction (run-to-run noise, measured);
what the design can and cannot show; learning curves. With fewer than 3 runs per cell it says that no interval
covers training noise yet.

On a GPU (not run here), the redesigned study at a budget that can show training noise (4 runs per cell, 200
updates of 8 problems, Qwen2.5-1.5B-Instruct), sampling on a local vLLM server (docs/train_llm.md: its time and
memory, estimated):

    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve Qwen/Qwen2.5-1.5B-Instruct --port 8000 --dtype bfloat16 \\
        --enable-lora --max-lora-rank 8 --max-loras 2 --logprobs-mode processed_logprobs --gpu-memory-utilization 0.35 &
    python bench/studies/llm_study.py --preset gpu --commit
    python bench/studies/llm_study.py --preset gpu --task jigsaw --commit   # the task that needs cooperation

On 2 CPU cores the jigsaw study does not fit: one update of its tree took 828 s (docs/train_llm.md, limit 4).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import multiprocessing
import os
import subprocess
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

from baselines.llm.config import LLMTrainConfig
from baselines.llm.evaluation import evaluate_team
from baselines.llm.policy import team_backends
from baselines.llm.train_llm import make_team, train
from baselines.logger import read_metrics
from bench.common import results as _results
from bench.studies._llm_study_report import CURVE_KEYS, STUDY_KEYS, load_results, report, result_path, study_settings
from deliberation_env.cli import OLD_TEAM_FLAGS, TEAM_FLAGS, ArgumentParser, add_env_arguments, field_docs
from deliberation_env.tasks.jigsaw import LEVELS as JIGSAW_LEVELS

REWARDS = {"team": {"team": 1.0}, "teamturn": {"team_turn": 1.0}, "own": {"correct": 1.0}}
"""team: the consensus is right, paid on the final round only; teamturn: the consensus of the answers held after each
turn is right, paid at every turn (CoMLRL's joint reward); own: the agent's own answer is right, at every turn."""
CREDITS = {"shared": {"credit": "team", "pool_agents": True}, "own": {"credit": "agent", "pool_agents": False}}
CELLS = [f"{reward}-{credit}" for reward, credit in itertools.product(REWARDS, CREDITS)]
DESIGNS = {"2x2": ("team-shared", "team-own", "own-shared", "own-own"),
           "turns": ("teamturn-shared", "team-shared", "own-shared", "own-own")}
"""2x2: the first study (reward x credit; kept to run and read it); turns: cells that differ by construction, every
pair's advantages differ on a tree with mixed correctness (tests/test_llm_study_cells.py)."""
SAME_BY_CONSTRUCTION = (("team-shared", "team-own"), ("teamturn-shared", "teamturn-own"))
"""Pairs whose advantages are equal in every group whose answers are all readable: each agent receives the same team
reward, so shared credit's return is N times own credit's plus the format terms, and the std normalisation cancels
N; they differ only where a format term varies within a group. Hence credit is crossed with the own reward only."""
DESIGN_NOTES = {
    "2x2": "What the first study (2 runs per cell, 16 updates of one problem each) can show: no difference between "
           "its cells that can be told apart from run-to-run noise, except perhaps independent GRPO (own-own) over "
           "the untrained team (both runs above it, by about the gap between team-shared and team-own). Its limits: "
           "(1) team-shared and team-own are one algorithm but for groups with an unreadable answer; (2) the team "
           "reward is paid at the final round only and the own reward at every turn, so reward is confounded with "
           "sparse vs dense; (3) 2 runs per cell cannot estimate the spread between runs, and 16 updates of one "
           "problem each is a small budget; (4) arithmetic needs no cooperation, one agent solves a problem alone. "
           "It does not test MAGRPO's cooperation claim (docs/train_llm.md).",
    "turns": "Every pair of these cells gives different advantages by construction (tests/test_llm_study_cells.py); "
             "teamturn-shared and team-shared both pay the team reward, per turn and at the end. What it cannot "
             "show: cooperation on a task that needs it (arithmetic does not; run it with --task jigsaw), and "
             "training noise with fewer than 3 runs per cell.",
    "turns-jigsaw": "Every pair of these cells gives different advantages by construction "
                    "(tests/test_llm_study_cells.py). The task needs cooperation: each agent sees one person's count "
                    "and a team is right only when an agent writes its count where a peer reads it and the peer uses "
                    "it (docs/tasks.md, jigsaw). What it cannot show: training noise with fewer than 3 runs per cell.",
}
"""what each design can and cannot show, in its report (``<design>-<task>`` for a task other than arithmetic)"""
COMMON_WEIGHTS = {"format": 0.1, "local": 0.0, "global": 0.0}
"""format shaping in every cell; the core's per-round terms off, so each cell's reward is exactly its table row."""
PRESETS = {
    "gpu": {"model": "Qwen/Qwen2.5-1.5B-Instruct", "design": "turns", "seeds": [0, 1, 2, 3], "group_size": 4,
            "problems_per_update": 8, "updates": 200, "max_tokens": 256, "lr": 1e-4,
            "eval_problems": 500, "device": "cuda", "dtype": "bfloat16", "threads": 8, "micro_batch": 16,
            "generate_batch": 64, "generate_url": ["http://127.0.0.1:8000/v1"]},
}
"""Flag defaults of --preset (flags on the command line still win). gpu: the redesigned study at a budget that can
show training noise (4 runs per cell, 200 updates of 8 problems), sampling on a local vLLM server (docs/train_llm.md:
its command, and the time and memory expected, an estimate). Its results go under train_llm_gpu[_<task>]."""
LEVELS = {(None, "arithmetic"): [0, 1], (None, "jigsaw"): [0, 1], ("gpu", "arithmetic"): [1, 2, 3],
          ("gpu", "jigsaw"): [0, 1, 2]}
"""--levels' default per (preset, task): where one agent of the model is neither always right nor always wrong."""


def parse_args(argv=None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=PRESETS, help="flag defaults for a machine: gpu (see PRESETS)")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--design", choices=DESIGNS, default="turns",
                        help="the study's cells: turns (cells that differ by construction) or 2x2 (the first study)")
    parser.add_argument("--cells", nargs="+", choices=CELLS, help="run only these cells (default: the design's)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--problems-per-update", type=int, default=2)
    parser.add_argument("--updates", type=int, default=20)
    add_env_arguments(parser, (*TEAM_FLAGS, "max_tokens"), defaults={"num_agents": 2, "max_rounds": 1, "max_tokens": 192},
                      aliases=OLD_TEAM_FLAGS)
    parser.add_argument("--levels", type=int, nargs="+", help="task levels (default: LEVELS, by preset and task)")
    parser.add_argument("--task", choices=("arithmetic", "jigsaw"), default="arithmetic",
                        help="arithmetic (one agent can solve a problem alone) or jigsaw (each agent sees one "
                             "person's count: only a team that shares them is right; deliberation_env.tasks.jigsaw)")
    parser.add_argument("--prompt", default="no_code", help="arithmetic prompt (no_code: reason in words)")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--eval-problems", type=int, default=200)
    parser.add_argument("--eval-every", type=int, default=0, help="evaluate during training every N updates (0: off)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1,
                        help="chunks trained side by side: one process per share of --cells, each with --threads / "
                             "--workers torch threads, its output in <--out>/worker<k>.log")
    parser.add_argument("--converted-cache-dir", default=os.path.expanduser("~/.cache/deliberation-models/converted"))
    docs = field_docs(LLMTrainConfig)
    parser.add_argument("--micro-batch", type=int, default=4, help=docs["micro_batch"])
    parser.add_argument("--generate-batch", type=int, default=16, help=docs["generate_batch"])
    parser.add_argument("--generate-url", nargs="*", default=[], metavar="URL",
                        help=docs["generate_url"] + " Given without a URL: sample in-process.")
    parser.add_argument("--out", help="run folders (default: runs/bench-train-llm-<design>)")
    parser.add_argument("--stem", help="results file stem under bench/results/ (default: train_llm_<design>)")
    parser.add_argument("--report-only", action="store_true", help="write the report from the finished chunks")
    parser.add_argument("--commit", action="store_true",
                        help="git-commit the results folder after every finished chunk (a study spanning sessions)")
    preset = parser.parse_known_args(argv)[0].preset
    if preset:
        parser.set_defaults(**PRESETS[preset])
    args = parser.parse_args(argv)
    if args.task == "jigsaw" and args.num_agents not in (2, 3):
        parser.error("--task jigsaw splits each problem between 2 or 3 agents: --num-agents 2 or 3")
    args.levels = args.levels or LEVELS[args.preset, args.task]
    if args.task == "jigsaw" and not set(args.levels) <= set(JIGSAW_LEVELS):
        parser.error(f"--task jigsaw has levels {list(JIGSAW_LEVELS)}: got --levels {args.levels}")
    args.cells = args.cells or list(DESIGNS[args.design])
    if not 1 <= args.workers <= len(args.cells):
        parser.error(f"--workers {args.workers}: give 1 to {len(args.cells)}, one worker per cell at most "
                     f"({len(args.cells)} cells: {' '.join(args.cells)})")
    name = f"{args.preset or args.design}{'' if args.task == 'arithmetic' else '_' + args.task}"
    args.stem = args.stem or f"train_llm_{name}"
    args.out = args.out or os.path.join("runs", f"bench-train-llm-{name.replace('_', '-')}")
    return args


def task_settings(args: argparse.Namespace) -> tuple[dict, dict]:
    """The task's keywords and the env options it needs: jigsaw's agents each see one person's count (a role each)."""
    if args.task == "jigsaw":
        views = [{"name": f"view_{k}", "prompt": f"view_{k}"} for k in range(args.num_agents)]
        return {"levels": tuple(args.levels), "parts": args.num_agents}, {"roles": views}
    return {"levels": tuple(args.levels), "prompt": args.prompt}, {}


def cell_settings(cell: str) -> dict:
    """What a cell sets of the trainer's config: its reward weights and credit, and the normalisation and trees that
    every cell shares."""
    reward, credit = cell.split("-")
    return {"algo": "grpo", "joint": "align", "reward_weights": {**REWARDS[reward], **COMMON_WEIGHTS}, **CREDITS[credit]}


def cell_config(args: argparse.Namespace, cell: str, seed: int) -> LLMTrainConfig:
    out = os.path.join(args.out, f"{cell}-seed{seed}")
    state = os.path.join(out, "state")
    task_options, env_options = task_settings(args)
    return LLMTrainConfig(task=args.task,
        model=args.model, num_agents=args.num_agents, group_size=args.group_size,
        problems_per_update=args.problems_per_update, updates=args.updates, max_tokens=args.max_tokens,
        max_rounds=args.max_rounds, lr=args.lr, eval_problems=args.eval_problems, eval_every=args.eval_every,
        device=args.device, dtype=args.dtype, threads=args.threads, seed=seed, converted_cache_dir=args.converted_cache_dir,
        out=out, task_options=task_options,
        micro_batch=args.micro_batch, generate_batch=args.generate_batch, generate_url=list(args.generate_url),
        env_options={"confidence": "answer_logprobs", **env_options}, weights="lora", evaluate=False, tensorboard=False, save_every=1,
        resume=state if os.path.isdir(state) else "", progress=True, **cell_settings(cell))


def stored_json(value) -> str:
    """``value`` as the results folder keeps it: JSON, with this machine's home folder written as ~."""
    home, tilde = (json.dumps(folder + os.sep)[1:-1] for folder in (os.path.expanduser("~"), "~"))  # as escaped in text
    return json.dumps(value).replace(home, tilde)


def write_result(args: argparse.Namespace, name: str, row: dict, extra: dict) -> None:
    path = result_path(args.stem, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".partial", "w", encoding="utf-8") as f:
        f.write(stored_json({**extra, "row": row}))
    os.replace(path + ".partial", path)
    if args.commit:
        folder = os.path.dirname(path)
        _git("add", "--", folder)
        _git("commit", "-q", "-m", f"{args.stem}: {name} finished (bench/studies/llm_study.py --commit)", "--", folder)


def _git(*command: str, tries: int = 30) -> None:
    """``git *command``, retried while another worker's commit holds the index lock."""
    for attempt in range(tries):
        done = subprocess.run(["git", *command], capture_output=True, text=True)
        if done.returncode == 0:
            return
        if "index.lock" not in done.stderr or attempt == tries - 1:
            raise subprocess.CalledProcessError(done.returncode, ["git", *command], done.stdout, done.stderr)
        time.sleep(1.0)


def cached(backends: list, folder: str) -> list:
    """Each agent's backend behind a SQLite cache in ``folder`` (one file per agent: adapters differ, identities may
    not), so that an evaluation stopped half-way goes on where it stopped when the study is rerun."""
    from deliberation_env.backends.cache import CachedBackend

    os.makedirs(folder, exist_ok=True)
    return [CachedBackend(backend, os.path.join(folder, f"eval-agent{i}.sqlite")) for i, backend in enumerate(backends)]


def run_untrained(args: argparse.Namespace) -> None:
    """The untrained team on the held-out problems (LoRA adapters start as the identity: every cell starts here)."""
    path = result_path(args.stem, "untrained")
    if os.path.exists(path):
        return
    cfg = cell_config(args, args.cells[0], 0)
    start = time.time()
    untrained = _Untrained(make_team(cfg))
    row = evaluate_team("untrained", cached([untrained] * cfg.num_agents, os.path.join(args.out, "untrained")), cfg)
    write_result(args, "untrained", row, {"eval_seconds": time.time() - start})


def run_chunk(args: argparse.Namespace, cell: str, seed: int) -> None:
    path = result_path(args.stem, f"{cell}-seed{seed}")
    if os.path.exists(path):
        return
    cfg = cell_config(args, cell, seed)
    team = train(cfg)
    del team
    gc.collect()
    backends = team_backends(os.path.join(cfg.out, "checkpoint"), dtype=cfg.dtype, device=cfg.device,
                             batch_size=cfg.generate_batch)
    start = time.time()
    row = evaluate_team(f"{cell} seed {seed}", cached(backends, cfg.out), cfg)
    metrics = read_metrics(cfg.out)  # each update's own time, so a resumed run's training time counts every update
    write_result(args, f"{cell}-seed{seed}", row, {
        "cell": cell, "seed": seed, "train_seconds": sum(m["seconds"] for m in metrics), "eval_seconds": time.time() - start,
        "config": asdict(cfg), "curve": [{k: m[k] for k in CURVE_KEYS if k in m} for m in metrics]})
    print(f"{cell} seed {seed}: held-out accuracy {row['accuracy']:.3f}", flush=True)


def check_flags(args: argparse.Namespace, settings: dict | None) -> None:
    """Refuse to add chunks whose flags differ from the chunks already finished under this ``--stem``."""
    if settings is None:
        return
    flags = json.loads(stored_json(asdict(cell_config(args, CELLS[0], 0))))  # compared as the chunks store them
    differing = [f"{key} ({flags[key]!r} here, {settings[key]!r} in the finished chunks)"
                 for key in STUDY_KEYS if flags[key] != settings[key]]
    if differing:
        raise SystemExit(f"llm_study.py: these flags differ from the study's finished chunks: {'; '.join(differing)}; "
                         "pass the study's flags (see results/<--stem>.md) or another --stem")


def write_report(args: argparse.Namespace) -> None:
    fallback = {**asdict(cell_config(args, args.cells[0], 0)), "model": args.model}
    report(args.stem, [*DESIGNS[args.design], *(c for c in CELLS if c not in DESIGNS[args.design])], fallback,
           DESIGN_NOTES.get(f"{args.design}-{args.task}", DESIGN_NOTES[args.design]), SAME_BY_CONSTRUCTION)


def main(argv=None) -> None:
    args = parse_args(argv)
    if not args.report_only:
        check_flags(args, study_settings(load_results(args.stem, CELLS)[1]))
        run_untrained(args)
        write_report(args)
        if args.workers == 1:
            run_chunks(args)
        else:
            run_workers(args)
    write_report(args)


def run_chunks(args: argparse.Namespace) -> None:
    for seed in args.seeds:  # seed-major: after the first pass every cell has a seed
        for cell in args.cells:
            run_chunk(args, cell, seed)
            write_report(args)  # after every chunk, so a stopped study keeps what it measured


def run_workers(args: argparse.Namespace) -> None:
    """``run_chunks`` in ``--workers`` processes side by side, worker k taking cells k, k + workers, ...; the
    untrained team is evaluated before (once). A worker that fails keeps the chunks it finished."""
    os.makedirs(args.out, exist_ok=True)
    context = multiprocessing.get_context("spawn")  # torch's thread pools do not survive a fork
    workers = []
    for k in range(args.workers):
        share = argparse.Namespace(**{**vars(args), "cells": args.cells[k::args.workers], "workers": 1,
                                      "threads": max(1, args.threads // args.workers)})
        log = os.path.join(args.out, f"worker{k}.log")
        workers.append(context.Process(target=_worker, args=(share, log, _results.RESULTS), name=log))
        workers[-1].start()
        print(f"worker {k}: {' '.join(share.cells)} (seeds {' '.join(map(str, args.seeds))}), {share.threads} "
              f"thread(s), output in {log}", flush=True)
    for worker in workers:
        worker.join()
    failed = [worker.name for worker in workers if worker.exitcode != 0]
    if failed:
        raise SystemExit(f"llm_study.py: a worker failed, see {', '.join(failed)}; its finished chunks are kept, the "
                         "same command goes on from there")


def _worker(args: argparse.Namespace, log: str, results: str) -> None:
    _results.RESULTS = results  # the parent's results folder, wherever it was set
    with open(log, "a", encoding="utf-8") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        try:
            run_chunks(args)
        except BaseException:
            traceback.print_exc()  # into the worker's log, beside its progress
            raise


class _Untrained:
    """The team before any update, answered through the trainer's own model with the adapters switched off."""

    def __init__(self, team):
        self.team = team

    def generate(self, requests):
        with self.team.backends[0].model.disable_adapter():
            return self.team.backends[0].generate(requests)

    def identity(self) -> str:
        return f"{self.team.backends[0].identity()},untrained"


if __name__ == "__main__":
    main()
