"""Fine-tune the LLM agents with MAGRPO on arithmetic level 0 and compare the team before and after.

The target study (docs/train_llm.md): MAGRPO on 2-3 SmolLM2-135M agents (one LoRA adapter each), arithmetic
level 0, held-out test problems before and after, with Wilson 95% intervals. On a CPU only a short smoke fits
(minutes, not the hour the study needs); on a GPU pass --device cuda and a larger model.

    python bench/train_llm.py --updates 6 --eval-problems 20                      # CPU smoke
    python bench/train_llm.py --model Qwen/Qwen2.5-0.5B-Instruct --device cuda --agents 3 --group-size 8 \\
        --updates 200 --max-tokens 256 --eval-problems 200 --dtype bfloat16

Writes results/train_llm.md (the before/after table, the reward-term means of the first and last updates,
the command and the time) and the run folder --out (default runs/bench-train-llm: metrics, reward_curves.png,
checkpoint/, eval/).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from _results import save_markdown

from baselines.logger import read_metrics
from baselines.train_llm import LLMTrainConfig, train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--algo", default="magrpo", choices=("magrpo", "grpo", "softrankpo"))
    parser.add_argument("--agents", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--updates", type=int, default=6)
    parser.add_argument("--problems-per-update", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-rounds", type=int, default=1)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--eval-problems", type=int, default=20)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--converted-cache-dir", default=os.path.expanduser("~/.cache/deliberation_env/converted"))
    parser.add_argument("--out", default=os.path.join("runs", "bench-train-llm"))
    args = parser.parse_args()
    cfg = LLMTrainConfig(
        algo=args.algo, model=args.model, agents=args.agents, group_size=args.group_size, updates=args.updates,
        problems_per_update=args.problems_per_update, max_tokens=args.max_tokens, max_rounds=args.max_rounds,
        lr=args.lr, eval_problems=args.eval_problems, device=args.device, dtype=args.dtype, threads=args.threads,
        converted_cache_dir=args.converted_cache_dir, out=args.out, task_options={"levels": (0,)},
        env_options={"confidence": "answer_logprobs"}, reward_weights={"team": 1.0, "format": 0.1},
        weights="lora", tensorboard=False)
    start = time.time()
    train(cfg)
    seconds = time.time() - start
    rows = read_metrics(args.out)
    terms = [k for k in rows[0] if k.startswith("reward_") or k in ("accuracy", "team_return", "completion_tokens")]
    first, last = rows[: max(1, len(rows) // 3)], rows[-max(1, len(rows) // 3) :]
    mean = lambda part, key: sum(r[key] for r in part) / len(part)  # noqa: E731
    curves = "\n".join(["| training rollouts | " + " | ".join(terms) + " |", "|---" * (len(terms) + 1) + "|"]
                       + [f"| updates {part[0]['step']}-{part[-1]['step']} | " + " | ".join(f"{mean(part, k):.3f}" for k in terms)
                          + " |" for part in (first, last)])
    table = Path(args.out, "eval", "before_after.md").read_text(encoding="utf-8")
    save_markdown("train_llm", f"{args.algo} on {args.agents} x {args.model} (LoRA per agent), arithmetic level 0, "
                  f"G={args.group_size}, {args.updates} updates, {seconds:.0f} s in all on {args.device}",
                  f"{table}\n\nReward terms on the training rollouts (means of the first and last thirds):\n\n{curves}")


if __name__ == "__main__":
    main()
