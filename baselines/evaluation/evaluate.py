"""Evaluation on a fixed test set, shared by both products: episode records, per-seed metrics, bootstrap summaries,
tables and plots.

Every entry plays test problems ``problem_index = 0..P-1`` with episode seed
``seed * 100003 + index`` for each evaluation seed (``episode_seed``; the seeding of ``bench/studies/protocols.py``).
Reported per entry: accuracy (final consensus correct, ``infos["consensus_correct"]``; for
environments without it, the mean per-agent episode return as ``score``), tokens per problem
(sum of ``infos["tokens"]``), meta-action shares, each as the mean over all episodes; accuracy, score and
tokens with a 95% per-problem bootstrap interval (``summarize``). An entry is (name, make_actor, make_env), an
actor anything with ``reset(seed)`` and ``act(observations, infos)``: a fixed protocol, a learned meta-policy
(``baselines.meta.evaluate.PolicyActor``, the CLI ``python -m baselines.meta.evaluate``), a team of LLMs behind a
protocol (``baselines.llm.evaluation``). Episodes are played by the library's episode runner
(``deliberation_env.vector.run_episodes``).
"""

from __future__ import annotations

import csv
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from baselines.logger import progress_bar, read_metrics
from deliberation_env.analysis.metrics import bootstrap_interval
from deliberation_env.core.deliberation import Action
from deliberation_env.vector import Start, Step, run_episodes

ACTION_NAMES = tuple(action.name.lower() for action in Action)
"""The meta-actions in index order, as the ``p_<name>`` columns name them."""


class Actor(Protocol):
    """What plays an entry: reset with each episode's seed, then asked for every round's actions."""

    def reset(self, seed: int | None = None) -> None: ...

    def act(self, observations: Any, infos: Any) -> Mapping[str, Any]: ...


def episode_seed(seed: int, index: int) -> int:
    """The reset seed of test problem ``index`` under evaluation seed ``seed``."""
    return seed * 100_003 + index


def play_episodes(envs: Sequence[Any], actors: Sequence[Actor], episodes: Sequence[tuple[int, int]],
                  index_option: str | None = "problem_index", progress: str | None = None) -> list[dict[str, Any]]:
    """Play ``episodes`` ((reset seed, problem index) pairs) in waves of ``len(envs)`` (the library's episode runner,
    ``deliberation_env.vector.run_episodes``), env i acted on by actor i, which is reset with the episode's seed: an episode's
    actions do not depend on the wave it is in. One record per episode: ``correct`` (None without
    ``consensus_correct``), ``reward`` (sum over agents and rounds), ``tokens``, ``actions`` (a Counter), ``rounds``
    (a Counter of actions per round) and ``agents``. ``progress``: show a progress bar with this label (for live
    models)."""
    records: list[dict[str, Any]] = []
    bar = progress_bar(len(episodes), progress or "", enabled=progress is not None)

    def act(steps: list[Step]) -> list[Mapping[str, Any]]:
        return [actors[step.slot].act(step.observations, step.infos) for step in steps]

    def on_step(step: Step) -> None:
        if step.actions is None:
            actors[step.slot].reset(episodes[step.episode][0])
            records.append({"reward": 0.0, "actions": Counter(), "rounds": [], "tokens": 0,
                            "agents": max(1, len(step.env.possible_agents))})
        record = records[step.episode]
        if step.actions is not None:
            record["actions"].update(step.actions.values())
            record["rounds"].append(Counter(step.actions.values()))
            record["reward"] += sum(step.rewards.values())
        record["tokens"] += sum(info.get("tokens", 0) for info in step.infos.values())
        if step.done:
            flags = [info["consensus_correct"] for info in step.infos.values() if "consensus_correct" in info]
            record["correct"] = bool(flags[0]) if flags else None
            bar.update(1)

    run_episodes(envs, [Start(seed, {index_option: index} if index_option else None) for seed, index in episodes], act, on_step)
    bar.close()
    return [{key: r[key] for key in ("correct", "reward", "tokens", "actions", "rounds", "agents")} for r in records]


