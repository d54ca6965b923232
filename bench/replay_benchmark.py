"""Every trainer and protocol on a replay set: real behaviour at sim speed, and what is learnable in it.

    python bench/replay_benchmark.py --dataset qwen05-arith            # train split -> test split, 3 seeds
    python bench/replay_benchmark.py --dataset PATH --episodes 2000 --seeds 0 1 --algos softrankpo grpo

Trains each algorithm (SoftRankPO, GRPO, PPO, MAPPO, MAGRPO, SFT) on the set's train split with each seed and
plays it on every test problem, beside the fixed protocols and the oracle. Reports, per row:
accuracy, tokens per problem, action shares, and the difference to the best fixed protocol on the same
problems with a paired bootstrap 95% interval (resampling problems; learned rows average their seeds per
problem first). Then what the recorded tree says of the test problems:

- the outcome of all joint meta-actions per problem (1-round sets): the joint oracle, always PERSIST (the vote),
  debate, and the **learnable headroom**: the best shared decentralised policy over each agent's round-0 view
  (peers agreeing 0/1/2 x confidence above or below the median, 3^6 policies), in-sample and chosen by 5-fold
  cross-validation;
- the REFINE flip matrix (each agent's round-0 correctness -> after its refinement);
- how often CONCEDE's target is right (all agents, and agents that are wrong);
- how well each cheap signal separates right round-0 answers from wrong ones (AUROC).

``single`` is agent 0's own round-0 answer in the 3-agent recording: the same requests a 1-agent env makes.
Writes <out>/table.md, table.csv, accuracy_vs_tokens.png and report.md.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from collections import Counter

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from baselines.evaluation.evaluate import (  # noqa: E402
    PolicyActor,
    accuracy_vs_tokens_figure,
    episode_seed,
    headless_pyplot,
    play_episodes,
)
from baselines.meta.train import config_class, run  # noqa: E402
from deliberation_env.analysis.metrics import auroc, paired_bootstrap  # noqa: E402
from deliberation_env.protocols import make_protocol  # noqa: E402
from deliberation_env.replay import ReplaySet, replay_env  # noqa: E402

ALGOS = {"softrankpo": {}, "grpo": {}, "ppo": {}, "mappo": {"centralized_critic": True}, "magrpo": {}, "sft": {}}
PROTOCOL_ROWS = ("single", "self_consistency", "debate", "threshold", "random")


def play_rows(dataset: ReplaySet, actor_for, seeds, problems) -> dict[str, np.ndarray]:
    """Per test problem, averaged over seeds: correct, tokens, and action counts."""
    envs = [replay_env(dataset, split="test") for _ in range(32)]
    correct, tokens, actions = np.zeros(problems), np.zeros(problems), Counter()
    for seed in seeds:
        episodes = [(episode_seed(seed, i), i) for i in range(problems)]
        records = play_episodes(envs, [actor_for(seed) for _ in envs], episodes)
        correct += [r["correct"] for r in records]
        tokens += [r["tokens"] for r in records]
        for r in records:
            actions.update(r["actions"])
    total = sum(actions.values()) or 1
    return {"correct": correct / len(seeds), "tokens": tokens / len(seeds),
            "shares": np.array([actions[a] / total for a in range(3)])}


def tree_of(dataset: ReplaySet, split: str = "test") -> dict[str, np.ndarray]:
    """All 27 joint actions of every problem (stream 0): outcomes, tokens and each agent's round-0 view."""
    env = replay_env(dataset, split=split, invalid_action="persist")
    joints = list(itertools.product(range(3), repeat=3))
    n = len(env.problems)
    outcome, tokens = np.zeros((n, len(joints)), bool), np.zeros((n, len(joints)))
    agree, confidence, correct0 = np.zeros((n, 3), int), np.zeros((n, 3)), np.zeros((n, 3), bool)
    flips, concede = Counter(), Counter()
    for p in range(n):
        for j, joint in enumerate(joints):
            obs, infos = env.reset(seed=0, options={"problem_index": p})
            spent = sum(info["tokens"] for info in infos.values())
            if j == 0:
                for a, agent in enumerate(env.agents):
                    agree[p, a] = int(obs[agent]["agreement"].sum())
                    confidence[p, a] = infos[agent]["confidence"]
                    correct0[p, a] = infos[agent]["correct"]
                    target = infos[agent]["concede_target"]
                    if target is not None:
                        concede["offered"] += 1
                        concede["target_right"] += infos[agent]["concede_target_correct"]
                        if not infos[agent]["correct"]:
                            concede["wrong_offered"] += 1
                            concede["wrong_target_right"] += infos[agent]["concede_target_correct"]
            _, _, _, _, after = env.step({f"agent_{a}": action for a, action in enumerate(joint)})
            outcome[p, j] = next(iter(after.values()))["consensus_correct"]
            tokens[p, j] = spent + sum(info["tokens"] for info in after.values())
            if joint == (1, 1, 1):
                for a, info in enumerate(after.values()):
                    flips[bool(correct0[p, a]), bool(info["correct"])] += 1
    return {"outcome": outcome, "tokens": tokens, "agree": agree, "confidence": confidence, "correct0": correct0,
            "joints": np.array(joints), "flips": flips, "concede": concede}


