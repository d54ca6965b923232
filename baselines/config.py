"""The base of every trainer's config: one name and one meaning per setting that the meta-policy trainers
(``baselines.meta.config.BaseConfig``) and the LLM trainers (``baselines.llm.config.LLMTrainConfig``) share.

Their command-line flags come from the library's one dataclass-to-flags builder
(``deliberation_env.cli.add_config_arguments``): one ``--flag`` per field, its help text the field's docstring.
A field is declared once: a subclass redeclares one only to change its default (``field_of``: the same type,
metadata and docstring), never to re-say or change what it means; the env's knobs take ``DeliberationConfig``'s
defaults (``tests/test_config_flags.py`` checks both).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deliberation_env.cli import EnvOptions, env_options, field_of
from deliberation_env.core.config import DeliberationConfig, check_minimums


@dataclass
class TrainConfig(EnvOptions):
    """Settings every trainer has: the deliberation and its env options (``max_tokens``, ``temperature``,
    ``env_options``), the run, the reward scale and discount, the optimiser, logging."""

    max_tokens: int | None = field_of(DeliberationConfig, "max_tokens", None)
    temperature: float | None = field_of(DeliberationConfig, "temperature", None)
    task: str = "arithmetic"
    """deliberation_env task (a meta trainer given an env_fn for another environment ignores it)."""
    num_agents: int = field_of(DeliberationConfig, "num_agents")
    """Agents in the deliberation (a meta trainer given an env_fn ignores it)."""
    max_rounds: int = field_of(DeliberationConfig, "max_rounds")
    """Deliberation rounds after round 0 (a meta trainer given an env_fn ignores it)."""
    seed: int = 0
    """Seed of the training run (network init, problem order, sampling)."""
    out: str = ""
    """Output folder of metrics and checkpoints (the meta trainers' default: runs/<algo>-seed<seed>)."""
    reward_scale: float = 1.0
    """Every reward is multiplied by this before the trainer sees it."""
    gamma: float = 1.0
    """Discount of returns-to-go (0: each round's own reward). The meta trainers: of the reward-to-go with
    --credit-span round and of PPO's returns; the LLM trainers: a joint action's return is its reward plus gamma
    times the mean return of its child node's joint actions."""
    lr: float = 3e-3
    """Learning rate (Adam for the meta trainers, AdamW for the LLM trainers)."""
    threads: int = field(default=1, metadata={"minimum": 1})
    """torch CPU threads (1 is fastest on a loaded small CPU)."""
    progress: bool = True
    """Show a tqdm progress bar."""
    tensorboard: bool = True
    """Also write TensorBoard event files (when tensorboard is installed)."""

    def env_keywords(self, split: str) -> dict[str, Any]:
        """The env keywords of the deliberation this config trains on, for ``parallel_env`` and ``text_env`` alike:
        the task, the team, the split, then the env options (``cli.env_options``: ``--env-option``s, the sampling
        settings given)."""
        return {"task": self.task, "num_agents": self.num_agents, "max_rounds": self.max_rounds, "split": split,
                **env_options(self)}

    def validate(self) -> None:
        """Raise ValueError on inconsistent shared settings (subclasses check their own, then call this). A field
        that declares its minimum (``num_agents``, ``max_rounds``, ``max_tokens``, ``threads``, ...) is checked by
        ``check_minimums``, the env's own check."""
        check_minimums(self)
        if self.reward_scale <= 0:
            raise ValueError(f"reward_scale must be > 0, got {self.reward_scale}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
