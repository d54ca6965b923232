"""The import structure: one layer per concern, no import circles, the library never imports ``baselines``.

Pure ``ast``: every import statement of every module counts, including those inside functions and
under ``TYPE_CHECKING`` (a circle that only lazy imports break is still a circle in the design).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("deliberation_env", "baselines")
"""Our importable packages: the module graph is built over these."""
SOURCE_FOLDERS = (*PACKAGES, "bench", "tests", "scripts")
"""Every folder of our Python code: no file in them imports another module's private names."""
EXCLUDED_PARTS = frozenset({"__pycache__", "sets"})
"""``deliberation_env/replay/sets`` holds recorded data, not code."""


def python_files(folder: str) -> Iterator[Path]:
    for path in sorted((ROOT / folder).rglob("*.py")):
        if not EXCLUDED_PARTS.intersection(path.relative_to(ROOT).parts):
            yield path


def module_name(path: Path) -> str:
    """``deliberation_env/core/__init__.py`` -> ``deliberation_env.core``; ``bench/x.py`` -> ``bench.x``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def import_nodes(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth (functions, ``if TYPE_CHECKING:``, ``try:``)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


def imported_from(node: ast.ImportFrom, importer: str, importer_is_package: bool) -> str:
    """The absolute module a ``from ... import`` reads from (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    anchor = importer.split(".") if importer_is_package else importer.split(".")[:-1]
    anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join([*anchor, node.module] if node.module else anchor)


def imported_modules(node: ast.Import | ast.ImportFrom, importer: str, importer_is_package: bool,
                     known: set[str]) -> set[str]:
    """The modules a statement imports: ``from pkg import name`` is ``pkg.name`` when that is a module."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    source = imported_from(node, importer, importer_is_package)
    return {f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source for alias in node.names}


def owning_module(name: str, known: set[str]) -> str | None:
    """The innermost of our modules that ``name`` is or lies in (``pkg.mod.attr`` -> ``pkg.mod``); None if foreign."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def build_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (a package stands for its ``__init__``)."""
    files = {module_name(path): path for package in PACKAGES for path in python_files(package)}
    known = set(files)
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        edges = set()
        for node in import_nodes(parse(path)):
            for name in imported_modules(node, module, is_package, known):
                target = owning_module(name, known)
                if target is not None and target != module:
                    edges.add(target)
        graph[module] = edges
    return graph


def strongly_connected_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (no recursion limit): every component, each as a sorted list."""
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = lowlink[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            advanced = False
            for successor in successors:
                if successor not in index:
                    index[successor] = lowlink[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph.get(successor, ())))))
                    advanced = True
                    break
                if successor in on_stack:
                    lowlink[node] = min(lowlink[node], index[successor])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                lowlink[parent] = min(lowlink[parent], lowlink[node])
            if lowlink[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def circle_report(graph: dict[str, set[str]], members: list[str]) -> str:
    """One circle's members and the imports that join them."""
    edges = [f"{source} -> {target}" for source in members for target in sorted(graph[source]) if target in members]
    return f"{members}: " + ", ".join(edges)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return build_graph()


def test_the_cycle_finder_finds_circles_and_only_circles():
    toy = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "d"}}
    assert sorted(strongly_connected_components(toy)) == [["a", "b", "c"], ["d"], ["e"]]


def test_the_graph_sees_lazy_package_and_module_imports(graph):
    env = graph["deliberation_env.env"]
    assert "deliberation_env.core.deliberation" in env
    assert "deliberation_env.core.features" in env  # from deliberation_env.core import features: the module
    assert "deliberation_env.analysis.traces" in env  # imported inside a function
    assert "deliberation_env.replay" in graph["deliberation_env"]  # from a package import a name: its __init__
    assert "deliberation_env.env" in graph["deliberation_env.replay"]  # the __init__'s own (lazy) imports


def test_relative_imports_resolve_against_the_importer():
    def source(statement: str, importer: str, is_package: bool = False) -> str:
        node = ast.parse(statement).body[0]
        assert isinstance(node, ast.ImportFrom)
        return imported_from(node, importer, is_package)

    assert source("from . import base", "deliberation_env.backends.sim") == "deliberation_env.backends"
    assert source("from .base import Request", "deliberation_env.backends.sim") == "deliberation_env.backends.base"
    assert source("from ..core import features", "deliberation_env.backends.sim") == "deliberation_env.core"
    assert source("from .base import Request", "deliberation_env.backends", is_package=True) == \
        "deliberation_env.backends.base"


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circles(graph, package):
    """No strongly connected component of more than one module among a package's modules."""
    inside = {module: {t for t in targets if t.partition(".")[0] == package}
              for module, targets in graph.items() if module.partition(".")[0] == package}
    circles = [members for members in strongly_connected_components(inside) if len(members) > 1]
    assert not circles, f"import circles in {package}:\n" + "\n".join(circle_report(inside, c) for c in circles)


def test_the_library_never_imports_baselines(graph):
    offenders = sorted(f"{module} -> {target}" for module, targets in graph.items()
                       if module.partition(".")[0] == "deliberation_env"
                       for target in targets if target.partition(".")[0] == "baselines")
    assert not offenders, "deliberation_env must not depend on baselines: " + ", ".join(offenders)


def test_no_module_imports_another_modules_private_names():
    """``from x import _name`` reaches into another module's internals: make the name public, or move it."""
    offenders = []
    for folder in SOURCE_FOLDERS:
        for path in python_files(folder):
            module = module_name(path)
            for node in import_nodes(parse(path)):
                if not isinstance(node, ast.ImportFrom):
                    continue
                source = imported_from(node, module, path.name == "__init__.py")
                if source.partition(".")[0] not in SOURCE_FOLDERS or source == module:
                    continue
                offenders += [f"{path.relative_to(ROOT)}:{node.lineno}: from {source} import {alias.name}"
                              for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert not offenders, "imports of private names:\n" + "\n".join(offenders)


def test_the_backend_protocol_knows_nothing_of_the_simulator_or_the_tasks(graph):
    """Requests carry no simulator state: ``backends.base`` reaches neither ``backends.sim*`` nor ``tasks``, not
    even through the modules it imports (the sim asks the deliberation for its context: ``backends.sim_context``)."""
    reached, frontier = set(), ["deliberation_env.backends.base"]
    while frontier:
        for target in graph[frontier.pop()] - reached:
            reached.add(target)
            frontier.append(target)
    offenders = sorted(module for module in reached
                       if module.startswith(("deliberation_env.backends.sim", "deliberation_env.tasks")))
    assert not offenders, f"deliberation_env.backends.base reaches {offenders}"
