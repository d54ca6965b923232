"""Tasks: problems, prompts, answer extraction and grading. Look one up by name with
``deliberation_env.TASKS.make(name, data_dir=...)``."""

from deliberation_env.tasks.base import DATA_ENV_VAR, BaseTask, PeerView, Problem, Prompts, Task

__all__ = ["DATA_ENV_VAR", "BaseTask", "PeerView", "Problem", "Prompts", "Task"]
