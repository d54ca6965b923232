"""Every trainer with a tiny budget, through the Python API (seconds each), then a small evaluation.

    python examples/train_each_algorithm.py

The CLI equivalent of one of them: ``python -m baselines.meta.train --algo grpo --episodes 256 --no-evaluate``.
"""

from __future__ import annotations

from baselines.evaluation.evaluate import evaluate_entries, markdown_table
from baselines.meta import train
from baselines.meta.evaluate import standard_entries

settings = {
    "sft": {"episodes": 300, "epochs": 10},
    "softrankpo": {"episodes": 512, "sft_episodes": 300, "tau": 0.8},
    "grpo": {"episodes": 512},
    "magrpo": {"episodes": 512},
    "ppo": {"episodes": 512, "centralized_critic": True},
}
checkpoints = {}
for algo, overrides in settings.items():
    cfg = train.config_class(algo)(out=f"runs/examples/{algo}", progress=False, tensorboard=False, **overrides)
    train.run(algo, cfg)
    checkpoints[algo] = f"runs/examples/{algo}/policy.pt"
    print(f"trained {algo} -> {checkpoints[algo]}")

entries = standard_entries(checkpoints, ["threshold", "random"], {"task": "arithmetic", "backend": "sim", "split": "test"})
print(markdown_table(evaluate_entries(entries, problems=100, seeds=[0, 1])))
