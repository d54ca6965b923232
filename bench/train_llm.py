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

    python bench/train_llm.py --model ~/.cache/deliberation-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
    python bench/train_llm.py --model ... --report-only      # the report from the chunks finished so far

The report (results/<--stem>.md, .png): per cell, held-out accuracy over all its seeds' episodes (Wilson 95%) and
each seed's; paired differences per problem (each problem's correctness averaged over seeds, bootstrap 95% over
problems) for every pair of cells, the untrained team, and the two main effects; learning curves (training
accuracy and evaluation during training, mean over seeds); the cost of each chunk.

On a GPU (not run here), a larger team:

    python bench/train_llm.py --model Qwen/Qwen2.5-1.5B-Instruct --device cuda --dtype bfloat16 --agents 3 \\
        --group-size 8 --problems-per-update 4 --updates 200 --max-tokens 256 --eval-problems 500 --threads 8
"""

from __future__ import annotations

import argparse
import gc
import glob
import itertools
import json
import os
import subprocess
import time
from dataclasses import asdict

import numpy as np
from _results import RESULTS, save_markdown, wilson_interval

from baselines.llm.config import LLMTrainConfig
from baselines.llm.evaluation import evaluate_team
from baselines.llm.policy import team_backends
from baselines.llm.train_llm import make_team, train
from baselines.logger import read_metrics
from deliberation_env.analysis.metrics import paired_bootstrap
from deliberation_env.cli import ArgumentParser

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
COMMON_WEIGHTS = {"format": 0.1, "local": 0.0, "global": 0.0}
"""format shaping in every cell; the core's per-round terms off, so each cell's reward is exactly its table row."""
CURVE_KEYS = ("accuracy", "reward_format", "completion_tokens", "flat_groups")
"""the training metrics kept with each chunk's result and plotted as learning curves"""
STUDY_KEYS = ("model", "task_options", "agents", "max_rounds", "max_tokens", "temperature", "group_size", "joint",
              "problems_per_update", "updates", "lr", "dtype", "device", "eval_problems")
"""the settings every chunk of one study shares (each cell sets its own reward and credit, each chunk its seed)"""


