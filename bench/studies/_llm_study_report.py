"""The report of ``bench/studies/llm_study.py``'s study (results/<stem>.md and .png) from its finished chunks.

Per cell: the held-out accuracy pooled over its training runs, each run's accuracy, the spread between runs (their
standard deviation), and two 95% intervals: over the evaluation problems only (Wilson), and over training runs and
problems (a hierarchical bootstrap: each cell's runs resampled, then the problems, shared by every cell). The same
two kinds of interval for each cell against the untrained team, for every pair of cells and, for a complete 2x2,
its two main effects (also per training seed). With fewer than ``MIN_RUNS`` runs per cell the report says that no
interval covers training noise yet.
"""

from __future__ import annotations

import glob
import itertools
import json
import os
from collections.abc import Sequence

import numpy as np

from baselines.llm.checkpoint import current_names
from bench.common import results as _results
from deliberation_env.analysis.metrics import hierarchical_bootstrap, paired_bootstrap, wilson_interval

CURVE_KEYS = ("accuracy", "reward_format", "completion_tokens", "flat_groups")
"""the training metrics kept with each chunk's result and plotted as learning curves"""
STUDY_KEYS = ("model", "task", "task_options", "env_options", "num_agents", "max_rounds", "max_tokens", "temperature", "group_size", "joint",
              "problems_per_update", "updates", "lr", "dtype", "device", "eval_problems")
"""the settings every chunk of one study shares (each cell sets its own reward and credit, each chunk its seed)"""
MIN_RUNS = 3
"""training runs per cell below which resampling runs cannot stand for the spread between runs"""
TWO_BY_TWO = ("team-shared", "team-own", "own-shared", "own-own")


def result_path(stem: str, name: str) -> str:
    return os.path.join(_results.RESULTS, stem, f"{name}.json")


def load_results(stem: str, order: Sequence[str]) -> tuple[dict | None, dict[str, list[dict]]]:
    """The untrained team's result (or None) and every finished chunk by cell, in ``order``, runs by seed."""
    untrained = None
    if os.path.exists(result_path(stem, "untrained")):
        with open(result_path(stem, "untrained"), encoding="utf-8") as f:
            untrained = json.load(f)
    cells: dict[str, list[dict]] = {}
    for cell in order:  # every finished seed, whatever this run's --seeds
        for path in sorted(glob.glob(result_path(stem, f"{cell}-seed*"))):
            with open(path, encoding="utf-8") as f:
                cells.setdefault(cell, []).append(json.load(f))
    return untrained, cells


def study_settings(cells: dict[str, list[dict]]) -> dict | None:
    """The settings the finished chunks were trained and evaluated with, or None before the first chunk.

    The report describes these, not the flags of the run that writes it. Chunks that disagree cannot be one study."""
    configs = [current_names(result["config"]) for results in cells.values() for result in results]
    if not configs:
        return None
    settings = {key: configs[0][key] for key in STUDY_KEYS}
    for config in configs[1:]:
        differing = [key for key in STUDY_KEYS if config[key] != settings[key]]
        if differing:
            raise SystemExit(f"llm_study.py: the finished chunks in results/ differ in {', '.join(differing)}; "
                             "one study's chunks share their settings (give another setting its own --stem)")
    return settings


def run_scores(results: list[dict]) -> np.ndarray:
    """Each run's (row's) correctness on each held-out problem (column)."""
    return np.array([r["row"]["per_problem_accuracy"] for r in results], dtype=float)


def interval_text(terms: Sequence[tuple[list[dict], float]], hierarchical: bool, signed: bool = True) -> str:
    """``sum weight * accuracy`` over (runs, weight) terms with its 95% interval: over runs and problems
    (``hierarchical``), or over problems only with each problem's correctness averaged over the runs."""
    combined = sum(weight * run_scores(runs).mean(0) for runs, weight in terms)
    value, low, high = paired_bootstrap(combined, np.zeros_like(combined))
    if hierarchical:  # the same estimate (as computed here, so that both columns print it alike), another interval
        _, low, high = hierarchical_bootstrap([run_scores(runs) for runs, _ in terms], [w for _, w in terms])
    sign = "+" if signed else ""
    return f"{value:{sign}.3f} [{low:{sign}.3f}, {high:{sign}.3f}]"


