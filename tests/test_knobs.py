"""One source per knob: the env's settings are declared once (``DeliberationConfig``); every program's flags and the
trainers' configs take their defaults, types and help from that declaration, and say a default of their own only where
they mean another one."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from baselines.config import TrainConfig
from baselines.llm.config import LLMTrainConfig, text_env_kwargs
from baselines.meta.config import BaseConfig
from baselines.meta.train import config_class
from baselines.meta.trainers import trainers
from deliberation_env.cli import SAMPLING_FLAGS, ArgumentParser, add_env_arguments, env_arguments
from deliberation_env.core.config import DeliberationConfig

ROOT = Path(__file__).resolve().parent.parent
ENV = DeliberationConfig()
ENV_FIELDS = {f.name for f in dataclasses.fields(DeliberationConfig)}


def parsed_defaults() -> dict[str, dict[str, object]]:
    """Every program's parsed flags when none is given (the recorder needs its --out)."""
    from baselines.llm import train_llm
    from baselines.meta import evaluate, train
    from deliberation_env import demo, record

    programs = {f"train --algo {algo}": vars(train.build_parser(algo).parse_args([])) for algo in trainers()}
    programs.update({"train_llm": vars(train_llm.build_parser().parse_args([])),
                     "evaluate": vars(evaluate.build_parser().parse_args([])),
                     "demo": vars(demo.build_parser().parse_args([])),
                     "record": vars(record.parse_args(["--out", "x"]))})
    return programs


OWN_DEFAULTS = {
    ("record", "max_rounds"): 1,  # a recording walks every joint action: one round unless asked
    ("record", "confidence"): "critic_text",  # servers that return no log-probabilities can record a set
    ("record", "streams"): 1,
    ("train_llm", "num_agents"): 2,  # LLM fine-tuning: a small team, one round, short completions
    ("train_llm", "max_rounds"): 1,
    ("train_llm", "max_tokens"): 64,
    ("train_llm", "temperature"): ENV.temperature,  # the env's, written down: a run's saved settings name it
}
"""The only env settings a program gives a default of its own, each for a reason of that program."""


def test_every_program_leaves_the_env_settings_to_the_declaration_or_says_its_own():
    seen = set()
    for program, values in parsed_defaults().items():
        for name in ENV_FIELDS & set(values):
            value = values[name]
            if value is None or value == {} and name == "reward_weights":
                continue  # not given: the env's own default (or a replay set's recording) applies
            own = OWN_DEFAULTS.get((program.split(" ")[0], name))
            seen.add((program.split(" ")[0], name))
            assert value == (own if own is not None else getattr(ENV, name)), (program, name, value)
    assert seen >= set(OWN_DEFAULTS)
    assert any(name == "num_agents" for _, name in seen - set(OWN_DEFAULTS))  # the trainers' 3 agents is ENV's


@pytest.mark.parametrize("program, argv", [
    ("demo", ["--agents", "2", "--rounds", "1"]),
    ("record", ["--out", "x", "--agents", "2", "--rounds", "1"]),
    ("train_llm", ["--agents", "2"]),
])
def test_an_old_flag_spelling_is_the_same_flag_with_a_warning(program, argv, capsys):
    from baselines.llm import train_llm
    from deliberation_env import demo, record

    parse = {"demo": lambda a: demo.build_parser().parse_args(a), "record": record.parse_args,
             "train_llm": lambda a: train_llm.build_parser().parse_args(a)}[program]
    new = [{"--agents": "--num-agents", "--rounds": "--max-rounds"}.get(flag, flag) for flag in argv]
    assert vars(parse(argv)) == vars(parse(new))
    warnings = capsys.readouterr().err
    assert "--agents is an old name of --num-agents" in warnings
    assert ("--rounds is an old name of --max-rounds" in warnings) == ("--rounds" in argv)


