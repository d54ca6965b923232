"""The base of every trainer's config: one name and one meaning per setting that the meta-policy trainers
(``baselines.meta.config.BaseConfig``) and the LLM trainers (``baselines.llm.config.LLMTrainConfig``) share.

Their command-line flags come from the library's one dataclass-to-flags builder
(``deliberation_env.cli.add_config_arguments``): one ``--flag`` per field, its help text the field's docstring.
A subclass redeclares a field to change its default or say more in its docstring, never its meaning.
"""

from __future__ import annotations

from dataclasses import dataclass

from deliberation_env.cli import EnvFlags


@dataclass
class TrainConfig(EnvFlags):
    """Settings every trainer has: the deliberation and its env options (``max_tokens``, ``temperature``,
    ``env_options``), the run, the reward scale and discount, the optimiser, logging."""

    task: str = "arithmetic"
    """deliberation_env task."""
    num_agents: int = 3
    """Agents in the deliberation."""
    max_rounds: int = 3
    """Deliberation rounds after round 0."""
    seed: int = 0
    """Seed of the training run."""
    out: str = ""
    """Output folder of metrics and checkpoints."""
    reward_scale: float = 1.0
    """Every reward is multiplied by this before the trainer sees it."""
    gamma: float = 1.0
    """Discount of returns-to-go (0: each round's own reward)."""
    lr: float = 3e-3
    """Learning rate."""
    threads: int = 1
    """torch CPU threads."""
    progress: bool = True
    """Show a tqdm progress bar."""
    tensorboard: bool = True
    """Also write TensorBoard event files (when tensorboard is installed)."""

    def validate(self) -> None:
        """Raise ValueError on inconsistent shared settings (subclasses check their own, then call this)."""
        for name in ("num_agents", "max_rounds", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.reward_scale <= 0:
            raise ValueError(f"reward_scale must be > 0, got {self.reward_scale}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
