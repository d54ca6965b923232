"""Evaluation and plots of ``baselines.llm.train_llm``: the team before, during (``--eval-every``) and after
fine-tuning, through the evaluation both products share (``baselines.evaluation.evaluate``), with Wilson 95% intervals on
the pooled accuracy."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from typing import Any

import numpy as np

from baselines.llm.config import LLMTrainConfig, text_env_kwargs
from deliberation_env.analysis.metrics import wilson_interval


def meta_env(cfg: LLMTrainConfig, backends: Sequence[Any] | None, check_problems: bool = False) -> Any:
    """The meta-action env on the test split with the training settings, the agents answered by ``backends``
    (one per agent; None: the sim backend, for checking the settings). The meta-policy's schedule becomes the
    protocol of the same name (``deliberation_env.protocols``)."""
    import deliberation_env
    from deliberation_env.text_rewards import split_weights

    kwargs = text_env_kwargs(cfg, "test")
    kwargs = {k: v for k, v in kwargs.items() if k not in ("critic", "max_action_chars", "max_prompt_chars", "count_tokens")}
    round_weights, _ = split_weights(cfg.reward_weights or None)
    env = deliberation_env.parallel_env(backend=list(backends) if backends is not None else "sim",
                                        reward_weights=round_weights, **kwargs)
    if check_problems:
        from baselines.evaluation.evaluate import check_problem_count

        check_problem_count(env, cfg.eval_problems)
    return env


def evaluate_team(name: str, backends: Sequence[Any], cfg: LLMTrainConfig) -> dict[str, Any]:
    """One evaluation row (``baselines.evaluation.evaluate.evaluate_entries``) of the team answered by ``backends``, plus
    ``accuracy_low``/``accuracy_high``: the Wilson 95% interval over all problems and seeds."""
    from baselines.evaluation.evaluate import evaluate_entries
    from deliberation_env.protocols import make_protocol

    seeds = list(range(cfg.eval_seeds))
    episodes = cfg.eval_problems * len(seeds)
    row = evaluate_entries([(name, lambda: make_protocol(cfg.meta_policy), lambda: meta_env(cfg, backends))],
                           cfg.eval_problems, seeds, batch_size=min(32, episodes), progress=cfg.progress)[0]
    row["accuracy_low"], row["accuracy_high"] = wilson_interval(round(row["accuracy"] * episodes), episodes)
    row["episodes"] = episodes
    return row


def comparison_table(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = ["| team | accuracy | 95% CI (Wilson) | tokens / problem | problems x seeds |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['accuracy']:.3f} | [{r['accuracy_low']:.3f}, {r['accuracy_high']:.3f}] | "
                     f"{r['tokens']:.0f} ± {r['tokens_ci']:.0f} | {r['episodes']} |")
    return "\n".join(lines)


def save_comparison(rows: Sequence[dict[str, Any]], out: str, cfg: LLMTrainConfig) -> str:
    """``table.md/.csv`` (the meta-policy evaluation's table) and ``before_after.md`` (Wilson intervals)."""
    from baselines.evaluation.evaluate import save_table

    save_table(rows, out)
    text = (f"Team of {cfg.num_agents} x {cfg.model} ({cfg.meta_policy}), {cfg.task} test split, {cfg.eval_problems} "
            f"problems x {cfg.eval_seeds} seeds, before and after {cfg.updates} {cfg.algo} updates:\n\n"
            + comparison_table(rows))
    with open(os.path.join(out, "before_after.md"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    return text


def plot_reward_curves(rows: Sequence[Mapping[str, Any]], path: str) -> str:
    """One panel per reward term (``reward_<name>``, per-agent episode means) and the team's accuracy and return
    against updates."""
    from baselines.evaluation.evaluate import headless_pyplot

    plt = headless_pyplot()
    keys = [k for k in ("accuracy", "team_return") if any(k in r for r in rows)]
    keys += sorted({k for r in rows for k in r if k.startswith("reward_")})
    columns = 3
    lines = max(1, -(-len(keys) // columns))
    fig, axes = plt.subplots(lines, columns, figsize=(4 * columns, 2.6 * lines), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        steps = np.array([r["step"] for r in rows if key in r])
        values = np.array([r[key] for r in rows if key in r], dtype=float)
        ax.plot(steps, values, marker="." if len(values) < 30 else None)
        ax.set_title(key, fontsize=9)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("update")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def report(cfg: LLMTrainConfig, progress: Any, checkpoint: str, backend_kwargs: dict[str, Any]) -> None:
    """After training (the main process): the settings next to the checkpoint, the reward curves, and with
    ``--evaluate`` the reloaded checkpoint's evaluation next to the one before training and the best ``--eval-every``
    team (``progress``: ``baselines.llm.checkpoint.Progress``)."""
    from baselines.llm.policy import team_backends

    with open(os.path.join(checkpoint, "train_config.json"), "w", encoding="utf-8") as f:
        json.dump(asdict(cfg), f, indent=2, default=str)
    if progress.rows:
        plot_reward_curves(progress.rows, os.path.join(cfg.out, "reward_curves.png"))
    if cfg.evaluate:
        rows = list(progress.evaluations)
        if progress.best is not None:
            best = {k: v for k, v in progress.best.items() if k != "update"}
            rows.append({**best, "name": f"best (update {progress.best['update']})"})
        rows.append(evaluate_team("after", team_backends(checkpoint, **backend_kwargs), cfg))
        print(save_comparison(rows, os.path.join(cfg.out, "eval"), replace(cfg, updates=progress.update)))
