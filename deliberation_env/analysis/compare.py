"""Does a sim calibrated on a replay set rank the protocols like the real model? Train, fit, compare.

    python -m deliberation_env.analysis.calibrate --replay qwen05-arith-v2 -o report/

``replay_comparison(dataset, outdir, make_env=parallel_env)`` (the envs come from ``make_env``, a factory with
``parallel_env``'s keywords: analysis sits below ``deliberation_env.make``):

1. plays the fixed protocols (``REPLAY_PROTOCOLS``: every one that plays any team; ``single`` declares one agent
   and cannot be replayed from a set of several) on the set's train split, on replay, traced;
2. fits the sim to those traces (``sim_fit.fit``);
3. plays the same protocols on the test split, on replay (the real model) and on the fitted sim, with
   the same problems and episode seeds (``comparison_seed``: a replay set with S sample streams answers
   seed s with stream s % S; the sim draws afresh for every seed, so more seeds than streams average
   out the sim's noise);
4. writes ``report.md``, ``report.json``, ``report.png``, the fitted ``sim.json`` and the three traces
   to ``outdir``: per protocol, accuracy and tokens real vs sim; the Spearman correlation of the
   protocols' accuracies with a bootstrap interval over test problems; how often all agents' first
   answers agree in correctness, per level, real vs sim.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from deliberation_env.analysis.fidelity import EnvMaker, fmt, play_protocol, plot_comparison, summarize
from deliberation_env.analysis.metrics import bootstrap_interval, spearman
from deliberation_env.analysis.sim_fit import extract_events, fit, write_config
from deliberation_env.analysis.solve_fit import agreement_shares
from deliberation_env.analysis.traces import Episode, TraceWriter, read_traces
from deliberation_env.backends.sim import SimConfig
from deliberation_env.protocols import PROTOCOLS, make_protocol, protocol_agents

REPLAY_PROTOCOLS = tuple(name for name in PROTOCOLS if protocol_agents(name) is None)
"""The protocols that play any team: one that declares its team size (``single``: one agent) cannot replay a set
recorded with another."""
DEFAULT_SEEDS = 16
"""Episode seeds per problem and protocol."""
BOOTSTRAP_RESAMPLES = 2000
SHOWN_KNOBS = ("skills", "difficulty_weight", "level_offsets", "problem_spread", "refine_self", "refine_peer_gain",
               "sycophancy", "copy_peer", "refine_break", "confidence_right", "confidence_wrong", "confidence_noise")


def comparison_seed(problem: int, k: int, seeds: int, streams: int) -> int:
    """The seed of the k-th episode (of ``seeds``) on the problem at this position: distinct per episode (the sim
    draws from the request's seed alone, so problems sharing a seed would share their draws), and k modulo the
    replay set's ``streams``, so that k = 0..streams-1 play every recorded stream."""
    return k + streams * seeds * problem


def play_protocols(make_env: Callable[[str], Any], protocols: Sequence[str], seeds: int, streams: int,
                   problems: Sequence[Any] | None = None) -> None:
    """Every protocol on every problem of its env (``make_env(name)``, traced with that label), or on
    ``problems``, ``seeds`` episodes each (``comparison_seed``)."""
    for name in protocols:
        env = make_env(name)
        chosen = problems if problems is not None else env.problems
        episodes = [(problem, comparison_seed(position, k, seeds, streams))
                    for position, problem in enumerate(chosen) for k in range(seeds)]
        play_protocol(env, make_protocol(name), episodes)


def replay_comparison(dataset: str | os.PathLike[str], outdir: str | os.PathLike[str], seeds: int = DEFAULT_SEEDS,
                      fixed: dict[str, Any] | None = None, *, make_env: EnvMaker) -> str:
    """Fit the sim on the set's train split and compare it with the set on its test split; returns report.md.

    ``fixed``: knobs held at the given values instead of fitted (e.g. ``{"problem_spread": 0.0}``). ``make_env``
    builds every env (``deliberation_env.make.parallel_env``); the replayed ones get a ``ReplayBackend`` of the set,
    and the env takes the set's recorded settings from it."""
    from deliberation_env.backends.sim import SimBackend, load_sim_config
    from deliberation_env.replay import ReplayBackend, ReplaySet, env_settings

    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    replay = ReplaySet(dataset)
    card = replay.card
    for split in ("train", "test"):
        if not card.splits.get(split):
            raise ValueError(f"replay set {card.name!r} has no {split!r} problems (it has {sorted(card.splits)}); "
                             "--replay fits on train and compares on test: record both")
    if card.settings.get("num_agents", 1) < 2:
        raise ValueError(f"replay set {card.name!r} has one agent: there is no deliberation to compare")
    base = load_sim_config(dict(fixed or {}))
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / f"{name}.jsonl" for name in ("train_traces", "test_real", "test_sim")}
    for path in paths.values():
        path.unlink(missing_ok=True)

    def on_replay(split: str, writer: TraceWriter) -> Callable[[str], Any]:
        return lambda name: make_env(backend=ReplayBackend(replay), split=split, trace=writer, trace_label=name)

    with TraceWriter(paths["train_traces"]) as writer:
        play_protocols(on_replay("train", writer), REPLAY_PROTOCOLS, seeds, card.streams)
    config, notes = fit(read_traces(paths["train_traces"]), base, fixed=tuple(fixed or ()))
    write_config(config, notes, out / "sim.json")

    with TraceWriter(paths["test_real"]) as writer:
        play_protocols(on_replay("test", writer), REPLAY_PROTOCOLS, seeds, card.streams)
    test_problems = make_env(backend=ReplayBackend(replay), split="test").problems
    backend = SimBackend(config)
    with TraceWriter(paths["test_sim"]) as writer:
        play_protocols(lambda name: make_env(backend=backend, split="test", trace=writer, trace_label=name,
                                             **env_settings(card)),
                       REPLAY_PROTOCOLS, seeds, card.streams, problems=test_problems)
    real, sim = read_traces(paths["test_real"]), read_traces(paths["test_sim"])
    result = _result(card, real, sim, config, notes, seeds, fixed or {})
    (out / "report.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    real_summary, sim_summary = summarize(real), summarize(sim)
    plot_comparison(list(REPLAY_PROTOCOLS), real_summary, sim_summary, result["spearman"], out / "report.png")
    report = _markdown(result, real_summary, sim_summary)
    (out / "report.md").write_text(report, encoding="utf-8")
    return report


def _per_problem(episodes: Sequence[Episode], protocols: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """(problem ids, protocols x problems matrix of accuracy averaged over the seeds)."""
    values: dict[tuple[str, str], list[float]] = defaultdict(list)
    for episode in episodes:
        values[episode.label or "", episode.problem_id].append(float(episode.rounds[-1].consensus_correct))
    problems = sorted({problem for _, problem in values})
    return problems, np.array([[np.mean(values[name, problem]) for problem in problems] for name in protocols])


def _result(card: Any, real: Sequence[Episode], sim: Sequence[Episode], config: SimConfig, notes: dict[str, Any],
            seeds: int, fixed: dict[str, Any]) -> dict[str, Any]:
    protocols = list(REPLAY_PROTOCOLS)
    problems, real_matrix = _per_problem(real, protocols)
    sim_problems, sim_matrix = _per_problem(sim, protocols)
    assert sim_problems == problems, "the sim played other problems than the replay"
    real_summary, sim_summary = summarize(real)["protocols"], summarize(sim)["protocols"]
    rho = spearman(real_matrix.mean(1).tolist(), sim_matrix.mean(1).tolist())
    draws = np.random.default_rng(0).integers(0, len(problems), (BOOTSTRAP_RESAMPLES, len(problems)))
    rhos = np.array([spearman(real_matrix[:, d].mean(1).tolist(), sim_matrix[:, d].mean(1).tolist()) for d in draws])
    rhos = rhos[~np.isnan(rhos)]
    interval = [float(np.percentile(rhos, 2.5)), float(np.percentile(rhos, 97.5))] if len(rhos) else [None, None]
    rows = {}
    for k, name in enumerate(protocols):
        low, high = bootstrap_interval(real_matrix[k].tolist())
        rows[name] = {"accuracy_real": float(real_matrix[k].mean()), "accuracy_real_95": [low, high],
                      "accuracy_sim": float(sim_matrix[k].mean()), "tokens_real": real_summary[name]["tokens"],
                      "tokens_sim": sim_summary[name]["tokens"], "episodes": real_summary[name]["episodes"]}
    return {
        "replay_set": card.name, "model": card.model, "test_problems": len(problems),
        "train_problems": len(card.splits["train"]), "seeds_per_problem": seeds, "streams": card.streams,
        "rounds": card.rounds, "protocols": rows, "spearman": rho, "spearman_bootstrap_95": interval,
        "left_out": {name: f"needs num_agents={protocol_agents(name)}; the set was recorded with "
                           f"{card.settings.get('num_agents')} agents" for name in PROTOCOLS if name not in REPLAY_PROTOCOLS},
        "agreement_train_fit": notes["agreement"],
        "agreement_test": {"real": _observed_agreement(real), "sim": _observed_agreement(sim)},
        "fixed": fixed, "config": {name: getattr(config, name) for name in SHOWN_KNOBS},
        "defaults_kept": notes["defaults_kept"],
    }


def _observed_agreement(episodes: Sequence[Episode]) -> dict[str, dict[str, float]]:
    """Per level: the share of round-0 states whose agents are all right or all wrong."""
    shares = agreement_shares(extract_events(episodes).solves, SimConfig())
    return {level: {"episodes": row["episodes"], "observed": row["observed"]} for level, row in shares.items()}


def _markdown(result: dict[str, Any], real: dict[str, Any], sim: dict[str, Any]) -> str:
    low, high = result["spearman_bootstrap_95"]
    lines = [
        f"# Calibrated sim vs replay set {result['replay_set']}", "",
        f"Model `{result['model']}`. Fitted on {result['train_problems']} train problems, compared on "
        f"{result['test_problems']} test problems x {result['seeds_per_problem']} seeds per protocol "
        f"({result['streams']} recorded stream(s), {result['rounds']} round(s)).", "",
        "| protocol | accuracy real (95% over problems) | accuracy sim | tokens real | tokens sim |",
        "|---|---|---|---|---|",
    ]
    for name, row in result["protocols"].items():
        a, b = row["accuracy_real_95"]
        lines.append(f"| {name} | {row['accuracy_real']:.3f} ({a:.2f}-{b:.2f}) | {row['accuracy_sim']:.3f} | "
                     f"{row['tokens_real']:.0f} | {row['tokens_sim']:.0f} |")
    lines += ["", f"**Spearman of the protocols' accuracies, real vs sim: {fmt(result['spearman'])}** "
              f"(95% bootstrap over test problems: {fmt(low)} to {fmt(high)}).", "",
              "| measure | real | sim |", "|---|---|---|",
              f"| REFINE: wrong -> right | {fmt(real['wrong_to_right'])} | {fmt(sim['wrong_to_right'])} |",
              f"| REFINE: right -> wrong | {fmt(real['right_to_wrong'])} | {fmt(sim['right_to_wrong'])} |",
              f"| confidence AUROC | {fmt(real['auroc'])} | {fmt(sim['auroc'])} |", "",
              "All agents' first answers right or all wrong (share of episodes):", "",
              "| level | train real | train fitted | train if independent | test real | test sim |",
              "|---|---|---|---|---|---|"]
    fitted, test = result["agreement_train_fit"], result["agreement_test"]
    for level in fitted:
        row = fitted[level]
        real_test = test["real"].get(level, {}).get("observed")
        sim_test = test["sim"].get(level, {}).get("observed")
        lines.append(f"| {level} | {row['observed']:.3f} | {row['fitted']:.3f} | {row['independent']:.3f} | "
                     f"{fmt(real_test)} | {fmt(sim_test)} |")
    knobs = ", ".join(f"{name}={value}" for name, value in result["config"].items())
    lines += ["", f"Fitted: {knobs}."]
    if result["fixed"]:
        lines.append(f"Held fixed, not fitted: {result['fixed']}.")
    if result["left_out"]:
        lines += [f"Left out: {'; '.join(f'`{name}` ({why})' for name, why in result['left_out'].items())}."]
    if result["defaults_kept"]:
        lines.append("Kept at their default: " + ", ".join(f"{k} ({v})" for k, v in result["defaults_kept"].items()) + ".")
    return "\n".join(lines) + "\n"


def parse_fixed(items: Collection[str]) -> dict[str, Any]:
    """``["problem_spread=0", "level_offsets=[]"]`` as knob values (JSON values), or a ValueError naming the item."""
    fixed: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--fix takes KNOB=VALUE (e.g. problem_spread=0), got {item!r}")
        try:
            fixed[name.strip()] = json.loads(text)
        except json.JSONDecodeError:
            raise ValueError(f"--fix {item!r}: the value must be JSON (a number or a list of numbers)") from None
    return fixed
