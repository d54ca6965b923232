"""Evaluate a trained meta-policy and the fixed protocols on GSM8K with the sim backend.

The sim backend simulates the LLM on real GSM8K problems (the gold answers drive it), so no
model is needed. The data is read from ``$DELIBERATION_ENV_DATA/gsm8k/test.jsonl`` (a data folder laid out as docs/tasks.md
describes):

    DELIBERATION_ENV_DATA=path/to/data python examples/evaluate_gsm8k.py runs/softrankpo-seed0/policy.pt

(train one first with ``python -m baselines.meta.train --algo softrankpo``). Same as the CLI:
``python -m baselines.meta.evaluate --task gsm8k --checkpoints runs/softrankpo-seed0/policy.pt --problems 100``.
"""

from __future__ import annotations

import sys

from baselines.evaluation.evaluate import evaluate_entries, markdown_table
from baselines.meta.evaluate import standard_entries

checkpoint = sys.argv[1] if len(sys.argv) > 1 else "runs/softrankpo-seed0/policy.pt"
env_kwargs = {"task": "gsm8k", "backend": "sim", "split": "test"}
entries = standard_entries({"learned": checkpoint}, ["self_consistency", "debate", "threshold"], env_kwargs)
print(markdown_table(evaluate_entries(entries, problems=100, seeds=[0, 1])))
