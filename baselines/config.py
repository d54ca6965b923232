"""Typed configs shared by the trainers, and an argparse parser generated from their field docstrings."""

from __future__ import annotations

import argparse
import ast
import inspect
import textwrap
import types
import typing
from dataclasses import MISSING, dataclass, fields
from typing import Any


@dataclass
class BaseConfig:
    """Settings every trainer has: the environment, the budget, the reward handling, logging."""

    task: str = "arithmetic"
    """deliberation_env task (ignored when train() gets an env_fn for another environment)."""
    backend: str = "sim"
    """deliberation_env backend (e.g. sim; ignored with an env_fn)."""
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
    progress: bool = True
    """Show a tqdm progress bar."""
    tensorboard: bool = True
    """Also write TensorBoard event files (when tensorboard is installed)."""

    def validate(self) -> None:
        """Raise ValueError on inconsistent settings."""
        from baselines.rollout import CREDITS

        if self.credit not in CREDITS:
            raise ValueError(f"credit must be one of {CREDITS}, got {self.credit!r}")
        if self.episodes < 0:
            raise ValueError(f"episodes must be >= 0, got {self.episodes}")
        if self.reward_scale <= 0:
            raise ValueError(f"reward_scale must be > 0, got {self.reward_scale}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if self.num_envs < 1 or self.hidden < 1:
            raise ValueError("num_envs and hidden must be >= 1")


def make_env_fn(cfg: BaseConfig, split: str = "train"):
    """A factory of deliberation environments as the config describes."""
    import deliberation_env

    options: dict[str, Any] = {}
    if cfg.token_cost:
        options["reward_weights"] = {"tokens": cfg.token_cost}

    def env_fn():
        return deliberation_env.parallel_env(task=cfg.task, backend=cfg.backend, num_agents=cfg.num_agents,
                                             max_rounds=cfg.max_rounds, split=split, **options)

    return env_fn


# ----------------------------------------------------------------------------- argparse from docstrings
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each dataclass field (attribute docstrings), for cls and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not hasattr(klass, "__dataclass_fields__"):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body  # type: ignore[attr-defined]
        for node, nxt in zip(body, body[1:]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr) \
                    and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _base_type(annotation: Any) -> tuple[type, bool]:
    """(scalar type, optional?) of a field annotation such as ``int``, ``str | None``."""
    if isinstance(annotation, str):
        annotation = eval(annotation, {"typing": typing})  # annotations are postponed strings here
    args = typing.get_args(annotation)
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        kinds = [a for a in args if a is not type(None)]
        return kinds[0], True
    return annotation, False


def _optional(kind: type):
    def parse(text: str):
        return None if text.lower() in ("none", "") else kind(text)

    parse.__name__ = kind.__name__
    return parse


def add_config_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """One --flag per field of dataclass cls, help text from its docstring, default shown."""
    docs = field_docs(cls)
    for f in fields(cls):
        kind, optional = _base_type(f.type)
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not MISSING else None
        text = f"{docs.get(f.name, '')} (default: {default})"
        if kind is bool:
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=default, help=text)
        else:
            parser.add_argument(flag, dest=f.name, type=_optional(kind) if optional else kind, default=default,
                                metavar=kind.__name__.upper(), help=text)


def config_from_args(cls: type, args: argparse.Namespace):
    return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})