def test_env_flags_come_from_the_declaration(capsys):
    parser = ArgumentParser(prog="toy")
    add_env_arguments(parser, ("num_agents", "max_rounds", "confidence"), defaults={"max_rounds": 1})
    assert env_arguments(parser.parse_args([]), ("num_agents", "max_rounds", "confidence")) == {"max_rounds": 1}
    args = parser.parse_args(["--num-agents", "2", "--confidence", "critic_text"])
    assert env_arguments(args, ("num_agents", "confidence")) == {"num_agents": 2, "confidence": "critic_text"}
    with pytest.raises(SystemExit):
        parser.parse_args(["--num-agents", "0"])  # the field's declared minimum
    assert "0 must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "Agents in the deliberation. (default: the env's, 3)" in help_text
    assert "Deliberation rounds after round 0. (default: 1)" in help_text
    with pytest.raises(ValueError, match="no DeliberationConfig fields"):
        add_env_arguments(ArgumentParser(prog="toy"), ("agents",))


# ------------------------------------------------------------------ the literal defaults live in one place
KNOBS = {name: getattr(ENV, name) for name in ("num_agents", "max_rounds", "max_tokens", "critic_max_tokens",
                                                "temperature")}
OLD_NAMES = {"agents": "num_agents", "rounds": "max_rounds"}


def literal_knobs(tree: ast.AST) -> list[tuple[str, int, int]]:
    """(knob, value, line) of each knob written as a literal: ``name: T = v``, ``name=v``, ``{"name": v}`` and
    ``add_argument("--name", default=v)``."""
    found = []
    for node in ast.walk(tree):
        pairs: list[tuple[object, ast.AST]] = []
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            pairs.append((node.target.id, node.value))
        elif isinstance(node, ast.keyword):
            pairs.append((node.arg, node.value))
        elif isinstance(node, ast.Dict):
            pairs += [(key.value, value) for key, value in zip(node.keys, node.values) if isinstance(key, ast.Constant)]
        if isinstance(node, ast.Call):
            flags = [a.value[2:].replace("-", "_") for a in node.args
                     if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("--")]
            pairs += [(flag, kw.value) for flag in flags[:1] for kw in node.keywords if kw.arg == "default"]
        for name, value in pairs:
            name = OLD_NAMES.get(name, name) if isinstance(name, str) else name
            if name in KNOBS and isinstance(value, ast.Constant) and type(value.value) in (int, float) \
                    and value.value == KNOBS[name]:
                found.append((name, value.value, node.lineno))
    return found


def test_the_scan_finds_a_redeclared_default():
    tree = ast.parse('num_agents: int = 3\nf(max_rounds=3, max_tokens=64)\np.add_argument("--agents", default=3)\n'
                     'x = {"critic_max_tokens": 48}\nmax_tokens: int = 512\ntemperature: float = 0.7\n')
    assert sorted((line, name) for name, _, line in literal_knobs(tree)) == [
        (1, "num_agents"), (2, "max_rounds"), (3, "num_agents"), (4, "critic_max_tokens"), (5, "max_tokens"),
        (6, "temperature")]


def test_the_env_defaults_are_written_only_where_they_are_declared():
    found = []
    for package in ("deliberation_env", "baselines"):
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative == "deliberation_env/core/config.py":
                continue
            found += [f"{relative}:{line}: {name}={value}" for name, value, line in literal_knobs(ast.parse(
                path.read_text(encoding="utf-8")))]
    assert not found, "take these from DeliberationConfig (cli.add_env_arguments, cli.field_of):\n" + "\n".join(found)


# ------------------------------------------------------------------ every env setting's flag from the declaration
def hand_written_env_flags(tree: ast.AST) -> list[tuple[str, int]]:
    """(flag, line) of each ``add_argument("--x", ...)`` whose flag names an env setting (a ``DeliberationConfig`` field,
    or an old name of one): such a flag comes from ``cli.add_env_arguments``, with the declaration's type, minimum,
    choices and help."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("--"):
                    name = arg.value[2:].replace("-", "_")
                    if OLD_NAMES.get(name, name) in ENV_FIELDS:
                        found.append((arg.value, node.lineno))
    return found


def test_the_flag_scan_finds_a_hand_written_env_flag():
    tree = ast.parse('p.add_argument("--rounds", type=int)\np.add_argument("--confidence", default="critic")\n'
                     'p.add_argument("--seeds", type=int)\n')
    assert hand_written_env_flags(tree) == [("--rounds", 1), ("--confidence", 2)]


def test_every_env_setting_flag_comes_from_the_declaration():
    """The package's programs and the bench's scripts alike."""
    found = []
    for folder in ("deliberation_env", "baselines", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            found += [f"{path.relative_to(ROOT).as_posix()}:{line}: {flag}"
                      for flag, line in hand_written_env_flags(ast.parse(path.read_text(encoding="utf-8")))]
    assert not found, "take these flags from DeliberationConfig (cli.add_env_arguments):\n" + "\n".join(found)


# ------------------------------------------------------------------ the config families share fields
def redeclared(cls: type) -> list[tuple[dataclasses.Field, dataclasses.Field]]:
    """(the subclass's field, the nearest base's) for every field ``cls`` declares again that a dataclass base has."""
    mine = {f.name: f for f in dataclasses.fields(cls)}
    pairs = []
    for name in cls.__dict__.get("__annotations__", {}):
        base = next((b for b in cls.__mro__[1:] if dataclasses.is_dataclass(b) and name in b.__dataclass_fields__),
                    None)
        if base is not None:
            pairs.append((mine[name], base.__dataclass_fields__[name]))
    return pairs


CONFIGS = sorted({BaseConfig, LLMTrainConfig, *(config_class(algo) for algo in trainers())}, key=lambda c: c.__name__)


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_a_config_redeclares_a_field_only_to_change_its_default_keeping_its_type(cls):
    for mine, base in redeclared(cls):
        assert mine.type == base.type, f"{cls.__name__}.{mine.name}: {mine.type} redeclares {base.type}"
        assert mine.default != base.default, f"{cls.__name__}.{mine.name} redeclares the same default"
        assert dict(base.metadata).items() <= dict(mine.metadata).items(), f"{cls.__name__}.{mine.name} drops metadata"


def test_the_redeclaration_check_sees_a_redeclared_field():
    @dataclasses.dataclass
    class Same(TrainConfig):
        seed: int = 0

    @dataclasses.dataclass
    class Retyped(TrainConfig):
        lr: int = 1

    assert [f.name for f, _ in redeclared(Same)] == ["seed"]
    with pytest.raises(AssertionError, match="redeclares the same default"):
        test_a_config_redeclares_a_field_only_to_change_its_default_keeping_its_type(Same)
    with pytest.raises(AssertionError, match="Retyped.lr: int redeclares float"):
        test_a_config_redeclares_a_field_only_to_change_its_default_keeping_its_type(Retyped)


def test_the_trainers_env_fields_are_the_envs():
    assert (TrainConfig().num_agents, TrainConfig().max_rounds) == (ENV.num_agents, ENV.max_rounds)
    assert {*SAMPLING_FLAGS, "env_options"} <= {f.name for f in dataclasses.fields(LLMTrainConfig)}
    # the LLM trainer's temperature is the env's, written down (its runs record it); its max_tokens is its own
    kwargs = text_env_kwargs(LLMTrainConfig(), "train")
    assert kwargs["temperature"] == ENV.temperature and kwargs["max_tokens"] == 64
    assert "temperature" not in text_env_kwargs(LLMTrainConfig(temperature=None), "train")  # None: the env's own
    with pytest.raises(ValueError, match="max_tokens must be an integer >= 1 for the LLM trainers"):
        LLMTrainConfig(max_tokens=None).validate()
