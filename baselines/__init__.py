"""The trainers of ``deliberation_env``: two products over a few shared modules.

* ``baselines.meta``: meta-policy RL. A small shared network picks each agent's meta-action (persist, refine,
  concede) each round; trained by SoftRankPO, GRPO, MAGRPO, PPO/MAPPO or SFT (``python -m baselines.meta.train``),
  evaluated against the fixed protocols (``python -m baselines.meta.evaluate``).
* ``baselines.llm``: fine-tuning the LLM agents themselves on the text env, LoRA adapters per agent
  (``python -m baselines.llm.train_llm``).
* ``baselines.evaluation``: episode records, per-seed metrics, bootstrap intervals, tables and plots; both
  products report through it, and it depends on neither.

Shared by both: ``advantages`` (group-relative advantages, numpy), ``config`` (dataclass configs as CLI flags),
``logger`` (metrics.jsonl / CSV / TensorBoard, progress bars) and ``runtime`` (seeds and torch threads). The LLM
product never imports the meta product (``tests/test_architecture.py``).
"""
