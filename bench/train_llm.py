"""Fine-tune the LLM agents themselves: MAGRPO against independent GRPO and against team-pooled groups, each arm
from the same untrained team, on the same problems, seeds and number of updates, evaluated on the same held-out
test problems before and after (Wilson 95% intervals).

Arms (``--arms``, any subset, in this order; default: the first three):

| arm          | credit of a completion                   | advantage groups                  | rewards (weights)         |
|--------------|------------------------------------------|-----------------------------------|---------------------------|
| magrpo       | the rollout's team return (shared)       | per (problem, agent, turn)        | team 1, format 0.1        |
| grpo-indep   | its agent's own return (independent)     | per (problem, agent, turn), / std | correct 1, format 0.1     |
| magrpo-pool  | the rollout's team return (shared)       | per (problem, turn), team pooled  | team 1, format 0.1        |
| grpo-indep-pool | its agent's own return                | per (problem, turn), team pooled, / std | correct 1, format 0.1 |

With team credit in the aligned mode, pooling changes nothing: every agent has one completion per rollout and
turn, and all of them carry the rollout's team return, so a pooled group has the same mean (and std) as each
agent's group (magrpo-pool reproduces magrpo exactly). Pooling matters with own-return credit.

``team`` is 1 when the team's final consensus is right; ``correct`` is 1 per turn when the agent's own answer is
right; ``format`` is 1 per turn when the task's extractor can read an answer (text_rewards, docs/train_llm.md).

The CPU study of docs/train_llm.md (2 agents, Qwen2.5-Coder-0.5B-Instruct GGUF, one LoRA adapter each, bfloat16,
arithmetic level 0, 1 debate round):

    # the Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF (hub: Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF), any path
    python bench/train_llm.py --model ~/.cache/deliberation-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \\
        --updates 25 --eval-problems 100
    python bench/train_llm.py --model ~/.cache/deliberation-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
        --updates 25 --eval-problems 100 --arms grpo-indep-pool --no-untrained --stem train_llm_pool

On a GPU (untested here: no GPU was available), a 0.5B-1.5B hub model:

    python bench/train_llm.py --model Qwen/Qwen2.5-1.5B-Instruct --device cuda --dtype bfloat16 --agents 3 \\
        --group-size 8 --problems-per-update 4 --updates 200 --max-tokens 256 --eval-problems 500 --threads 8

Writes results/<--stem>.md and .png (before/after per arm, the training curves) and one run folder per arm
under --out (metrics, reward_curves.png, checkpoint/).
"""

from __future__ import annotations

import argparse
import gc
import os
import time

import numpy as np
from _results import RESULTS, save_markdown

from baselines.llm.config import LLMTrainConfig
from baselines.llm.evaluation import comparison_table, evaluate_team
from baselines.llm.policy import team_backends
from baselines.llm.train_llm import train
from baselines.logger import read_metrics

ARMS = {
    "magrpo": {"algo": "magrpo", "credit": "team", "reward_weights": {"team": 1.0, "format": 0.1}},
    "grpo-indep": {"algo": "grpo", "credit": "agent", "reward_weights": {"correct": 1.0, "format": 0.1}},
    "magrpo-pool": {"algo": "magrpo", "credit": "team", "pool_agents": True,
                    "reward_weights": {"team": 1.0, "format": 0.1}},
    "grpo-indep-pool": {"algo": "grpo", "credit": "agent", "pool_agents": True,
                        "reward_weights": {"correct": 1.0, "format": 0.1}},
}
NO_ROUND_TERMS = {"local": 0.0, "global": 0.0}
"""The core's per-round terms are off in every arm, so each arm's reward is exactly its table row."""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--arms", nargs="+", default=list(ARMS)[:3], choices=list(ARMS))
    parser.add_argument("--no-untrained", dest="untrained", action="store_false",
                        help="skip evaluating the untrained team (when an earlier run of the same settings did)")
    parser.add_argument("--agents", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--problems-per-update", type=int, default=2)
    parser.add_argument("--updates", type=int, default=25)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-rounds", type=int, default=1)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--eval-problems", type=int, default=100)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--converted-cache-dir", default=os.path.expanduser("~/.cache/deliberation_env/converted"))
    parser.add_argument("--out", default=os.path.join("runs", "bench-train-llm"))
    parser.add_argument("--stem", default="train_llm", help="results file stem under bench/results/")
    return parser.parse_args()


