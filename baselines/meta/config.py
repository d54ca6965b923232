"""The meta-policy trainers' typed config (``BaseConfig``, every trainer's config extends it) and the deliberation
environments and backend it describes (``make_env_fn``). Their CLI flags come from their fields
(``deliberation_env.cli.add_config_arguments``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from baselines.config import TrainConfig
from deliberation_env.cli import BackendSettings, backend_settings

ENGINES = ("tree", "env")
"""How a replay set's episodes are played in training (``BaseConfig.engine``)."""
CREDIT_SPANS = ("episode", "round")
"""What a round's return spans (``credit_span``): the agent's whole episode, or the rounds from it on."""


@dataclass
class BaseConfig(TrainConfig, BackendSettings):
    """Settings every meta-policy trainer has: the shared ``TrainConfig``, the backend flags (``BackendSettings``), the
    budget, the credit assignment, the network and the rollout workers."""

    replay: str | None = None
    """A replay set (shipped name, folder or hf://owner/name): train and evaluate on a real model's recorded behaviour
    with the set's own settings (task, prompts, agents, rounds, tokens); replaces task, backend and their options."""
    train_split: str = "train"
    """The split the trainer plays: a replay set's 'train', or 'fit' (train without the 'validation' split, where the
    benchmark makes its choices: docs/benchmark.md)."""
    engine: str = field(default="tree", metadata={"argparse": {"choices": ENGINES}})
    """How a replay set's training episodes are played: 'tree' (its compiled tree, deliberation_env.engine: the
    same rollouts as the env gives, played by numpy) or 'env' (the PettingZoo env). Ignored without --replay."""
    data_dir: str | None = None
    """Benchmark data folder (default: $DELIBERATION_ENV_DATA)."""
    token_cost: float = 0.0
    """Reward per token spent, the env's reward_weights['tokens'] (0: rewards for correctness only)."""
    episodes: int = 4000
    """Training budget in episodes (every sampled rollout counts, including each member of a group)."""
    credit_span: str = field(default="episode", metadata={"argparse": {"choices": CREDIT_SPANS}})
    """What each round's credit spans: 'episode' (each agent's episode return for all its rounds) or 'round'
    (reward-to-go from each round, compared per round)."""
    hidden: int = 64
    """Width of the policy network."""
    num_envs: int = 32
    """Environment instances stepped in lockstep (one batched forward pass per round)."""
    num_workers: int = 0
    """Ray actors that collect the rollouts, each driving num_envs envs (0: collect in this process; needs the ray extra)."""
    ray_address: str | None = None
    """With --num-workers: the Ray cluster to join (e.g. 10.0.0.1:6379 or auto; default: start a local Ray instance)."""

    def validate(self) -> None:
        """Raise ValueError on inconsistent settings."""
        super().validate()
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if self.credit_span not in CREDIT_SPANS:
            raise ValueError(f"credit_span must be one of {CREDIT_SPANS}, got {self.credit_span!r}")
        if self.episodes < 0:
            raise ValueError(f"episodes must be >= 0, got {self.episodes}")
        for name in ("num_envs", "hidden"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {self.num_workers}")
        if self.ray_address and not self.num_workers:
            raise ValueError("--ray-address needs --num-workers N (N >= 1 Ray rollout workers)")


def build_backend(cfg: BaseConfig) -> Any:
    """The backend object every env of a run shares: the replay set's, or the one the backend flags describe."""
    if cfg.replay:
        from deliberation_env.replay import ReplayBackend, loaded

        return ReplayBackend(loaded(cfg.replay))  # one read of the set per process
    return backend_settings(cfg).build()


def env_kwargs(cfg: BaseConfig, split: str, backend: Any = None) -> dict[str, Any]:
    """``deliberation_env.parallel_env`` keywords of the config, except the backend (a replay set's own settings
    with ``replay``: from the loaded set of ``backend`` when it is the config's replay backend, else its card)."""
    if cfg.replay:
        from deliberation_env.replay import env_settings, load_card
        from deliberation_env.replay.backend import replay_backend

        replay = replay_backend(backend)
        card = replay.set.card if replay is not None else load_card(cfg.replay)
        kwargs: dict[str, Any] = {**env_settings(card), "split": split, "data_dir": cfg.data_dir}
        return {**kwargs, **token_weights(cfg.token_cost), **cfg.env_options}
    return {"data_dir": cfg.data_dir, **token_weights(cfg.token_cost), **cfg.env_keywords(split)}


def token_weights(token_cost: float) -> dict[str, Any]:
    """The env keywords of ``--token-cost``: ``reward_weights={"tokens": C}`` when C is not 0, else none."""
    return {"reward_weights": {"tokens": token_cost}} if token_cost else {}


class EnvFactory:
    """A factory of deliberation environments as a config describes. Every env it makes shares one backend object
    (the one given, else the config's, built on the first call), so a batch of envs is answered together. A pickled
    copy (e.g. shipped to a Ray rollout worker) leaves the backend behind and builds its own from the config."""

    def __init__(self, cfg: BaseConfig, split: str | None = None, backend: Any = None):
        self.cfg, self.split, self.backend = cfg, split or cfg.train_split, backend

    def __call__(self) -> Any:
        import deliberation_env

        if self.backend is None:
            self.backend = build_backend(self.cfg)
        return deliberation_env.parallel_env(backend=self.backend, **env_kwargs(self.cfg, self.split, self.backend))

    def __getstate__(self) -> dict[str, Any]:
        return {"cfg": self.cfg, "split": self.split, "backend": None}


def make_env_fn(cfg: BaseConfig, split: str | None = None, backend: Any = None) -> EnvFactory:
    """An ``EnvFactory`` of the config's environments on ``split`` (default: its ``train_split``), sharing ``backend``
    when given."""
    return EnvFactory(cfg, split, backend)
