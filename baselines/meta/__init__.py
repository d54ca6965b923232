"""Meta-policy RL: one shared network picks every agent's meta-action each round (``python -m baselines.meta.train``).

``policy`` (observation layout, networks, checkpoints), ``config`` (``BaseConfig``, the env factory), ``rollout``
(grouped rollout collection, credit assignment), ``distributed`` (the same collection in Ray actors); the trainers
``group_trainer`` (the loop of ``softrankpo``, ``grpo``, ``magrpo``), ``ppo`` and ``sft``; ``train`` (the CLI).
"""