def arm_config(args: argparse.Namespace, arm: str) -> LLMTrainConfig:
    settings = dict(ARMS[arm])
    weights = {**NO_ROUND_TERMS, **settings.pop("reward_weights")}
    return LLMTrainConfig(
        model=args.model, agents=args.agents, group_size=args.group_size, problems_per_update=args.problems_per_update,
        updates=args.updates, max_tokens=args.max_tokens, max_rounds=args.max_rounds, lr=args.lr,
        eval_problems=args.eval_problems, device=args.device, dtype=args.dtype, threads=args.threads, seed=args.seed,
        converted_cache_dir=args.converted_cache_dir, out=os.path.join(args.out, arm), task_options={"levels": (0,)},
        env_options={"confidence": "answer_logprobs"}, reward_weights=weights, weights="lora", evaluate=False,
        tensorboard=False, **settings)


def plot_curves(curves: dict[str, list[dict]], path: str) -> None:
    from baselines.evaluation.evaluate import headless_pyplot

    plt = headless_pyplot()
    keys = ("accuracy", "reward_correct", "reward_format", "completion_tokens")
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3))
    for ax, key in zip(axes, keys):
        for arm, rows in curves.items():
            values = np.array([r[key] for r in rows], dtype=float)
            window = min(5, len(values))
            smooth = np.convolve(values, np.ones(window) / window, mode="valid") if window else values
            ax.plot(np.arange(window, len(values) + 1), smooth, label=arm)
        ax.set_title(f"{key} (training rollouts, mean of 5)", fontsize=9)
        ax.set_xlabel("update")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    args = parse_args()
    began = time.time()
    rows: list[dict] = []
    curves: dict[str, list[dict]] = {}
    timing: list[str] = []
    for arm in args.arms:
        cfg = arm_config(args, arm)
        start = time.time()
        team = train(cfg)
        seconds = time.time() - start
        if args.untrained and not rows:  # the untrained team: LoRA adapters start as the identity, so every arm starts here
            row = evaluate_team("untrained", [_Untrained(team)] * cfg.agents, cfg)
            rows.append(row)
        del team
        gc.collect()
        backends = team_backends(os.path.join(cfg.out, "checkpoint"), dtype=cfg.dtype, device=cfg.device,
                                 batch_size=cfg.generate_batch)
        curves[arm] = read_metrics(cfg.out)
        rows.append(evaluate_team(f"{arm} after {len(curves[arm])} updates", backends, cfg))
        del backends
        gc.collect()
        print(comparison_table(rows), flush=True)
        metrics = curves[arm]
        rollout, update = (float(np.mean([m[key] for m in metrics])) for key in ("rollout_tok_s", "update_tok_s"))
        timing.append(f"| {arm} | {len(metrics)} | {sum(m['seconds'] for m in metrics) / 60:.1f} | "
                      f"{rollout:.0f} | {update:.0f} | {seconds / 60:.1f} |")
        report(args, rows, curves, timing, began)  # after every arm, so that a stopped run keeps what it measured


def report(args: argparse.Namespace, rows: list[dict], curves: dict[str, list[dict]], timing: list[str],
           began: float) -> None:
    """Write results/<stem>.md and .png from the arms done so far."""
    plot_curves(curves, os.path.join(RESULTS, f"{args.stem}.png"))
    first = arm_config(args, args.arms[0])
    terms = ("accuracy", "reward_team", "reward_correct", "reward_format", "completion_tokens")
    thirds = ["| arm | updates | " + " | ".join(terms) + " |", "|---" * (len(terms) + 2) + "|"]
    for arm, metrics in curves.items():
        third = max(1, len(metrics) // 3)
        for part in (metrics[:third], metrics[-third:]):
            thirds.append(f"| {arm} | {part[0]['step']}-{part[-1]['step']} | "
                          + " | ".join(f"{np.mean([m.get(k, 0.0) for m in part]):.3f}" for k in terms) + " |")
    body = (f"Team of {first.agents} x {os.path.basename(args.model)} (one LoRA adapter each, {first.dtype}, "
            f"{first.device}), arithmetic level 0, debate with {first.max_rounds} round, {first.max_tokens} tokens per "
            f"answer, G={first.group_size} x {first.problems_per_update} problems per update, lr {first.lr:g}; held-out "
            f"test problems ({args.eval_problems}, the same for every row):\n\n{comparison_table(rows)}\n\n"
            "Training cost per arm (rollouts: completion tokens generated per second; updates: prompt + completion "
            "tokens through forward and backward per second):\n\n"
            "| arm | updates | training minutes | rollout tok/s | update tok/s | minutes with saving |\n"
            "|---|---|---|---|---|---|\n" + "\n".join(timing)
            + "\n\nTraining rollouts, first and last thirds of the updates (means; reward terms are per agent and "
            "episode):\n\n" + "\n".join(thirds)
            + f"\n\nCurves: {args.stem}.png. Whole run: {(time.time() - began) / 60:.0f} minutes.")
    save_markdown(args.stem, "LLM fine-tuning arms: MAGRPO vs independent GRPO vs team-pooled groups", body)


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
