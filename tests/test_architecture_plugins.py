"""Plugins declare what they need: a protocol its team (``protocols.ProtocolSpec``), a backend the flags it takes and
where its weights are (``registry.BackendSpec``). No module of the packages branches on a plugin's name: it asks the
declaration (CONTRIBUTING: "registries, not conditionals")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import deliberation_env
from baselines.meta.evaluate import standard_entries
from deliberation_env.cli import BackendSettings, UserError
from deliberation_env.protocols import PROTOCOLS, SPECS, make_protocol, plays_team, protocol_agents
from deliberation_env.registry import BACKENDS, BackendSpec
from deliberation_env.replay.provenance import weights_of

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("deliberation_env", "baselines")
EXCEPTIONS = {
    ("baselines/benchmark.py", "random"): "scores random by its exact expectation over a compiled tree, not by play",
    ("baselines/benchmark.py", "single"): "scores single off the tree (agent 0's round-0 answer), not by play",
    ("baselines/meta/sft.py", "random"): "'random' here is SFT's behaviour option (whose actions label the data)",
}
"""Comparisons with a plugin's name that are no branch on what the plugin needs, each with its reason."""


def plugin_names() -> set[str]:
    return set(BACKENDS.names()) | set(PROTOCOLS)


def name_branches(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of each comparison (``==``, ``!=``, ``in``, ``not in``) with a string literal in ``names``, alone or
    in a tuple, list or set."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for side in (node.left, *node.comparators):
            items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            found += [(node.lineno, item.value) for item in items
                      if isinstance(item, ast.Constant) and isinstance(item.value, str) and item.value in names]
    return found


def test_the_scan_sees_a_name_branch():
    source = 'if backend == "openai": pass\nif name in ("single", "x"): pass\nif task == "arithmetic": pass\n'
    assert name_branches(ast.parse(source), {"openai", "single"}) == [(1, "openai"), (2, "single")]


def test_no_module_branches_on_a_plugin_name():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative in ("deliberation_env/registry.py", "deliberation_env/protocols.py"):
                continue  # the registries themselves
            found += [f"{relative}:{line}: {name!r}" for line, name in
                      name_branches(ast.parse(path.read_text(encoding="utf-8")), plugin_names())
                      if (relative, name) not in EXCEPTIONS]
    assert not found, ("ask the plugin's declaration (registry.BackendSpec, protocols.ProtocolSpec) instead of its "
                       "name:\n" + "\n".join(found))


# ------------------------------------------------------------------ protocols declare their team
def test_a_protocol_declares_its_team_in_one_place():
    assert {name: spec.num_agents for name, spec in SPECS.items() if spec.num_agents is not None} == {"single": 1}
    assert protocol_agents("single", 3) == 1 and protocol_agents("debate", 3) == 3 and protocol_agents("debate") is None
    assert not plays_team("single", 3) and plays_team("single", 1) and plays_team("threshold", 5)
    with pytest.raises(ValueError, match="unknown protocol 'nope'"):
        protocol_agents("nope")


def test_a_protocol_takes_only_its_declared_keywords():
    assert make_protocol("threshold", threshold=0.2, seed=4).threshold == 0.2
    assert make_protocol("debate", seed=4).name == "debate"
    with pytest.raises(TypeError, match="no protocol takes \\['thresh'\\]"):
        make_protocol("threshold", thresh=0.2)


def test_the_evaluation_gives_each_protocol_its_declared_team():
    entries = standard_entries({}, ["single", "debate"], {"backend": "sim", "split": "test", "num_agents": 3})
    teams = {name: len(make_env().possible_agents) for name, _, make_env in entries}
    assert teams == {"single": 1, "debate": 3}


# ------------------------------------------------------------------ backends declare their flags and weights
@pytest.fixture
def toy_backend():
    """A backend registered from outside the package with its own declaration (and removed afterwards)."""
    BACKENDS.register("toy-served", "deliberation_env.backends.sim:SimBackend",
                      spec=BackendSpec(flags=("model",), needs=("model",), usage="--model NAME", weights="served"))
    yield "toy-served"
    BACKENDS.unregister("toy-served")


def test_the_backend_flags_follow_the_declaration(toy_backend):
    with pytest.raises(UserError, match="--backend toy-served needs --model NAME"):
        BackendSettings(backend=toy_backend).backend_kwargs()
    assert BackendSettings(backend=toy_backend, model="m").backend_kwargs() == {"model": "m"}
    with pytest.raises(UserError, match="--dtype is for --backend transformers, not 'toy-served'"):
        BackendSettings(backend=toy_backend, model="m", dtype="float32").backend_kwargs()
    with pytest.raises(UserError, match="--model is for --backend openai or toy-served or transformers, not 'sim'"):
        BackendSettings(backend="sim", model="m").backend_kwargs()
    with pytest.raises(UserError, match="--backend openai needs --base-url URL"):
        BackendSettings(backend="openai", model="m").backend_kwargs()


def test_the_weights_provenance_follows_the_declaration(toy_backend, tmp_path):
    assert weights_of("sim", None) == {"sha256": None, "reason": "the sim backend has no weights"}
    served = weights_of(toy_backend, "m", "https://example.org/m")
    assert served["sha256"] is None and "served by an OpenAI-compatible server as 'm'" in served["reason"]
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights")
    assert weights_of("transformers", str(model))["bytes"] == 7
    assert weights_of(toy_backend, "m", file=str(model))["served_as"] == "m"


def test_an_unregistered_backend_name_is_one_clear_error():
    with pytest.raises(UserError, match="--backend nope: unknown backend 'nope'"):
        BackendSettings(backend="nope").backend_kwargs()
    assert BACKENDS.spec("replay") == BackendSpec()  # registered without a declaration: takes no model flags
    assert deliberation_env.BACKENDS is BACKENDS