def headroom(tree: dict, folds: int = 5, seed: int = 0) -> dict[str, float]:
    """The joint oracle, and the best shared decentralised policy over (agreeing peers x confidence >= median)."""
    outcome, agree, conf = tree["outcome"], tree["agree"], tree["confidence"]
    state = agree * 2 + (conf >= np.median(conf))  # 6 states per agent
    index = {tuple(j): k for k, j in enumerate(tree["joints"])}
    policies = list(itertools.product(range(3), repeat=6))
    table = np.array([[outcome[p, index[tuple(policy[s] for s in state[p])]] for p in range(len(outcome))]
                      for policy in policies])  # (policies, problems)
    order = np.random.default_rng(seed).permutation(len(outcome))
    held_out = np.zeros(len(outcome))
    for fold in np.array_split(order, folds):
        train = np.setdiff1d(order, fold)
        held_out[fold] = table[int(np.argmax(table[:, train].mean(1))), fold]
    return {"joint_oracle": float(outcome.any(1).mean()), "in_sample": float(table.mean(1).max()),
            "cross_validated": float(held_out.mean())}


def signal_aurocs(dataset: ReplaySet, tree: dict) -> dict[str, float]:
    """AUROC of each round-0 signal for 'this agent's answer is right' (stream 0, test split)."""
    env = replay_env(dataset, split="test")
    values: dict[str, list[float]] = {k: [] for k in ("critic_text confidence", "critic logprob confidence",
                                                      "answer logprob", "mean token logprob", "min token logprob",
                                                      "completion tokens (negated)", "finish=stop",
                                                      "peers agreeing")}
    labels = []
    for confidence, key in (("critic", "critic logprob confidence"), ("answer_logprobs", "answer logprob")):
        other = replay_env(dataset, split="test", confidence=confidence)
        for p in range(len(other.problems)):
            _, infos = other.reset(seed=0, options={"problem_index": p})
            values[key] += [info["confidence"] for info in infos.values()]
    for p, problem in enumerate(env.problems):
        _, infos = env.reset(seed=0, options={"problem_index": p})
        for a, info in enumerate(infos.values()):
            labels.append(bool(info["correct"]))
            values["critic_text confidence"].append(info["confidence"])
            values["peers agreeing"].append(tree["agree"][p, a])
        for a in range(3):
            record = dataset.solve_record(problem.id, 0, a)
            logprobs = [v for _, v in record["token_logprobs"] or []] or [0.0]
            values["mean token logprob"].append(float(np.mean(logprobs)))
            values["min token logprob"].append(float(np.min(logprobs)))
            values["completion tokens (negated)"].append(-record["completion_tokens"])
            values["finish=stop"].append(float(record["finish_reason"] == "stop"))
    right = np.array(labels)
    return {name: auroc(np.array(v, float)[right], np.array(v, float)[~right]) for name, v in values.items()}


