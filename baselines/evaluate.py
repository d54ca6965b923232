"""Evaluate learned checkpoints and fixed protocols side by side on a fixed test set.

Every entry plays test problems ``problem_index = 0..P-1`` with episode seed
``seed * 100003 + index`` for each evaluation seed (the seeding of ``bench/protocols.py``).
Reported per entry: accuracy (final consensus correct, ``infos["consensus_correct"]``; for
environments without it, the mean per-agent episode return as ``score``), tokens per problem
(sum of ``infos["tokens"]``), meta-action shares, each as the mean over seeds with a 95%
t-interval half-width across seeds. Learned policies act greedily unless ``--sample``.

    python -m baselines.evaluate --checkpoints sft=runs/x/sft/policy.pt softrankpo=runs/x/policy.pt \\
        --protocols all --problems 200 --seeds 0 1 --out runs/x/eval --metrics runs/x
"""

from __future__ import annotations

import argparse
import csv
import os
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from scipy import stats

from baselines.common import Policy, load_checkpoint, load_policy
from baselines.logger import read_metrics
from baselines.protocols import PROTOCOLS, FixedProtocol, make_protocol

ACTION_NAMES = ("persist", "refine", "concede")


class PolicyActor:
    """A learned policy behind the protocol interface ``reset(seed)`` / ``act(obs, infos)``."""

    def __init__(self, policy: Policy, deterministic: bool = True):
        self.policy, self.deterministic = policy, deterministic
        self.generator = torch.Generator().manual_seed(0)

    def reset(self, seed: int | None = None) -> None:
        if seed is not None:
            self.generator.manual_seed(seed)

    def act(self, observations: dict[str, Any], infos: dict[str, Any]) -> dict[str, int]:
        return self.policy.act(observations, self.deterministic, self.generator)


def play(env: Any, actor: PolicyActor | FixedProtocol, problems: int, seed: int,
         index_option: str | None = "problem_index") -> dict[str, float]:
    """One evaluation seed: accuracy (or score), tokens per problem and action shares."""
    correct, score, tokens, actions, has_flag = 0.0, 0.0, 0.0, Counter(), False
    for index in range(problems):
        episode_seed = seed * 100_003 + index
        actor.reset(episode_seed)
        options = {index_option: index} if index_option else None
        obs, infos = env.reset(seed=episode_seed, options=options)
        tokens += sum(info.get("tokens", 0) for info in infos.values())
        total_reward = 0.0
        agents = max(1, len(env.possible_agents))
        while env.agents:
            chosen = actor.act(obs, infos)
            actions.update(chosen.values())
            obs, rewards, _, _, infos = env.step(chosen)
            total_reward += sum(rewards.values())
            tokens += sum(info.get("tokens", 0) for info in infos.values())
        flags = [info["consensus_correct"] for info in infos.values() if "consensus_correct" in info]
        has_flag = has_flag or bool(flags)
        correct += bool(flags[0]) if flags else 0.0
        score += total_reward / agents
    total = sum(actions.values()) or 1
    result = {"accuracy": correct / problems if has_flag else float("nan"), "score": score / problems,
              "tokens": tokens / problems}
    result.update({f"p_{name}": actions[i] / total for i, name in enumerate(ACTION_NAMES)})
    return result


def summarize(name: str, runs: Sequence[dict[str, float]]) -> dict[str, Any]:
    """Mean and 95% t-interval half-width across seeds for every metric."""
    row: dict[str, Any] = {"name": name, "seeds": len(runs)}
    for key in runs[0]:
        values = np.array([r[key] for r in runs], dtype=float)
        row[key] = float(values.mean())
        half = stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values)) if len(values) > 1 else 0.0
        row[f"{key}_ci"] = float(half)
    return row


def evaluate_entries(entries: Sequence[tuple[str, Callable[[], Any], Callable[[], Any]]], problems: int,
                     seeds: Sequence[int], index_option: str | None = "problem_index") -> list[dict[str, Any]]:
    """entries: (name, make_actor, make_env). Returns one summary row per entry."""
    rows = []
    for name, make_actor, make_env in entries:
        env = make_env()
        rows.append(summarize(name, [play(env, make_actor(), problems, seed, index_option) for seed in seeds]))
        env.close()
    return rows


def standard_entries(checkpoints: dict[str, str], protocols: Sequence[str], env_kwargs: dict[str, Any],
                     deterministic: bool = True) -> list[tuple[str, Callable[[], Any], Callable[[], Any]]]:
    """Entries for learned checkpoints and named protocols on deliberation_env (``single`` with one agent)."""
    import deliberation_env

    def env_for(agents: int | None = None):
        kwargs = dict(env_kwargs)
        if agents is not None:
            kwargs["num_agents"] = agents
        return lambda: deliberation_env.parallel_env(**kwargs)

    entries = []
    for name, path in checkpoints.items():
        agents = load_checkpoint(path)["layout"]["num_peers"] + 1
        entries.append((name, lambda p=path: PolicyActor(load_policy(p), deterministic), env_for(agents)))
    for proto in protocols:
        entries.append((proto, lambda p=proto: make_protocol(p), env_for(1 if proto == "single" else None)))
    return entries