def seed_metrics(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """One evaluation seed's accuracy (or NaN), score (mean per-agent return), tokens per problem, action shares."""
    problems = len(records)
    correct, score, tokens, has_flag = 0.0, 0.0, 0.0, False
    actions: Counter[int] = Counter()
    for record in records:
        has_flag = has_flag or record["correct"] is not None
        correct += bool(record["correct"])
        score += record["reward"] / record["agents"]
        tokens += record["tokens"]
        for index, count in record["actions"].items():  # a CONCEDE to a named peer (index 3 + k) is a CONCEDE
            actions[min(int(index), Action.CONCEDE)] += count
    total = sum(actions.values()) or 1
    result = {"accuracy": correct / problems if has_flag else float("nan"), "score": score / problems,
              "tokens": tokens / problems}
    result.update({f"p_{name}": actions[i] / total for i, name in enumerate(ACTION_NAMES)})
    return result


def play_records(env: Any, actor: Actor, problems: int, seed: int,
                 index_option: str | None = "problem_index") -> list[dict[str, Any]]:
    """One evaluation seed on one env, problem after problem: one record per problem (see ``play_episodes``)."""
    return play_episodes([env], [actor], [(episode_seed(seed, index), index) for index in range(problems)], index_option)


def play(env: Any, actor: Actor, problems: int, seed: int, index_option: str | None = "problem_index") -> dict[str, float]:
    """One evaluation seed's metrics (``seed_metrics`` of ``play_records``; ``evaluate_entries`` plays many problems
    at once and gives the same numbers)."""
    return seed_metrics(play_records(env, actor, problems, seed, index_option))


def summarize(name: str, seed_records: Sequence[Sequence[dict[str, Any]]]) -> dict[str, Any]:
    """One row from each evaluation seed's episode records (the same problems, in the same order, per seed): the
    mean of every metric over all episodes, and for accuracy, score and tokens a 95% interval from a per-problem
    bootstrap (each problem's value averaged over the seeds, problems resampled): ``{key}_low``, ``{key}_high``
    and ``{key}_ci`` (half its width, for plots). Seeds of one problem are not independent draws, so they are
    never counted as separate samples."""
    runs = [seed_metrics(records) for records in seed_records]
    row: dict[str, Any] = {"name": name, "seeds": len(runs), "problems": len(seed_records[0])}
    per_problem = {
        "accuracy": np.mean([[np.nan if r["correct"] is None else float(r["correct"]) for r in records]
                             for records in seed_records], axis=0),
        "score": np.mean([[r["reward"] / r["agents"] for r in records] for records in seed_records], axis=0),
        "tokens": np.mean([[r["tokens"] for r in records] for records in seed_records], axis=0),
    }
    row["per_problem_accuracy"] = per_problem["accuracy"].tolist()  # for paired comparisons (not in the CSV)
    for key in runs[0]:
        row[key] = float(np.mean([r[key] for r in runs]))
        if key in per_problem:
            low, high = bootstrap_interval(per_problem[key])
            row[f"{key}_low"], row[f"{key}_high"], row[f"{key}_ci"] = low, high, (high - low) / 2
    return row


def evaluate_entries(entries: Sequence[tuple[str, Callable[[], Any], Callable[[], Any]]], problems: int,
                     seeds: Sequence[int], index_option: str | None = "problem_index", batch_size: int = 32,
                     cache: Any = None, progress: bool = False) -> list[dict[str, Any]]:
    """entries: (name, make_actor, make_env). Returns one summary row per entry.

    Each entry plays its ``problems x len(seeds)`` episodes on ``batch_size`` envs at a time (one actor per
    env), so a backend answers up to ``batch_size`` episodes per call; the numbers do not depend on
    ``batch_size``. With ``cache`` (the ``CachedBackend`` the entries' envs share), each row also gets the
    entry's ``cache_hits`` and ``cache_misses``. ``progress``: a progress bar per entry (for live models)."""
    if problems < 1 or batch_size < 1 or not seeds:
        raise ValueError(f"problems and batch_size must be >= 1 and seeds non-empty, got {problems}, {batch_size}, {seeds}")
    episodes = [(episode_seed(seed, index), index) for seed in seeds for index in range(problems)]
    rows = []
    for name, make_actor, make_env in entries:
        envs = [make_env() for _ in range(min(batch_size, len(episodes)))]
        before = (cache.stats.hits, cache.stats.misses) if cache is not None else (0, 0)
        records = play_episodes(envs, [make_actor() for _ in envs], episodes, index_option,
                                progress=f"evaluating {name}" if progress else None)
        row = summarize(name, [records[i * problems : (i + 1) * problems] for i in range(len(seeds))])
        if cache is not None:
            row.update(cache_hits=cache.stats.hits - before[0], cache_misses=cache.stats.misses - before[1])
        rows.append(row)
        for env in envs:
            env.close()
    return rows


def open_trace(path: str | None) -> Any:
    """A ``TraceWriter`` appending to ``path`` (None without a path)."""
    if not path:
        return None
    from deliberation_env.analysis.traces import TraceWriter

    return TraceWriter(path)


# ----------------------------------------------------------------------------- tables and plots
def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    foreign = all(np.isnan(r["accuracy"]) for r in rows)
    head = "score (mean return)" if foreign else "accuracy"
    key = "score" if foreign else "accuracy"
    lines = [f"| policy | {head} [95% CI] | tokens / problem [95% CI] | PERSIST | REFINE | CONCEDE | problems x seeds |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r[key]:.3f} {_interval(r, key, '.3f')} | {r['tokens']:.0f} "
                     f"{_interval(r, 'tokens', '.0f')} | {r['p_persist']:.2f} | {r['p_refine']:.2f} | "
                     f"{r['p_concede']:.2f} | {r.get('problems', '?')} x {r['seeds']} |")
    return "\n".join(lines)


def _interval(row: dict[str, Any], key: str, spec: str) -> str:
    """``[low, high]`` when the row has them, else ``± half-width``."""
    if f"{key}_low" in row:
        return f"[{row[f'{key}_low']:{spec}}, {row[f'{key}_high']:{spec}}]"
    return f"± {row[f'{key}_ci']:{spec}}"


def save_table(rows: Sequence[dict[str, Any]], out: str, stem: str = "table", header: str = "") -> str:
    """Write ``<stem>.csv`` and ``<stem>.md`` (the markdown table under ``header``, when given) and return the latter's
    text."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{stem}.csv"), "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=[k for k, v in rows[0].items() if not isinstance(v, list)],
                                extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    text = f"{header}\n\n{markdown_table(rows)}" if header else markdown_table(rows)
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
    """Save ``accuracy_vs_tokens_figure(rows, title)`` as a PNG."""
    plt = headless_pyplot()
    fig = accuracy_vs_tokens_figure(rows, title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def accuracy_vs_tokens_figure(rows: Sequence[dict[str, Any]], title: str = "accuracy vs tokens"):
    """One point per row with its 95% intervals (accuracy intervals clipped to [0, 1], y axis within
    [0, 1.02]); names in a legend beside the axes, so they never overlap."""
    plt = headless_pyplot()

    key = "score" if all(np.isnan(r["accuracy"]) for r in rows) else "accuracy"
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    markers = "osD^vP*Xh<>p"
    lows = []
    for i, r in enumerate(rows):
        value, half = r[key], r[f"{key}_ci"]
        below, above = (min(half, value), min(half, 1.0 - value)) if key == "accuracy" else (half, half)
        lows.append(value - below)
        ax.errorbar(r["tokens"], value, xerr=r["tokens_ci"], yerr=[[max(0.0, below)], [max(0.0, above)]],
                    fmt=markers[i % len(markers)], capsize=3, color=f"C{i % 10}", label=r["name"])
    if key == "accuracy":
        finite = [low for low in lows if np.isfinite(low)]
        ax.set_ylim(max(0.0, min(finite, default=0.0) - 0.05), 1.02)
    ax.set_xlabel("tokens per problem")
    ax.set_ylabel(key)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    fig.tight_layout()
    return fig


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
    if ax.get_lines():
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def check_problem_count(env: Any, problems: int) -> None:
    """ValueError when the env's split has fewer than ``problems`` problems."""
    available = len(env.problems)
    if problems > available:
        raise ValueError(f"{problems} problems asked for, but task {env.task.name!r} has only {available} in split "
                         f"{env.split!r}; ask for at most {available}")


def cache_line(rows: Sequence[dict[str, Any]], backend: Any) -> str:
    """``cache FILE: entry H hits / M misses, ...`` (round-0 generations are shared between entries)."""
    parts = [f"{r['name']} {r['cache_hits']} hits / {r['cache_misses']} misses" for r in rows if "cache_hits" in r]
    return f"cache {backend.path}: " + ", ".join(parts)
