"""The trainers of ``deliberation_env``: two products over a few shared modules.

* ``baselines.meta``: meta-policy RL. A small shared network picks each agent's meta-action (persist, refine,
  concede) each round; trained by SoftRankPO, GRPO, MAGRPO, PPO/MAPPO or SFT (``python -m baselines.train``).
* ``baselines.llm``: fine-tuning the LLM agents themselves on the text env, LoRA adapters per agent
  (``python -m baselines.train_llm``).
* ``baselines.evaluation``: learned policies and fixed protocols side by side on a test split, tables and plots
  (``python -m baselines.evaluate``); both products report through it.

Shared by both: ``advantages`` (group-relative advantages, numpy), ``config`` (dataclass configs as CLI flags),
``logger`` (metrics.jsonl / CSV / TensorBoard, progress bars) and ``runtime`` (seeds and torch threads).
``baselines.train``, ``baselines.evaluate`` and ``baselines.train_llm`` are the old module paths, kept for one
release; they are the modules of ``baselines.meta.train``, ``baselines.evaluation.evaluate`` and
``baselines.llm.train_llm``.
"""