# ----------------------------------------------------------------------------- tables and plots
def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    foreign = all(np.isnan(r["accuracy"]) for r in rows)
    head = "score (mean return)" if foreign else "accuracy"
    key = "score" if foreign else "accuracy"
    lines = [f"| policy | {head} | tokens / problem | PERSIST | REFINE | CONCEDE | seeds |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r[key]:.3f} ± {r[key + '_ci']:.3f} | {r['tokens']:.0f} ± {r['tokens_ci']:.0f} | "
                     f"{r['p_persist']:.2f} | {r['p_refine']:.2f} | {r['p_concede']:.2f} | {r['seeds']} |")
    return "\n".join(lines)


def save_table(rows: Sequence[dict[str, Any]], out: str, stem: str = "table") -> str:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{stem}.csv"), "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    text = markdown_table(rows)
    with open(os.path.join(out, f"{stem}.md"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    return text


def headless_pyplot():
    """matplotlib.pyplot on the Agg backend, so plots save without a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_accuracy_vs_tokens(rows: Sequence[dict[str, Any]], path: str, title: str = "accuracy vs tokens") -> str:
    plt = headless_pyplot()

    key = "score" if all(np.isnan(r["accuracy"]) for r in rows) else "accuracy"
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for r in rows:
        ax.errorbar(r["tokens"], r[key], xerr=r["tokens_ci"], yerr=r[f"{key}_ci"], fmt="o", capsize=3)
        ax.annotate(r["name"], (r["tokens"], r[key]), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlabel("tokens per problem")
    ax.set_ylabel(key)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_learning_curves(runs: dict[str, str], path: str, metric: str = "accuracy", smooth: int = 10) -> str:
    """One curve per run directory / metrics.jsonl: ``metric`` (falls back to episode_return) vs episodes,
    as a running mean over ``smooth`` batches (the raw values faint behind it)."""
    plt = headless_pyplot()

    fig, ax = plt.subplots(figsize=(6, 4.2))
    for name, source in runs.items():
        rows = [r for r in read_metrics(source) if metric in r or "episode_return" in r]
        key = metric if any(metric in r for r in rows) else "episode_return"
        rows = [r for r in rows if key in r]
        if rows:
            steps, values = np.array([r["step"] for r in rows]), np.array([r[key] for r in rows], dtype=float)
            width = max(1, min(smooth, len(values)))
            mean = np.convolve(values, np.ones(width) / width, mode="valid")
            line = ax.plot(steps[width - 1 :], mean, label=f"{name} ({key}, mean of {width})")[0]
            ax.plot(steps, values, color=line.get_color(), alpha=0.2, linewidth=0.8)
    ax.set_xlabel("training episodes")
    ax.set_ylabel(metric + " (training rollouts)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _named(items: Sequence[str]) -> dict[str, str]:
    named = {}
    for item in items:
        name, _, path = item.rpartition("=")
        folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
        named[name or os.path.basename(os.path.normpath(folder)) or path] = path
    return named


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoints", nargs="*", default=[], help="[name=]path of policy.pt checkpoints")
    parser.add_argument("--protocols", nargs="*", default=["all"], help=f"fixed protocols: all, none or some of {PROTOCOLS}")
    parser.add_argument("--problems", type=int, default=200, help="test problems 0..P-1 (default 200)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="evaluation seeds (default 0 1)")
    parser.add_argument("--task", default="arithmetic")
    parser.add_argument("--backend", default="sim")
    parser.add_argument("--split", default="test")
    parser.add_argument("--max-rounds", type=int, default=3)
    parser.add_argument("--sample", action="store_true", help="sample learned policies' actions instead of argmax")
    parser.add_argument("--metrics", nargs="*", default=[], help="[name=]run dir or metrics.jsonl for learning curves")
    parser.add_argument("--out", default="runs/eval", help="where table.md/.csv and the PNG plots go")
    args = parser.parse_args(argv)
    protocols = list(PROTOCOLS) if args.protocols == ["all"] else [p for p in args.protocols if p != "none"]
    env_kwargs = {"task": args.task, "backend": args.backend, "split": args.split, "max_rounds": args.max_rounds}
    entries = standard_entries(_named(args.checkpoints), protocols, env_kwargs, deterministic=not args.sample)
    if not entries:
        parser.error("nothing to evaluate: give --checkpoints and/or --protocols")
    rows = evaluate_entries(entries, args.problems, args.seeds)
    print(save_table(rows, args.out))
    plot_accuracy_vs_tokens(rows, os.path.join(args.out, "accuracy_vs_tokens.png"))
    if args.metrics:
        plot_learning_curves(_named(args.metrics), os.path.join(args.out, "learning_curves.png"))
    print(f"saved {args.out}/table.md, table.csv, accuracy_vs_tokens.png"
          + (", learning_curves.png" if args.metrics else ""))
    return rows


if __name__ == "__main__":
    main()
