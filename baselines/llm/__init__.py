"""Fine-tuning the LLM agents themselves on the text env (``python -m baselines.llm.train_llm``).

``config`` (``LLMTrainConfig``, the text env), ``policy`` (the team's models: LoRA adapters per agent, token
log-probabilities and loss, checkpoints), ``evaluation`` (the team before and after, in the meta-action env) and
``train_llm`` (rollouts, advantages, updates, the CLI).
"""
