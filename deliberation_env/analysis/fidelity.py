"""How faithful a calibrated sim is: replay held-out traced episodes on it and compare.

``compare(episodes, sim_config, outdir, make_env)`` replays every held-out episode on the sim (same task and
settings, problem, episode seed, agents, rounds, options, and the protocol named by its label),
then reports per protocol the accuracy and tokens, real vs sim; the Spearman correlation of the
protocols' accuracy ranking; the REFINE transition rates and the confidence AUROC, real vs sim.
It writes ``report.md``, ``report.png`` and the sim's own trace (``sim_traces.jsonl``) to ``outdir``
and returns the Markdown. Used by ``python -m deliberation_env.analysis.calibrate --compare``.

The envs come from ``make_env``, a factory with ``parallel_env``'s keywords (``EnvMaker``): analysis sits below
the factories in ``deliberation_env.make`` (which wrap envs in ``analysis.traces.TraceWrapper``), so the caller
hands one in (the program ``analysis.calibrate`` hands ``parallel_env``).
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from deliberation_env.analysis.metrics import auroc, spearman
from deliberation_env.analysis.traces import Episode, TraceWriter, read_traces
from deliberation_env.core.deliberation import Action
from deliberation_env.protocols import PROTOCOLS, make_protocol
from deliberation_env.tasks.base import Problem


class EnvMaker(Protocol):
    """Builds an env from ``parallel_env``'s keywords (``deliberation_env.make.parallel_env`` is one), ``trace=`` and
    ``trace_label=`` among them."""

    def __call__(self, **keywords: Any) -> Any: ...


def __getattr__(name: str) -> Any:
    if name == "EnvFactory":
        raise AttributeError("deliberation_env.analysis.fidelity.EnvFactory was renamed EnvMaker (a maker of envs from "
                             "parallel_env's keywords); baselines.meta.config.EnvFactory is another thing")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def summarize(episodes: Sequence[Episode]) -> dict[str, Any]:
    """Per label: accuracy (final consensus), tokens per episode, episodes; overall refine rates and AUROC."""
    by_label: dict[str, list[Episode]] = defaultdict(list)
    for episode in episodes:
        by_label[episode.label or "(no label)"].append(episode)
    protocols = {
        label: {
            "episodes": len(group),
            "accuracy": float(np.mean([e.rounds[-1].consensus_correct for e in group])),
            "tokens": float(np.mean([_episode_tokens(e) for e in group])),
        }
        for label, group in sorted(by_label.items())
    }
    fixed = {"wrong_to_right": [0, 0], "right_to_wrong": [0, 0]}
    right_conf: list[float] = []
    wrong_conf: list[float] = []
    for episode in episodes:
        for before, after in zip(episode.rounds, episode.rounds[1:]):
            for agent_before, agent in zip(before.agents, after.agents):
                if agent.action == Action.REFINE.name:
                    key = "right_to_wrong" if agent_before.correct else "wrong_to_right"
                    fixed[key][0] += agent.correct != agent_before.correct
                    fixed[key][1] += 1
        for rnd in episode.rounds:
            for agent in rnd.agents:
                if agent.answer is not None and any(r.kind == "critic" for r in agent.requests):
                    (right_conf if agent.correct else wrong_conf).append(agent.confidence)
    rates = {key: (changed / total if total else float("nan")) for key, (changed, total) in fixed.items()}
    return {"protocols": protocols, **rates, "auroc": auroc(right_conf, wrong_conf)}


def _episode_tokens(episode: Episode) -> int:
    return sum(r.prompt_tokens + r.completion_tokens for rnd in episode.rounds for a in rnd.agents for r in a.requests)


def replay_on_sim(episodes: Sequence[Episode], sim_config: str | os.PathLike, trace_path: Path,
                  make_env: EnvMaker) -> tuple[list[Episode], list[str]]:
    """Play each episode's protocol on the sim with the episode's problem and seed, in envs from ``make_env``;
    returns (sim episodes, notes)."""
    from deliberation_env.backends.sim import SimBackend

    backend = SimBackend(config=sim_config)
    notes: list[str] = []
    skipped = sorted({e.label for e in episodes if e.label not in PROTOCOLS}, key=str)
    if skipped:
        notes.append(f"labels that name no fixed protocol are not replayed: {skipped}")
    envs: dict[str, Any] = {}
    trace_path.unlink(missing_ok=True)
    with TraceWriter(trace_path) as writer:
        for episode in episodes:
            if episode.label not in PROTOCOLS:
                continue
            options = dict(episode.options)
            if options.get("confidence") == "answer_logprobs":  # the sim models confidence by its critic
                options["confidence"] = "critic"
                if "answer_logprobs" not in " ".join(notes):
                    notes.append("answer_logprobs confidence is replayed with the sim's critic (its tokens count)")
            key = repr((episode.task, sorted(episode.task_settings.items()), episode.split, episode.num_agents,
                        episode.max_rounds, sorted(options.items()), episode.label))
            if key not in envs:
                env = make_env(
                    task=episode.task, task_kwargs=episode.task_settings, split=episode.split, backend=backend,
                    num_agents=episode.num_agents, max_rounds=episode.max_rounds, trace=writer,
                    trace_label=episode.label, **options)
                envs[key] = (env, {p.id: p for p in env.problems})
            env, problems = envs[key]
            if episode.problem_id not in problems:
                raise ValueError(f"problem {episode.problem_id!r} is not in split {episode.split!r} of task "
                                 f"{episode.task!r} with settings {episode.task_settings}")
            play_protocol(env, make_protocol(episode.label), [(problems[episode.problem_id], episode.seed)])
    return read_traces(trace_path), notes


def play_protocol(env: Any, protocol: Any, episodes: Sequence[tuple[Problem, int]]) -> None:
    """Play ``protocol`` on ``env`` (a ``DeliberationEnv``), one episode per (problem, episode seed), one after the
    other (the episode runner, ``deliberation_env.vector.run_episodes``); the protocol is reset with each
    episode's seed."""
    from deliberation_env.vector import Start, Step, run_episodes

    def on_step(step: Step) -> None:
        if step.actions is None:
            protocol.reset(episodes[step.episode][1] % 2**32)

    run_episodes([env], [Start(seed, problem=problem) for problem, seed in episodes],
                 lambda steps: [protocol.act(step.observations, step.infos) for step in steps], on_step)


