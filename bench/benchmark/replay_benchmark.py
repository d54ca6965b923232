"""One cell's rows at a glance, scored the leaderboard's way, and what its recorded tree says of what is learnable.

    python bench/benchmark/replay_benchmark.py --cell qwen05-arith-v2:v2                  # every trainer, 3 seeds
    python bench/benchmark/replay_benchmark.py --cell qwen05-arith-v2:v1 --seeds 0 1 --algos softrankpo grpo
    python bench/benchmark/replay_benchmark.py --cell qwen05-arith-v2:v2 --algos          # protocols + analysis only

The quick look beside ``benchmark_suite.py`` (the leaderboard: tuned, 10 seeds): each trainer with its defaults,
trained on the cell's ``fit`` split per seed (``suite.train_and_score``), and the fixed protocols and the oracle, all
scored exactly on every test problem by ``baselines.benchmark`` (the best protocol chosen on validation; a learned
row's interval the leaderboard's hierarchical bootstrap over training seeds and, paired, problems, here at 95%), with
the trainers' pairwise differences. Each run's per-problem scores are kept under ``<out>/scores/`` (a run whose file
is there is not run again). Then what the recorded trees of ``--tree-splits`` (default train and test, pooled) say
(the 3-action game only):

- the outcome of all joint meta-actions per problem (1-round sets): the joint oracle, always PERSIST (the vote),
  debate;
- the **learnable headroom**: the best shared decentralised policy over each agent's round-0 view (peers
  agreeing 0/1/2 x one signal split at its median, 3^6 policies), in-sample and cross-validated (signal,
  threshold and policy chosen on the training folds): for agreement alone, the critic confidence, any v1
  feature, any v2 feature, the agent's own correctness (privileged: the ceiling of any signal), each feature;
- the REFINE flip matrix (each agent's round-0 correctness -> after its refinement);
- how often CONCEDE's target is right (all agents, and agents that are wrong);
- how well each signal separates right answers from wrong ones (AUROC with a bootstrap interval over problems),
  in round 0 and after every agent REFINEs: the critic's confidence (log-probs and text), the answer's and the
  text's token log-probabilities, length and finish reason, agreement, the concede target, the text's equations.

``single`` is agent 0's own round-0 answer in the 3-agent recording: the same requests a 1-agent env makes.
Writes <out>/report.md, table.csv, pairs.csv, meta.json and accuracy_vs_tokens.png.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

from baselines.benchmark import Scores, best_protocol, loaded, parse_cell, protocol_scores
from baselines.evaluation.evaluate import accuracy_vs_tokens_figure, headless_pyplot
from baselines.meta.trainers import leaderboard_rows
from bench.common.results import RESULTS
from bench.common.suite import train_and_score
from bench.common.trees import feature_columns, headroom, pool_trees, tree_of
from deliberation_env.analysis.metrics import auroc, clustered_auroc, hierarchical_bootstrap, paired_bootstrap
from deliberation_env.cli import ArgumentParser
from deliberation_env.core.consensus import support
from deliberation_env.make import replay_env
from deliberation_env.replay import ReplaySet


def headrooms(tree: dict) -> dict[str, dict]:
    """The learnable headroom with agreement alone, with v1's critic confidence (the original measure), v1's and
    v2's features, the agent's own correctness (privileged: the ceiling of any per-agent signal), and each feature."""
    v1, v2 = feature_columns(tree, "v1"), feature_columns(tree, "v2")
    rooms = {"agreement alone (no signal)": headroom(tree, {"none": None}, repeats=20),
             "agreement x confidence": headroom(tree, {"confidence": tree["confidence"]}, repeats=20),
             "agreement x any v1 feature": headroom(tree, v1, repeats=20),
             "agreement x any v2 feature": headroom(tree, v2, repeats=20),
             "agreement x own correctness (privileged ceiling)": headroom(tree, {"correct": tree["correct0"] * 1.0},
                                                                          repeats=20)}
    for name, column in v2.items():
        rooms[f"agreement x {name}"] = headroom(tree, {name: column}, repeats=20)
    return rooms


# ----------------------------------------------------------------------------- signals of right answers
SIGNALS = {
    "critic confidence, Yes/No log-probs (critic)": lambda s, c: c["critic"],
    "critic confidence, text verdict (critic_text)": lambda s, c: c["critic_text"],
    "answer log-prob (sum over its tokens)": lambda s, c: s.signals.answer_logprob,
    "mean token log-prob": lambda s, c: s.signals.mean_logprob,
    "min token log-prob": lambda s, c: s.signals.min_logprob,
    "completion tokens": lambda s, c: s.signals.completion_tokens,
    "stopped (not cut at max_tokens)": lambda s, c: s.signals.stopped,
    "peers agreeing": lambda s, c: c["agree"],
    "concede target holds the plurality answer": lambda s, c: c["target_plurality"],
    "concede target's support": lambda s, c: c["target_support"],
    "answer occurrences in the text": lambda s, c: s.signals.answer_repeats,
    "share of equations that hold": lambda s, c: _share(s.signals),
    "equations that do not hold": lambda s, c: s.signals.equations_wrong,
    "code block": lambda s, c: s.signals.code,
    "digits in the text": lambda s, c: sum(ch.isdigit() for ch in s.text),
    "non-empty lines": lambda s, c: sum(1 for line in s.text.splitlines() if line.strip()),
    "says it checked": lambda s, c: s.profile[3],
    "hedges": lambda s, c: s.profile[4],
}


def _share(signals) -> float:
    checked = signals.equations_right + signals.equations_wrong
    return signals.equations_right / checked if checked else np.nan


def agent_signals(dataset: ReplaySet, splits) -> list[dict]:
    """Per split, problem (stream 0), round (0: the solutions; 1: after every agent REFINEs) and agent: whether its
    answer is right, and every signal of ``SIGNALS`` (NaN where it does not apply)."""
    found = []
    for split in splits:
        envs = {source: replay_env(dataset, split=split, confidence=source, features="v2")
                for source in ("critic", "critic_text")}
        for p in range(len(envs["critic"].problems)):
            for round_ in range(min(2, dataset.card.rounds + 1)):
                confidences = {}
                for source, env in envs.items():
                    env.reset(seed=0, options={"problem_index": p})
                    if round_:
                        env.step({agent: 1 for agent in env.agents})
                    confidences[source] = [agent.confidence for agent in env.deliberation.agents]
                core = envs["critic_text"].deliberation
                answers = [agent.answer for agent in core.agents]
                supports, consensus = support(answers), core.consensus()
                for i, state in enumerate(core.agents):
                    target = core.concede_target(i)
                    context = {"critic": confidences["critic"][i], "critic_text": confidences["critic_text"][i],
                               "agree": sum(1 for j, a in enumerate(answers) if j != i and a == state.answer
                                            and a is not None),
                               "target_plurality": np.nan if target is None else float(answers[target] == consensus),
                               "target_support": np.nan if target is None else supports[target]}
                    values = {name: signal(state, context) for name, signal in SIGNALS.items()}
                    found.append({"problem": (split, p), "round": round_, "right": bool(state.correct),
                                  **{k: np.nan if v is None else float(v) for k, v in values.items()}})
    return found


def signal_table(found: list[dict], resamples: int = 1000, seed: int = 0) -> list[dict]:
    """Per signal and round: AUROC for 'this agent's answer is right' with a bootstrap 95% interval resampling
    problems (an agent's peers share its problem), and the same among agents that no peer agrees with."""
    table = []
    rng = np.random.default_rng(seed)
    for name in SIGNALS:
        row = {"signal": name}
        for round_ in sorted({r["round"] for r in found}):
            items = [r for r in found if r["round"] == round_ and not np.isnan(r[name])]
            problems = sorted({r["problem"] for r in items})
            groups = [([r[name] for r in items if r["problem"] == p], [r["right"] for r in items if r["problem"] == p])
                      for p in problems]
            value, low, high = clustered_auroc(groups, resamples, rng)
            lonely = [r for r in items if r["peers agreeing"] == 0]
            lonely_values = np.array([r[name] for r in lonely], float)
            lonely_right = np.array([r["right"] for r in lonely], bool)
            right = sum(r["right"] for r in items)
            row[round_] = {"auroc": value, "low": low, "high": high, "n": len(items), "right": right,
                           "lonely": auroc(lonely_values[lonely_right], lonely_values[~lonely_right]),
                           "lonely_n": len(lonely)}
        table.append(row)
    return table


def main(argv=None) -> None:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cell", default="qwen05-arith-v2:v2", help="'<set>:<game>' (python -m baselines.benchmark cells)")
    parser.add_argument("--algos", nargs="*", default=list(leaderboard_rows()), choices=list(leaderboard_rows()),
                        help="trainers to run (none: the protocols and the analysis of the tree only)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--episodes", type=int, default=4000)
    parser.add_argument("--tree-splits", nargs="+", default=["train", "test"],
                        help="splits whose recorded trees the headroom and the signal table pool")
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples of the AUROC intervals")
    parser.add_argument("--analysis", action=argparse.BooleanOptionalAction, default=True,
                        help="the tree's headroom and signal tables after the rows (slow: minutes; the 3-action game "
                             "only; bench/studies/headroom.py has them for every set and game)")
    parser.add_argument("--out", default=os.path.join(RESULTS, "replay_benchmark"))
    args = parser.parse_args(argv)
    try:
        cell = parse_cell(args.cell)
    except ValueError as error:
        parser.error(str(error))
    started = time.perf_counter()
    best = best_protocol(cell)
    rows: dict[str, list[Scores]] = {name: [scores] for name, scores in protocol_scores(cell, "test").items()}
    for algo in args.algos:
        rows[algo] = [train_and_score(cell, algo, {}, seed, args.episodes, ("test",),
                                      os.path.join(args.out, "scores", algo), f"seed{seed}",
                                      runs=os.path.join("runs", "replay_benchmark"))["test"] for seed in args.seeds]
        print(f"{algo}: {np.mean([r.accuracy.mean() for r in rows[algo]]):.3f} "
              f"({time.perf_counter() - started:.0f} s)", flush=True)
    tree = rooms = signals = None
    options = {k: v for k, v in cell.options.items() if k != "features"}
    if args.analysis and not options.get("concede_to_peer"):  # its tables read the 27 joint actions
        dataset = loaded(cell.dataset)
        tree = pool_trees([tree_of(dataset, split, **options) for split in args.tree_splits])
        rooms, signals = headrooms(tree), signal_table(agent_signals(dataset, args.tree_splits), args.resamples)
    report(args, cell, rows, best, tree, rooms, signals, time.perf_counter() - started)


def report(args, cell, rows: dict[str, list[Scores]], best: str, tree, rooms, signals, seconds) -> None:
    os.makedirs(args.out, exist_ok=True)
    runs = {name: np.stack([r.accuracy for r in scores]) for name, scores in rows.items()}
    tokens = {name: float(np.mean([r.tokens.mean() for r in scores])) for name, scores in rows.items()}
    dataset = loaded(cell.dataset)
    lines = [f"Replay benchmark on `{cell.name}` ({dataset.card.model}): trained on the `fit` split, scored exactly on "
             f"{runs[best].shape[1]} test problems; learned rows: each trainer's defaults, seeds {args.seeds} "
             f"({args.episodes} episodes each). {seconds / 60:.1f} min.", "",
             f"`python bench/benchmark/replay_benchmark.py --cell {cell.name} --seeds {' '.join(map(str, args.seeds))} "
             f"--episodes {args.episodes} --algos {' '.join(args.algos)}" + ("" if args.analysis else " --no-analysis")
             + "`", "",
             f"The protocol to beat, {best}, is the best fixed protocol on the validation split. Intervals are 95% "
             "hierarchical bootstraps: each resample draws the training seeds of every learned row and one set of "
             "test problems shared by the rows (paired), so they include training noise as well as the problems'. "
             "The leaderboard (tuned, 10 seeds, corrected intervals) is `bench/benchmark/benchmark_suite.py`'s.", "",
             f"| policy | accuracy | vs best protocol ({best}), 95% CI | tokens / problem | x debate tokens | per seed |",
             "|---|---|---|---|---|---|"]
    csv_rows, plot_rows = ["name,accuracy,diff,diff_low,diff_high,tokens"], []
    pair_rows = ["first,second,diff,diff_low,diff_high"]
    for name in sorted(rows, key=lambda n: -runs[n].mean()):
        diff, low, high = hierarchical_bootstrap([runs[name], runs[best]], [1.0, -1.0])
        seeds = ", ".join(f"{v:.3f}" for v in runs[name].mean(1)) if name in args.algos else ""
        lines.append(f"| {name} | {runs[name].mean():.3f} | {diff:+.3f} [{low:+.3f}, {high:+.3f}] | "
                     f"{tokens[name]:,.0f} | {tokens[name] / tokens['debate']:.2f} | {seeds} |")
        csv_rows.append(f"{name},{runs[name].mean():.4f},{diff:.4f},{low:.4f},{high:.4f},{tokens[name]:.1f}")
        _, half_low, half_high = paired_bootstrap(runs[name].mean(0), np.zeros(runs[name].shape[1]))
        plot_rows.append({"name": name, "accuracy": runs[name].mean(), "accuracy_ci": (half_high - half_low) / 2,
                          "tokens": tokens[name], "tokens_ci": 0.0})
    learned = [name for name in args.algos if name in rows]
    if len(learned) > 1:
        lines += ["", "Pairwise differences between trainers (row - column), with the same hierarchical 95% intervals; "
                  "**bold**: the interval excludes 0.", "", "| | " + " | ".join(learned[1:]) + " |",
                  "|---|" + "---|" * (len(learned) - 1)]
        for i, first in enumerate(learned[:-1]):
            cells = []
            for j, second in enumerate(learned[1:], start=1):
                if j <= i:
                    cells.append("")
                    continue
                diff, low, high = hierarchical_bootstrap([runs[first], runs[second]], [1.0, -1.0])
                pair_rows.append(f"{first},{second},{diff:.4f},{low:.4f},{high:.4f}")
                text = f"{diff:+.3f} [{low:+.3f}, {high:+.3f}]"
                cells.append(f"**{text}**" if low > 0 or high < 0 else text)
            lines.append(f"| {first} | " + " | ".join(cells) + " |")
    if tree is not None:
        lines += analysis_lines(args, tree, rooms, signals)
    else:
        lines += ["", "The recorded tree's headroom and signals: `python bench/studies/headroom.py` (this run: --no-analysis, "
                  "or a chosen-target game)."]
    meta = {"cell": cell.name, "best_protocol": best, "seeds": args.seeds, "episodes": args.episodes,
            "algos": args.algos, "test_problems": int(runs[best].shape[1]), "seconds": round(seconds, 1)}
    write_outputs(args.out, cell.name, lines, csv_rows, pair_rows, plot_rows, meta)


def analysis_lines(args, tree: dict, rooms: dict, signals: list) -> list[str]:
    """The report's tables of the recorded tree: oracle, flips, concede targets, headroom and signal AUROCs."""
    flips, concede, room = tree["flips"], tree["concede"], rooms["agreement x confidence"]
    lines = ["", f"What the recorded tree says of the {len(tree['outcome'])} problems of splits "
              f"{', '.join(args.tree_splits)} (stream 0):", "",
              "| quantity | value |", "|---|---|",
              f"| joint oracle (best of 27 joint actions per problem) | {room['joint_oracle']:.3f} |",
              f"| always PERSIST (vote) / debate, from the tree | {tree['outcome'][:, 0].mean():.3f} / "
              f"{tree['outcome'][:, 13].mean():.3f} |",
              f"| REFINE flips: wrong -> right / right -> wrong / wrong stays / right stays | "
              f"{flips[False, True]} / {flips[True, False]} / {flips[False, False]} / {flips[True, True]} |",
              f"| CONCEDE target right: all offers / offers to wrong agents | "
              f"{concede['target_right'] / max(concede['offered'], 1):.3f} / "
              f"{concede['wrong_target_right'] / max(concede['wrong_offered'], 1):.3f} |",
              "", "**Learnable headroom**: the best shared decentralised policy over each agent's round-0 view, "
              "peers agreeing (0/1/2) x one signal split at its median (3^6 policies); with several signals, the "
              "signal is chosen with the policy. Cross-validated: signal, threshold and policy chosen on 4/5 of "
              "the problems, scored on the rest (mean and sd over 20 fold splits).", "",
              "| state | in-sample | cross-validated | sd | signals chosen (folds) |", "|---|---|---|---|---|"]
    summaries = list(rooms)[:5]  # the rows of headrooms() before the single features
    for name, room in sorted(rooms.items(), key=lambda kv: (kv[0] not in summaries, -kv[1]["cross_validated"])):
        chosen = ", ".join(f"{k} ({v})" for k, v in room["chosen"])
        lines.append(f"| {name} | {room['in_sample']:.3f} | {room['cross_validated']:.3f} | {room['cv_std']:.3f} | "
                     f"{chosen} |")
    rounds = sorted(k for k in signals[0] if k != "signal")
    lines += ["", "AUROC of each signal for 'this agent's answer is right' (0.5: no signal; below 0.5: the signal "
              "is higher for wrong answers), bootstrap 95% interval resampling problems; round 1 is after every "
              "agent REFINEs; 'alone': among agents no peer agrees with.", "",
              "| signal | " + " | ".join(f"round {r}: AUROC [95% CI] | n (right) | alone (n)" for r in rounds) + " |",
              "|---|" + "---|---|---|" * len(rounds)]
    for row in sorted(signals, key=lambda r: -abs(r[0]["auroc"] - 0.5)):
        cells = [f"{c['auroc']:.3f} [{c['low']:.2f}, {c['high']:.2f}] | {c['n']} ({c['right']}) | "
                 f"{c['lonely']:.3f} ({c['lonely_n']})" for c in (row[r] for r in rounds)]
        lines.append(f"| {row['signal']} | " + " | ".join(cells) + " |")
    return lines


def write_outputs(out, title, lines, csv_rows, pair_rows, plot_rows, meta) -> None:
    text = "\n".join(lines) + "\n"
    for name, body in (("report.md", text), ("table.csv", "\n".join(csv_rows) + "\n"),
                       ("pairs.csv", "\n".join(pair_rows) + "\n"), ("meta.json", json.dumps(meta, indent=1) + "\n")):
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            f.write(body)
    plt = headless_pyplot()
    figure = accuracy_vs_tokens_figure(plot_rows, f"replay: {title}")
    figure.savefig(os.path.join(out, "accuracy_vs_tokens.png"), dpi=110)
    plt.close(figure)
    print(text)


if __name__ == "__main__":
    main()