def wilson_text(results: list[dict]) -> str:
    episodes = sum(r["row"]["episodes"] for r in results)
    right = sum(round(r["row"]["accuracy"] * r["row"]["episodes"]) for r in results)
    low, high = wilson_interval(right, episodes)
    return f"{right / episodes:.3f} [{low:.3f}, {high:.3f}]"


def spread_text(results: list[dict]) -> str:
    """The standard deviation of the runs' accuracies (- with one run)."""
    return f"{np.std([r['row']['accuracy'] for r in results], ddof=1):.3f}" if len(results) > 1 else "-"


def comparison_row(label: str, terms: Sequence[tuple[list[dict], float]]) -> str:
    """A comparison's two intervals (the runs + problems one left out where every term is one run: the same)."""
    both = any(len(runs) > 1 for runs, _ in terms)
    return f"| {label} | {interval_text(terms, False)} | {interval_text(terms, True) if both else '- (one run each)'} |"


def main_effect_rows(cells: dict[str, list[dict]], label: str = "") -> list[str]:
    """The 2x2's two main effects (each averaged over the other factor), as comparison rows."""
    reward = {"team-shared": 0.5, "team-own": 0.5, "own-shared": -0.5, "own-own": -0.5}
    credit = {"team-shared": 0.5, "own-shared": 0.5, "team-own": -0.5, "own-own": -0.5}
    return [comparison_row(f"main effect of the reward (team - own){label}", [(cells[c], w) for c, w in reward.items()]),
            comparison_row(f"main effect of the credit (shared - own){label}", [(cells[c], w) for c, w in credit.items()])]


def noise_note(cells: dict[str, list[dict]]) -> str:
    fewest = min(len(results) for results in cells.values())
    if fewest < MIN_RUNS:
        return (f"Training runs per cell: {fewest} at the fewest. With fewer than {MIN_RUNS} runs per cell, resampling "
                "runs cannot estimate the spread between training runs: the runs + problems intervals do not cover "
                "training noise yet, and the problems-only intervals never do; read no difference as an effect of "
                "the cell unless it exceeds the spread between runs of one cell.")
    return (f"Training runs per cell: {fewest} at the fewest. The runs + problems intervals resample each cell's "
            "training runs and then the problems (a hierarchical bootstrap), so they include training noise as far "
            "as these runs show it; the problems-only intervals leave it out.")


def yardstick(cells: dict[str, list[dict]], same_pairs: Sequence[tuple[str, str]]) -> str:
    """The gaps between finished cells that are one algorithm by construction: run-to-run noise, measured."""
    gaps = [f"{a} - {b} {interval_text([(cells[a], 1.0), (cells[b], -1.0)], False).split(' [')[0]}"
            for a, b in same_pairs if a in cells and b in cells]
    if not gaps:
        return ""
    return (f"Cells that are one algorithm wherever the answers are readable (bench/studies/llm_study.py SAME_BY_CONSTRUCTION) "
            f"differ by {', '.join(gaps)}: that gap is (nearly all) run-to-run noise, the yardstick for every other difference "
            "here.\n\n")