def train_and_play(dataset: ReplaySet, algo: str, seed: int, episodes: int, out: str, problems: int):
    cfg = config_class("ppo" if algo == "mappo" else algo)(
        episodes=episodes, seed=seed, out=os.path.join(out, "runs", f"{algo}-seed{seed}"), progress=False,
        tensorboard=False, num_agents=3, max_rounds=dataset.card.rounds, **ALGOS[algo])
    policy = run("ppo" if algo == "mappo" else algo, cfg, lambda: replay_env(dataset, split="train"))
    return play_rows(dataset, lambda s: PolicyActor(policy), [0], problems)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="qwen05-arith")
    parser.add_argument("--algos", nargs="+", default=list(ALGOS), choices=list(ALGOS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--episodes", type=int, default=4000)
    parser.add_argument("--out", default="bench/results/replay_benchmark")
    args = parser.parse_args(argv)
    dataset = ReplaySet(args.dataset)
    problems = len(dataset.card.splits["test"])
    started = time.perf_counter()
    rows: dict[str, dict] = {}
    for name in PROTOCOL_ROWS + ("oracle",):
        if name == "single":
            continue
        rows[name] = play_rows(dataset, lambda s, n=name: make_protocol(n, seed=s) if n == "random" else make_protocol(n),
                               args.seeds if name == "random" else [0], problems)
    tree = tree_of(dataset)
    single_tokens = tree["tokens"][:, 0] / 3  # all PERSIST: round 0 only; one agent's share
    rows["single"] = {"correct": tree["correct0"][:, 0].astype(float), "tokens": single_tokens,
                      "shares": np.array([1.0, 0.0, 0.0])}
    for algo in args.algos:
        runs = [train_and_play(dataset, algo, seed, args.episodes, args.out, problems) for seed in args.seeds]
        rows[algo] = {key: np.mean([r[key] for r in runs], axis=0) for key in runs[0]}
        rows[algo]["per_seed"] = [float(r["correct"].mean()) for r in runs]
        print(f"{algo}: {rows[algo]['correct'].mean():.3f} ({time.perf_counter() - started:.0f} s)", flush=True)
    best = max(PROTOCOL_ROWS, key=lambda n: rows[n]["correct"].mean())
    report(args, dataset, rows, best, tree, headroom(tree), signal_aurocs(dataset, tree), time.perf_counter() - started)


def report(args, dataset, rows, best, tree, room, aurocs, seconds) -> None:
    os.makedirs(args.out, exist_ok=True)
    debate_tokens = rows["debate"]["tokens"].mean()
    lines = [f"Replay benchmark on `{dataset.card.name}` ({dataset.card.model}): trained on "
             f"{len(dataset.card.splits.get('train', []))} train problems, played on {len(rows['debate']['correct'])} "
             f"test problems; learned rows average seeds {args.seeds} ({args.episodes} episodes each). "
             f"{seconds / 60:.1f} min.", "", f"`python bench/replay_benchmark.py --dataset {args.dataset} --seeds "
             f"{' '.join(map(str, args.seeds))} --episodes {args.episodes}`", "",
             f"| policy | accuracy | vs best protocol ({best}), paired 95% CI | tokens / problem | x debate tokens | "
             "PERSIST | REFINE | CONCEDE | per seed |", "|---|---|---|---|---|---|---|---|---|"]
    csv_rows, plot_rows = ["name,accuracy,diff,diff_low,diff_high,tokens"], []
    for name, row in sorted(rows.items(), key=lambda item: -item[1]["correct"].mean()):
        diff, low, high = paired_bootstrap(row["correct"], rows[best]["correct"])
        seeds = ", ".join(f"{v:.3f}" for v in row.get("per_seed", []))
        lines.append(f"| {name} | {row['correct'].mean():.3f} | {diff:+.3f} [{low:+.3f}, {high:+.3f}] | "
                     f"{row['tokens'].mean():,.0f} | {row['tokens'].mean() / debate_tokens:.2f} | "
                     f"{row['shares'][0]:.2f} | {row['shares'][1]:.2f} | {row['shares'][2]:.2f} | {seeds} |")
        csv_rows.append(f"{name},{row['correct'].mean():.4f},{diff:.4f},{low:.4f},{high:.4f},{row['tokens'].mean():.1f}")
        _, half_low, half_high = paired_bootstrap(row["correct"], np.zeros_like(row["correct"]))
        plot_rows.append({"name": name, "accuracy": row["correct"].mean(), "accuracy_ci": (half_high - half_low) / 2,
                          "tokens": row["tokens"].mean(), "tokens_ci": 0.0})
    flips, concede = tree["flips"], tree["concede"]
    lines += ["", "What the recorded tree says of the test problems (stream 0):", "",
              "| quantity | value |", "|---|---|",
              f"| joint oracle (best of 27 joint actions per problem) | {room['joint_oracle']:.3f} |",
              f"| always PERSIST (vote) / debate, from the tree | {tree['outcome'][:, 0].mean():.3f} / "
              f"{tree['outcome'][:, 13].mean():.3f} |",
              f"| best shared decentralised policy (agreement x confidence), in-sample | {room['in_sample']:.3f} |",
              f"| the same, chosen by 5-fold cross-validation (**learnable headroom**) | {room['cross_validated']:.3f} |",
              f"| REFINE flips: wrong -> right / right -> wrong / wrong stays / right stays | "
              f"{flips[False, True]} / {flips[True, False]} / {flips[False, False]} / {flips[True, True]} |",
              f"| CONCEDE target right: all offers / offers to wrong agents | "
              f"{concede['target_right'] / max(concede['offered'], 1):.3f} / "
              f"{concede['wrong_target_right'] / max(concede['wrong_offered'], 1):.3f} |",
              "", "AUROC of round-0 signals for 'this answer is right' (0.5: no signal):", "",
              "| signal | AUROC |", "|---|---|"]
    lines += [f"| {name} | {value:.3f} |" for name, value in sorted(aurocs.items(), key=lambda kv: -abs(kv[1] - 0.5))]
    text = "\n".join(lines) + "\n"
    for name, body in (("report.md", text), ("table.csv", "\n".join(csv_rows) + "\n")):
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            f.write(body)
    plt = headless_pyplot()
    figure = accuracy_vs_tokens_figure(plot_rows, f"replay: {dataset.card.name}")
    figure.savefig(os.path.join(args.out, "accuracy_vs_tokens.png"), dpi=110)
    plt.close(figure)
    print(text)


if __name__ == "__main__":
    main()
