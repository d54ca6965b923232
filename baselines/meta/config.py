"""The meta-policy trainers' typed config (``BaseConfig``, every trainer's config extends it) and the deliberation
environments and backend it describes (``make_env_fn``). Their CLI flags come from ``baselines.config``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deliberation_env.cli import BackendSettings


@dataclass
class BaseConfig:
    """Settings every trainer has: the environment, the budget, the reward handling, logging."""

    task: str = "arithmetic"
    """deliberation_env task (ignored when train() gets an env_fn for another environment)."""
    replay: str | None = None
    """A replay set (shipped name, folder or hf://owner/name): train and evaluate on a real model's recorded behaviour
    with the set's own settings (task, prompts, agents, rounds, tokens); replaces task, backend and their options."""
    backend: str = "sim"
    """deliberation_env backend: sim, transformers or openai (ignored with an env_fn)."""
    model: str | None = None
    """transformers: a model folder, hub id, .gguf file or 'smollm2'; openai: the served model name."""
    base_url: list[str] = field(default_factory=list)
    """openai: the server URL(s), ending in /v1."""
    cache: str | None = None
    """A SQLite file that answers repeated LLM requests (one cache shared by every env)."""
    dtype: str | None = None
    """transformers: the weights' dtype (bfloat16, float16, float32, auto)."""
    batch_size: int | None = None
    """transformers: rows per generate batch."""
    backend_options: dict[str, Any] = field(default_factory=dict)
    """Further constructor keywords of the backend (--backend-option KEY=VALUE)."""
    max_tokens: int | None = None
    """Tokens per solution or refinement (the env's max_tokens; default 512)."""
    temperature: float | None = None
    """Sampling temperature of solutions (the env's temperature; default 0.7)."""
    env_options: dict[str, Any] = field(default_factory=dict)
    """Further env options (--env-option KEY=VALUE, e.g. critic_max_tokens=8)."""
    data_dir: str | None = None
    """Benchmark data folder (default: $DELIBERATION_ENV_DATA)."""
    num_agents: int = 3
    """Agents in the deliberation (ignored with an env_fn)."""
    max_rounds: int = 3
    """Deliberation rounds per episode (ignored with an env_fn)."""
    token_cost: float = 0.0
    """Reward per token spent, the env's reward_weights['tokens'] (0: rewards for correctness only)."""
    episodes: int = 4000
    """Training budget in episodes (every sampled rollout counts, including each member of a group)."""
    seed: int = 0
    """Seed of the training run (network init, problem order, action sampling)."""
    out: str = ""
    """Output directory for metrics and checkpoints (default: runs/<algo>-seed<seed>)."""
    reward_scale: float = 1.0
    """Every reward is multiplied by this before the trainer sees it."""
    credit: str = "episode"
    """Credit assignment: 'episode' (each agent's episode return for all its rounds) or 'round' (reward-to-go from each round, compared per round)."""
    gamma: float = 1.0
    """Discount of the reward-to-go with --credit round and of PPO's returns (0: each round's own reward)."""
    hidden: int = 64
    """Width of the policy network."""
    lr: float = 3e-3
    """Adam learning rate."""
    num_envs: int = 32
    """Environment instances stepped in lockstep (one batched forward pass per round)."""
    threads: int = 1
    """torch CPU threads."""
    num_workers: int = 0
    """Ray actors that collect the rollouts, each driving num_envs envs (0: collect in this process; needs the ray extra)."""
    ray_address: str | None = None
    """With --num-workers: the Ray cluster to join (e.g. 10.0.0.1:6379 or auto; default: start a local Ray instance)."""
    progress: bool = True
    """Show a tqdm progress bar."""
    tensorboard: bool = True
    """Also write TensorBoard event files (when tensorboard is installed)."""

    def validate(self) -> None:
        """Raise ValueError on inconsistent settings."""
        from baselines.meta.rollout import CREDITS

        if self.credit not in CREDITS:
            raise ValueError(f"credit must be one of {CREDITS}, got {self.credit!r}")
        if self.episodes < 0:
            raise ValueError(f"episodes must be >= 0, got {self.episodes}")
        if self.reward_scale <= 0:
            raise ValueError(f"reward_scale must be > 0, got {self.reward_scale}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        for name in ("num_agents", "max_rounds", "num_envs", "hidden", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {self.num_workers}")
        if self.ray_address and not self.num_workers:
            raise ValueError("--ray-address needs --num-workers N (N >= 1 Ray rollout workers)")


def build_backend(cfg: BaseConfig) -> Any:
    """The backend object every env of a run shares: the replay set's, or the one the backend flags describe."""
    if cfg.replay:
        from deliberation_env.replay import ReplayBackend

        return ReplayBackend(cfg.replay)
    return backend_settings(cfg).build()


def backend_settings(cfg: BaseConfig) -> BackendSettings:
    """The backend a config describes (``build()`` makes it)."""
    return BackendSettings(backend=cfg.backend, model=cfg.model, base_url=tuple(cfg.base_url), cache=cfg.cache,
                           dtype=cfg.dtype, batch_size=cfg.batch_size, options=dict(cfg.backend_options))


def env_kwargs(cfg: BaseConfig, split: str, backend: Any = None) -> dict[str, Any]:
    """``deliberation_env.parallel_env`` keywords of the config, except the backend (a replay set's own settings
    with ``replay``: from the loaded set of ``backend`` when it is the config's replay backend, else its card)."""
    if cfg.replay:
        from deliberation_env.replay import env_settings, load_card
        from deliberation_env.replay.backend import replay_backend

        replay = replay_backend(backend)
        card = replay.set.card if replay is not None else load_card(cfg.replay)
        kwargs: dict[str, Any] = {**env_settings(card), "split": split, "data_dir": cfg.data_dir}
        if cfg.token_cost:
            kwargs["reward_weights"] = {"tokens": cfg.token_cost}
        return {**kwargs, **cfg.env_options}
    kwargs = {"task": cfg.task, "num_agents": cfg.num_agents, "max_rounds": cfg.max_rounds,
              "split": split, "data_dir": cfg.data_dir}
    if cfg.token_cost:
        kwargs["reward_weights"] = {"tokens": cfg.token_cost}
    kwargs.update(cfg.env_options)
    kwargs.update({name: getattr(cfg, name) for name in ("max_tokens", "temperature") if getattr(cfg, name) is not None})
    return kwargs


class EnvFactory:
    """A factory of deliberation environments as a config describes. Every env it makes shares one backend object
    (the one given, else the config's, built on the first call), so a batch of envs is answered together. A pickled
    copy (e.g. shipped to a Ray rollout worker) leaves the backend behind and builds its own from the config."""

    def __init__(self, cfg: BaseConfig, split: str = "train", backend: Any = None):
        self.cfg, self.split, self.backend = cfg, split, backend

    def __call__(self) -> Any:
        import deliberation_env

        if self.backend is None:
            self.backend = build_backend(self.cfg)
        return deliberation_env.parallel_env(backend=self.backend, **env_kwargs(self.cfg, self.split, self.backend))

    def __getstate__(self) -> dict[str, Any]:
        return {"cfg": self.cfg, "split": self.split, "backend": None}


def make_env_fn(cfg: BaseConfig, split: str = "train", backend: Any = None) -> EnvFactory:
    """An ``EnvFactory`` of the config's environments on ``split`` (sharing ``backend`` when given)."""
    return EnvFactory(cfg, split, backend)