def report(stem: str, order: Sequence[str], fallback: dict, notes: str = "",
           same_pairs: Sequence[tuple[str, str]] = ()) -> None:
    """Write results/<stem>.md and .png from the finished chunks; ``fallback``: the settings to describe when no
    chunk is finished yet; ``notes``: what the design can and cannot show; ``same_pairs``: cells equal by
    construction, whose gap the report gives as the measure of run-to-run noise."""
    untrained, cells = load_results(stem, order)
    if not cells and untrained is None:
        print("no finished chunk yet")
        return
    lines = ["| cell | runs | held-out accuracy, pooled [Wilson 95%, problems only] | [95%, runs + problems] | "
             "per run (seed order) | spread between runs (sd) | vs untrained [95%, problems only] | "
             "vs untrained [95%, runs + problems] | tokens / problem | train min / run | eval min / run |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    if untrained is not None:
        lines.append(f"| untrained | - | {wilson_text([untrained])} | - | - | - | - | - | {untrained['row']['tokens']:.0f} "
                     f"| - | {untrained['eval_seconds'] / 60:.0f} |")
    for cell, results in cells.items():
        versus = [(results, 1.0), ([untrained], -1.0)] if untrained else None
        lines.append(
            f"| {cell} | {len(results)} | {wilson_text(results)} | {interval_text([(results, 1.0)], True, False)} | "
            + ", ".join(f"{r['row']['accuracy']:.3f}" for r in sorted(results, key=lambda r: r["seed"]))
            + f" | {spread_text(results)} | "
            f"{interval_text(versus, False) if versus else '-'} | {interval_text(versus, True) if versus else '-'} | "
            f"{np.mean([r['row']['tokens'] for r in results]):.0f} | "
            f"{np.mean([r['train_seconds'] for r in results]) / 60:.0f} | "
            f"{np.mean([r['eval_seconds'] for r in results]) / 60:.0f} |")
    pairs = ["| comparison | difference [95%, problems only] | difference [95%, runs + problems] |", "|---|---|---|"]
    pairs += [comparison_row(f"{a} - {b}", [(cells[a], 1.0), (cells[b], -1.0)]) for a, b in itertools.combinations(cells, 2)]
    if set(TWO_BY_TWO) <= set(cells):
        pairs += main_effect_rows(cells)
        seeds = sorted(set.intersection(*({r["seed"] for r in cells[cell]} for cell in TWO_BY_TWO)))
        if len(seeds) > 1:  # do the training seeds agree?
            for seed in seeds:
                pairs += main_effect_rows({c: [r for r in cells[c] if r["seed"] == seed] for c in TWO_BY_TWO},
                                          f", seed {seed} only")
    settings = study_settings(cells) or fallback
    options = settings["task_options"]
    task = settings.get("task", "arithmetic")
    prompt = (f"the {options['prompt']} prompt" if task == "arithmetic"
              else "each agent seeing one person's count (roles view_k)")
    finished = (f"Learning curves: {stem}.png. Chunks finished: {', '.join(f'{c} x {len(r)}' for c, r in cells.items())}."
                if cells else "No chunk has finished yet: the untrained team only.")
    body = (f"Team of {settings['num_agents']} x {os.path.basename(settings['model'])} (one LoRA adapter each, "
            f"{settings['dtype']}, {settings['device']}), {task} levels {list(options['levels'])} with "
            f"{prompt}, debate with {settings['max_rounds']} round, {settings['max_tokens']} tokens per "
            f"answer at temperature {settings['temperature']:g}, {settings['joint']}ed trees of G={settings['group_size']} "
            f"x {settings['problems_per_update']} problems per update, {settings['updates']} updates, lr {settings['lr']:g}, "
            f"grpo normalisation in every cell; {settings['eval_problems']} held-out test problems, the same for every "
            "row (1 evaluation seed each):\n\n" + "\n".join(lines) + "\n\n" + (noise_note(cells) if cells else "")
            + "\n\n" + yardstick(cells, same_pairs) + notes
            + "\n\nDifferences (paired per problem; problems only: each problem's correctness averaged over the runs):\n\n"
            + "\n".join(pairs) + "\n\n" + finished)
    if cells:
        plot_curves(cells, os.path.join(_results.RESULTS, f"{stem}.png"))
    _results.save_markdown(stem, "LLM fine-tuning, reward x credit (bench/studies/llm_study.py)", body)


def plot_curves(cells: dict[str, list[dict]], path: str) -> None:
    from baselines.evaluation.evaluate import headless_pyplot

    plt = headless_pyplot()
    fig, axes = plt.subplots(1, len(CURVE_KEYS), figsize=(4 * len(CURVE_KEYS), 3))
    shortest = min((len(r["curve"]) for results in cells.values() for r in results), default=0)
    window = 5 if shortest >= 10 else 1  # a short run's few updates are shown as they are, one marker each
    for ax, key in zip(axes, CURVE_KEYS):
        for cell, results in cells.items():
            runs = [r["curve"] for r in results]
            length = min(len(rows) for rows in runs)
            values = np.mean([[row.get(key, np.nan) for row in rows[:length]] for rows in runs], axis=0)
            smooth = np.convolve(values, np.ones(window) / window, mode="valid") if window > 1 else values
            ax.plot(np.arange(window, length + 1), smooth, marker="o" if window == 1 else None, label=cell)
        span = f", rolling mean of {window} updates" if window > 1 else ""
        ax.set_title(f"{key} (training rollouts, mean of runs{span})", fontsize=8)
        ax.set_xlabel("update")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
