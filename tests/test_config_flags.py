"""One config family: the library's one dataclass -> flags builder, the trainers' shared base and vocabulary, and
backend names from the registry."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import pytest

from baselines.config import TrainConfig
from baselines.llm.config import LLMTrainConfig
from baselines.meta.config import BaseConfig
from deliberation_env import registry
from deliberation_env.cli import ArgumentParser, add_backend_arguments, add_config_arguments, config_from_args


@dataclass
class Toy:
    count: int = 2
    """How many."""
    name: str | None = None
    urls: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    fast: bool = False
    mode: str = field(default="a", metadata={"argparse": {"choices": ("a", "b")}, "aliases": ("--kind",)})


def parse(cls: type, argv: list[str], **kwargs: Any) -> Any:
    parser = ArgumentParser(prog="toy")
    add_config_arguments(parser, cls, **kwargs)
    return config_from_args(cls, parser.parse_args(argv))


def test_every_kind_of_field_becomes_a_flag_and_comes_back():
    assert parse(Toy, []) == Toy()
    toy = parse(Toy, ["--count", "5", "--name", "x", "--urls", "u1", "u2", "--option", "k=3", "--option", "s=text",
                      "--fast", "--kind", "b"])
    assert toy == Toy(count=5, name="x", urls=["u1", "u2"], options={"k": 3, "s": "text"}, fast=True, mode="b")
    assert parse(Toy, ["--name", "none", "--no-fast"]).name is None
    with pytest.raises(SystemExit):
        parse(Toy, ["--mode", "c"])  # not a choice
    assert parse(Toy, [], skip=("count",), overrides={"mode": {"default": "b"}}) == Toy(mode="b")


def test_the_help_is_each_fields_docstring(capsys):
    with pytest.raises(SystemExit):
        parse(Toy, ["--help"])
    assert "How many. (default: 2)" in " ".join(capsys.readouterr().out.split())


def test_backend_names_come_from_the_registry(monkeypatch):
    names = registry.Registry("backend")
    names.register("sim", "deliberation_env.backends.sim:SimBackend")
    names.register("mine", "deliberation_env.backends.sim:SimBackend")
    monkeypatch.setattr(registry, "BACKENDS", names)
    parser = ArgumentParser(prog="toy")
    add_backend_arguments(parser)
    assert parser.parse_args(["--backend", "mine"]).backend == "mine"
    with pytest.raises(SystemExit):
        parser.parse_args(["--backend", "openai"])  # not registered here


def test_the_trainer_configs_share_one_base_and_one_vocabulary():
    shared = {f.name for f in fields(TrainConfig)}
    meta, llm = ({f.name for f in fields(cls)} for cls in (BaseConfig, LLMTrainConfig))
    assert shared <= meta and shared <= llm and "num_agents" in shared
    # a name both use is declared once in the base, except the model and its weights' dtype (one meaning in both)
    assert (meta & llm) - shared == {"model", "dtype"}
    assert "agents" not in meta | llm
    # credit is whose reward (team or agent) only; which rounds a return spans is credit_span
    assert "credit" not in meta and "credit_span" in meta and "credit_span" not in llm
    with pytest.raises(ValueError, match="credit must be one of"):
        LLMTrainConfig(credit="episode").validate()
    with pytest.raises(ValueError, match="credit_span must be one of"):
        BaseConfig(credit_span="team").validate()