def compare(episodes: Sequence[Episode], sim_config: str | os.PathLike, outdir: Path, make_env: EnvMaker) -> str:
    """Replay ``episodes`` on the sim of ``sim_config`` in envs from ``make_env``; write report.md and report.png to
    ``outdir``."""
    if not episodes:
        raise ValueError("the held-out traces hold no episodes")
    outdir.mkdir(parents=True, exist_ok=True)
    simulated, notes = replay_on_sim(episodes, sim_config, outdir / "sim_traces.jsonl", make_env)
    real, sim = summarize([e for e in episodes if e.label in PROTOCOLS]), summarize(simulated)
    labels = [label for label in real["protocols"] if label in sim["protocols"]]
    shown = os.fspath(sim_config)  # relative to the working folder when inside it: reports travel
    if os.path.isabs(shown) and not os.path.relpath(shown).startswith(os.pardir):
        shown = os.path.relpath(shown)
    lines = [f"# Sim fidelity: {len(episodes)} held-out episodes, sim config {shown}", "",
             "| protocol | episodes | accuracy real | accuracy sim | tokens real | tokens sim |", "|---|---|---|---|---|---|"]
    for label in labels:
        r, s = real["protocols"][label], sim["protocols"][label]
        lines.append(f"| {label} | {r['episodes']} | {r['accuracy']:.3f} | {s['accuracy']:.3f} | "
                     f"{r['tokens']:.0f} | {s['tokens']:.0f} |")
    rho = spearman([real["protocols"][k]["accuracy"] for k in labels], [sim["protocols"][k]["accuracy"] for k in labels])
    lines += ["", "| measure | real | sim |", "|---|---|---|",
              f"| Spearman of the protocol ranking by accuracy | {fmt(rho)} | |",
              f"| REFINE: wrong -> right | {fmt(real['wrong_to_right'])} | {fmt(sim['wrong_to_right'])} |",
              f"| REFINE: right -> wrong | {fmt(real['right_to_wrong'])} | {fmt(sim['right_to_wrong'])} |",
              f"| confidence AUROC | {fmt(real['auroc'])} | {fmt(sim['auroc'])} |"]
    if len(labels) < 3:
        notes.append("fewer than 3 protocols: the Spearman correlation is not defined")
    lines += [""] + [f"- {note}" for note in notes]
    report = "\n".join(lines).rstrip() + "\n"
    (outdir / "report.md").write_text(report, encoding="utf-8")
    plot_comparison(labels, real, sim, rho, outdir / "report.png")
    return report


def fmt(value: float | None) -> str:
    """A measure with three decimals, ``n/a`` for None or NaN."""
    return "n/a" if value is None or math.isnan(value) else f"{value:.3f}"


def plot_comparison(labels: Sequence[str], real: dict[str, Any], sim: dict[str, Any], rho: float, path: Path) -> None:
    """Accuracy and tokens per protocol, REFINE transitions and confidence AUROC: real vs sim bars (``summarize``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    x = np.arange(len(labels))
    for ax, key, title in ((axes[0], "accuracy", f"accuracy (Spearman {fmt(rho)})"), (axes[1], "tokens", "tokens per episode")):
        ax.bar(x - 0.2, [real["protocols"][k][key] for k in labels], 0.4, label="real")
        ax.bar(x + 0.2, [sim["protocols"][k][key] for k in labels], 0.4, label="sim")
        ax.set_xticks(x, labels, rotation=30, ha="right")
        ax.set_title(title)
        ax.legend()
    measures = ["wrong_to_right", "right_to_wrong", "auroc"]
    x = np.arange(len(measures))
    axes[2].bar(x - 0.2, [np.nan_to_num(real[m]) for m in measures], 0.4, label="real")
    axes[2].bar(x + 0.2, [np.nan_to_num(sim[m]) for m in measures], 0.4, label="sim")
    axes[2].set_xticks(x, ["REFINE w->r", "REFINE r->w", "conf. AUROC"])
    axes[2].set_ylim(0, 1)
    axes[2].set_title("transitions and confidence")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