def parse_args(argv=None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--design", choices=DESIGNS, default="turns",
                        help="the study's cells: turns (cells that differ by construction) or 2x2 (the first study)")
    parser.add_argument("--cells", nargs="+", choices=CELLS, help="run only these cells (default: the design's)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--agents", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--problems-per-update", type=int, default=2)
    parser.add_argument("--updates", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--max-rounds", type=int, default=1)
    parser.add_argument("--levels", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--prompt", default="no_code", help="arithmetic prompt (no_code: reason in words)")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--eval-problems", type=int, default=200)
    parser.add_argument("--eval-every", type=int, default=0, help="evaluate during training every N updates (0: off)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--converted-cache-dir", default=os.path.expanduser("~/.cache/deliberation-models/converted"))
    parser.add_argument("--out", help="run folders (default: runs/bench-train-llm-<design>)")
    parser.add_argument("--stem", help="results file stem under bench/results/ (default: train_llm_<design>)")
    parser.add_argument("--report-only", action="store_true", help="write the report from the finished chunks")
    parser.add_argument("--commit", action="store_true",
                        help="git-commit the results folder after every finished chunk (a study spanning sessions)")
    args = parser.parse_args(argv)
    args.cells = args.cells or list(DESIGNS[args.design])
    args.stem = args.stem or f"train_llm_{args.design}"
    args.out = args.out or os.path.join("runs", f"bench-train-llm-{args.design}")
    return args


def cell_settings(cell: str) -> dict:
    """What a cell sets of the trainer's config: its reward weights and credit, and the normalisation and trees that
    every cell shares."""
    reward, credit = cell.split("-")
    return {"algo": "grpo", "joint": "align", "reward_weights": {**REWARDS[reward], **COMMON_WEIGHTS}, **CREDITS[credit]}


def cell_config(args: argparse.Namespace, cell: str, seed: int) -> LLMTrainConfig:
    out = os.path.join(args.out, f"{cell}-seed{seed}")
    state = os.path.join(out, "state")
    return LLMTrainConfig(
        model=args.model, agents=args.agents, group_size=args.group_size,
        problems_per_update=args.problems_per_update, updates=args.updates, max_tokens=args.max_tokens,
        max_rounds=args.max_rounds, lr=args.lr, eval_problems=args.eval_problems, eval_every=args.eval_every,
        device=args.device, dtype=args.dtype, threads=args.threads, seed=seed, converted_cache_dir=args.converted_cache_dir,
        out=out, task_options={"levels": tuple(args.levels), "prompt": args.prompt},
        env_options={"confidence": "answer_logprobs"}, weights="lora", evaluate=False, tensorboard=False, save_every=1,
        resume=state if os.path.isdir(state) else "", progress=True, **cell_settings(cell))


def result_path(args: argparse.Namespace, name: str) -> str:
    return os.path.join(RESULTS, args.stem, f"{name}.json")


def stored_json(value) -> str:
    """``value`` as the results folder keeps it: JSON, with this machine's home folder written as ~."""
    home, tilde = (json.dumps(folder + os.sep)[1:-1] for folder in (os.path.expanduser("~"), "~"))  # as escaped in text
    return json.dumps(value).replace(home, tilde)


def write_result(args: argparse.Namespace, name: str, row: dict, extra: dict) -> None:
    path = result_path(args, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".partial", "w", encoding="utf-8") as f:
        f.write(stored_json({**extra, "row": row}))
    os.replace(path + ".partial", path)
    if args.commit:
        folder = os.path.dirname(path)
        subprocess.run(["git", "add", "--", folder], check=True)
        subprocess.run(["git", "commit", "-q", "-m", f"{args.stem}: {name} finished (bench/train_llm.py --commit)",
                        "--", folder], check=True)


def cached(backends: list, folder: str) -> list:
    """Each agent's backend behind a SQLite cache in ``folder`` (one file per agent: adapters differ, identities may
    not), so that an evaluation stopped half-way goes on where it stopped when the study is rerun."""
    from deliberation_env.backends.cache import CachedBackend

    os.makedirs(folder, exist_ok=True)
    return [CachedBackend(backend, os.path.join(folder, f"eval-agent{i}.sqlite")) for i, backend in enumerate(backends)]


def run_untrained(args: argparse.Namespace) -> None:
    """The untrained team on the held-out problems (LoRA adapters start as the identity: every cell starts here)."""
    path = result_path(args, "untrained")
    if os.path.exists(path):
        return
    cfg = cell_config(args, args.cells[0], 0)
    start = time.time()
    untrained = _Untrained(make_team(cfg))
    row = evaluate_team("untrained", cached([untrained] * cfg.agents, os.path.join(args.out, "untrained")), cfg)
    write_result(args, "untrained", row, {"eval_seconds": time.time() - start})


def run_chunk(args: argparse.Namespace, cell: str, seed: int) -> None:
    path = result_path(args, f"{cell}-seed{seed}")
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


def load_results(args: argparse.Namespace) -> tuple[dict | None, dict[str, list[dict]]]:
    untrained = None
    if os.path.exists(result_path(args, "untrained")):
        with open(result_path(args, "untrained"), encoding="utf-8") as f:
            untrained = json.load(f)
    cells: dict[str, list[dict]] = {}
    for cell in CELLS:  # every finished seed, whatever this run's --seeds
        for path in sorted(glob.glob(result_path(args, f"{cell}-seed*"))):
            with open(path, encoding="utf-8") as f:
                cells.setdefault(cell, []).append(json.load(f))
    return untrained, cells


def study_settings(cells: dict[str, list[dict]]) -> dict | None:
    """The settings the finished chunks were trained and evaluated with, or None before the first chunk.

    The report describes these, not the flags of the run that writes it. Chunks that disagree cannot be one study."""
    configs = [result["config"] for results in cells.values() for result in results]
    if not configs:
        return None
    settings = {key: configs[0][key] for key in STUDY_KEYS}
    for config in configs[1:]:
        differing = [key for key in STUDY_KEYS if config[key] != settings[key]]
        if differing:
            raise SystemExit(f"train_llm.py: the finished chunks in results/ differ in {', '.join(differing)}; "
                             "one study's chunks share their settings (give another setting its own --stem)")
    return settings


def check_flags(args: argparse.Namespace, settings: dict | None) -> None:
    """Refuse to add chunks whose flags differ from the chunks already finished under this ``--stem``."""
    if settings is None:
        return
    flags = json.loads(stored_json(asdict(cell_config(args, CELLS[0], 0))))  # compared as the chunks store them
    differing = [f"{key} ({flags[key]!r} here, {settings[key]!r} in the finished chunks)"
                 for key in STUDY_KEYS if flags[key] != settings[key]]
    if differing:
        raise SystemExit(f"train_llm.py: these flags differ from the study's finished chunks: {'; '.join(differing)}; "
                         "pass the study's flags (see results/<--stem>.md) or another --stem")


def per_problem(results: list[dict]) -> np.ndarray:
    """Each held-out problem's correctness, averaged over the results (seeds)."""
    return np.mean([r["row"]["per_problem_accuracy"] for r in results], axis=0)


def accuracy_text(results: list[dict]) -> str:
    episodes = sum(r["row"]["episodes"] for r in results)
    right = sum(round(r["row"]["accuracy"] * r["row"]["episodes"]) for r in results)
    low, high = wilson_interval(right, episodes)
    return f"{right / episodes:.3f} [{low:.3f}, {high:.3f}]"


def difference_text(a: np.ndarray, b: np.ndarray) -> str:
    diff, low, high = paired_bootstrap(a, b)
    return f"{diff:+.3f} [{low:+.3f}, {high:+.3f}]"


def main_effect_rows(score: dict[str, np.ndarray], label: str) -> list[str]:
    """The two main effects of the 2x2 (each averaged over the other factor), as report rows."""
    reward = (score["team-shared"] + score["team-own"] - score["own-shared"] - score["own-own"]) / 2
    credit = (score["team-shared"] + score["own-shared"] - score["team-own"] - score["own-own"]) / 2
    return [f"| main effect of the reward (team - own){label} | {difference_text(reward, np.zeros_like(reward))} |",
            f"| main effect of the credit (shared - own){label} | {difference_text(credit, np.zeros_like(credit))} |"]


def report(args: argparse.Namespace) -> None:
    untrained, cells = load_results(args)
    if not cells and untrained is None:
        print("no finished chunk yet")
        return
    lines = ["| cell | seeds | held-out accuracy [Wilson 95%] | per seed | vs untrained [paired 95%] | tokens / problem | "
             "train min / seed | eval min / seed |", "|---|---|---|---|---|---|---|---|"]
    if untrained is not None:
        lines.append(f"| untrained | - | {accuracy_text([untrained])} | - | - | {untrained['row']['tokens']:.0f} | - | "
                     f"{untrained['eval_seconds'] / 60:.0f} |")
    for cell, results in cells.items():
        versus = difference_text(per_problem(results), per_problem([untrained])) if untrained else "-"
        lines.append(f"| {cell} | {len(results)} | {accuracy_text(results)} | "
                     + ", ".join(f"{r['row']['accuracy']:.3f}" for r in sorted(results, key=lambda r: r["seed"]))
                     + f" | {versus} | {np.mean([r['row']['tokens'] for r in results]):.0f} | "
                     f"{np.mean([r['train_seconds'] for r in results]) / 60:.0f} | "
                     f"{np.mean([r['eval_seconds'] for r in results]) / 60:.0f} |")
    pairs = ["| comparison | difference [paired 95%] |", "|---|---|"]
    for a, b in itertools.combinations(cells, 2):
        pairs.append(f"| {a} - {b} | {difference_text(per_problem(cells[a]), per_problem(cells[b]))} |")
    if len(cells) == 4:
        pairs += main_effect_rows({cell: per_problem(results) for cell, results in cells.items()}, "")
        seeds = sorted(set.intersection(*({r["seed"] for r in results} for results in cells.values())))
        if len(seeds) > 1:  # do the training seeds agree?
            for seed in seeds:
                score = {cell: per_problem([r for r in results if r["seed"] == seed]) for cell, results in cells.items()}
                pairs += main_effect_rows(score, f", seed {seed} only")
    settings = study_settings(cells) or {**asdict(cell_config(args, CELLS[0], 0)), "model": args.model}
    options = settings["task_options"]
    body = (f"Team of {settings['agents']} x {os.path.basename(settings['model'])} (one LoRA adapter each, "
            f"{settings['dtype']}, {settings['device']}), arithmetic levels {list(options['levels'])} with the "
            f"{options['prompt']} prompt, debate with {settings['max_rounds']} round, {settings['max_tokens']} tokens per "
            f"answer at temperature {settings['temperature']:g}, {settings['joint']}ed trees of G={settings['group_size']} "
            f"x {settings['problems_per_update']} problems per update, {settings['updates']} updates, lr {settings['lr']:g}, "
            f"grpo normalisation in every cell; {settings['eval_problems']} held-out test problems, the same for every "
            "row (1 evaluation seed each):\n\n"
            + "\n".join(lines) + "\n\nPaired differences (per problem, correctness averaged over seeds):\n\n"
            + "\n".join(pairs) + f"\n\nLearning curves: {args.stem}.png. Chunks finished: "
            + ", ".join(f"{c} x {len(r)}" for c, r in cells.items()) + ".")
    if cells:
        plot_curves(cells, os.path.join(RESULTS, f"{args.stem}.png"))
    save_markdown(args.stem, "LLM fine-tuning, a 2x2 of reward x credit (bench/train_llm.py)", body)


def plot_curves(cells: dict[str, list[dict]], path: str) -> None:
    from baselines.evaluation.evaluate import headless_pyplot

    plt = headless_pyplot()
    fig, axes = plt.subplots(1, len(CURVE_KEYS), figsize=(4 * len(CURVE_KEYS), 3))
    for ax, key in zip(axes, CURVE_KEYS):
        for cell, results in cells.items():
            runs = [r["curve"] for r in results]
            length = min(len(rows) for rows in runs)
            values = np.mean([[row.get(key, np.nan) for row in rows[:length]] for rows in runs], axis=0)
            window = min(5, length)
            smooth = np.convolve(values, np.ones(window) / window, mode="valid") if window else values
            ax.plot(np.arange(window, length + 1), smooth, label=cell)
        ax.set_title(f"{key} (training rollouts, mean of seeds, of 5 updates)", fontsize=8)
        ax.set_xlabel("update")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> None:
    args = parse_args(argv)
    if not args.report_only:
        check_flags(args, study_settings(load_results(args)[1]))
        run_untrained(args)
        report(args)
        for seed in args.seeds:  # seed-major: after the first pass every cell has a seed
            for cell in args.cells:
                run_chunk(args, cell, seed)
                report(args)  # after every chunk, so a stopped study keeps what it measured
    report(args)


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
