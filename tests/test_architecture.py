"""The import structure: one layer per concern, no import circles, the library never imports ``baselines``.

Pure ``ast``: every import statement of every module counts, including those inside functions and
under ``TYPE_CHECKING`` (a circle that only lazy imports break is still a circle in the design).
"""

from __future__ import annotations

import ast
import re
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
    """Every Python file of ``folder``."""
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
    assert "deliberation_env.analysis.traces" in graph["deliberation_env.make"]  # imported inside a function
    assert "deliberation_env.registry" in graph["deliberation_env"]  # from a package import a name: its __init__
    assert "deliberation_env.make" in graph["deliberation_env.analysis.calibrate"]  # inside the program's main


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


LAYERS = {"env": "deliberation_env.env", "replay": "deliberation_env.replay", "analysis": "deliberation_env.analysis"}
"""Modules whose imports go one way only: the env imports replay (binding a replay backend); analysis takes an env
factory as an argument; neither is imported back."""
FACTORIES = "deliberation_env.make"
"""``parallel_env`` and ``replay_env``: above the env, replay and analysis (``trace=`` wraps the env in
``analysis.traces.TraceWrapper``)."""
FACTORY_CALLERS_IN_ANALYSIS = frozenset({"deliberation_env.analysis.calibrate"})
"""The program of analysis: its ``main`` picks the factory (``parallel_env``) that the rest of analysis takes."""


def reachable(graph: dict[str, set[str]], start: set[str]) -> set[str]:
    seen, todo = set(start), list(start)
    while todo:
        module = todo.pop()
        for target in graph.get(module, ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def in_layer(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_env_replay_and_analysis_import_each_other_one_way_only(graph):
    """No two of env, replay and analysis reach each other both ways (directly or through other modules), with no
    edge left out: no alias re-exports a name from a layer above (``replay_env`` lives in ``make`` alone)."""
    below_the_program = {module: targets for module, targets in graph.items()
                         if module not in FACTORY_CALLERS_IN_ANALYSIS}
    reach = {name: reachable(below_the_program, {m for m in below_the_program if in_layer(m, prefix)})
             for name, prefix in LAYERS.items()}
    two_way = [f"{a} <-> {b}" for a in LAYERS for b in LAYERS if a < b
               and any(in_layer(m, LAYERS[b]) for m in reach[a]) and any(in_layer(m, LAYERS[a]) for m in reach[b])]
    assert not two_way, "two-way imports: " + ", ".join(two_way)
    assert any(in_layer(m, LAYERS["replay"]) for m in graph["deliberation_env.env"])  # the one way that is used


def test_the_factories_sit_above_env_replay_and_analysis(graph):
    """No module of env, replay or analysis reaches ``make`` (analysis takes an env factory as an argument), but the
    program ``analysis.calibrate``, which picks it; and no library module imports that program."""
    reaching = sorted(module for module in graph if any(in_layer(module, prefix) for prefix in LAYERS.values())
                      and module not in FACTORY_CALLERS_IN_ANALYSIS and FACTORIES in reachable(graph, {module}))
    assert not reaching, f"modules below the factories that reach {FACTORIES}: {reaching}"
    importers = sorted(module for module, targets in graph.items() if targets & FACTORY_CALLERS_IN_ANALYSIS)
    assert not importers, f"the program analysis.calibrate is imported by {importers}"
    assert FACTORIES in graph["deliberation_env.analysis.calibrate"]  # the rule sees the one that picks it


def test_the_env_constructor_is_small():
    """A task, a backend, a config, a split, a format and a few PettingZoo options; the flat keywords of
    ``parallel_env`` reach it through ``**options`` and are mapped in one place (``deliberation_env.options``)."""
    import inspect

    from deliberation_env.env import DeliberationEnv

    parameters = [name for name in inspect.signature(DeliberationEnv.__init__).parameters if name != "self"]
    assert len(parameters) <= 10, parameters


@pytest.mark.parametrize(("importer", "banned"), [("baselines.evaluation", "baselines.meta"),
                                                  ("baselines.llm", "baselines.meta")])
def test_one_product_does_not_depend_on_the_other(graph, importer, banned):
    """The evaluation both products share never reaches the meta-policy trainer (its rollouts, its policy, its CLI),
    and neither does the LLM trainer: the LLM product does not depend on the meta product."""
    offenders = sorted(f"{module} -> {target}" for module in graph if module.startswith(importer)
                       for target in reachable(graph, {module}) if target.startswith(banned))
    assert not offenders, f"{importer} must not depend on {banned}: " + ", ".join(offenders)


GROUPER_MODULE = "deliberation_env/grouping.py"
"""The request grouper, and ``answer_pending``: the one loop that answers envs' pending requests."""
RUNNER_MODULES = frozenset({"deliberation_env/vector.py", "deliberation_env/env.py", "deliberation_env/text.py",
                            "deliberation_env/analysis/traces.py"})
"""The episode runner and the env forms it drives (the env, the text env, the trace wrapper): the only code that
calls the envs' phased reset/step."""
PHASES = frozenset({"begin_episode", "begin_reset", "end_reset", "begin_step", "end_step"})


def called_names(node: ast.AST) -> set[str]:
    """The names of every function or method ``node`` calls (``f(...)`` and ``x.f(...)`` both give ``f``), but for
    ``super().f(...)``: a subclass extending a method does not drive it."""
    names = set()
    for call in ast.walk(node):
        if isinstance(call, ast.Call):
            if isinstance(call.func, ast.Name):
                names.add(call.func.id)
            elif isinstance(call.func, ast.Attribute) and not is_super_call(call.func.value):
                names.add(call.func.attr)
    return names


def is_super_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def library_and_script_files() -> Iterator[tuple[str, ast.Module]]:
    for folder in (*PACKAGES, "bench", "scripts", "examples"):
        for path in python_files(folder):
            yield path.relative_to(ROOT).as_posix(), parse(path)


def test_one_loop_answers_pending_requests_and_one_runner_plays_episodes():
    """Only ``answer_pending`` sends envs' pending requests to backends (no second wave loop), only the grouper
    module calls ``generate_by_backend``, and only the episode runner (and the env forms themselves) drive the
    phased reset/step: every other caller plays through ``deliberation_env.vector.run_episodes``."""
    loops, groupers, phases = [], [], []
    for name, tree in library_and_script_files():
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            calls = called_names(function)
            if "pending_requests" in calls and calls & {"generate_by_backend", "generate_grouped", "generate"}:
                loops.append(f"{name}:{function.name}")
        calls = called_names(tree)
        if "generate_by_backend" in calls and name != GROUPER_MODULE:
            groupers.append(name)
        if calls & PHASES and name not in RUNNER_MODULES:
            phases.append(f"{name}: {sorted(calls & PHASES)}")
    assert loops == [f"{GROUPER_MODULE}:answer_pending"], f"a second loop answers pending requests: {loops}"
    assert not groupers, f"call generate_by_backend through answer_pending or generate_grouped: {groupers}"
    assert not phases, f"play episodes through deliberation_env.vector.run_episodes, not the phases: {phases}"


def test_the_library_does_not_depend_on_its_test_servers(graph):
    """``deliberation_env.testing`` (loopback servers for tests and benches) ships in the package, but no other
    module of the library imports it."""
    offenders = sorted(f"{module} -> {target}" for module, targets in graph.items()
                       if module.startswith("deliberation_env") and not module.startswith("deliberation_env.testing")
                       for target in targets if target.startswith("deliberation_env.testing"))
    assert not offenders, "the library must not depend on deliberation_env.testing: " + ", ".join(offenders)


BENCH_BOOTSTRAP = "sys.path.insert(1, str(Path(__file__).resolve().parents[2]))"
"""The one path edit allowed, a bench script's first statement after its imports of the standard library: run by its
path (``python bench/<folder>/NAME.py``, from the root or its folder), it puts the repository's root on the path so
that ``import bench`` finds the package."""


def test_no_alias_modules_and_no_path_edits():
    """No module replaces itself in ``sys.modules`` (an alias of a moved module), and nothing edits ``sys.path`` but a
    bench script's bootstrap line (``BENCH_BOOTSTRAP``)."""
    aliases, path_edits = [], []
    for name, tree in library_and_script_files():
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(ast.unparse(t) == "sys.modules[__name__]" for t in node.targets):
                aliases.append(name)
            if isinstance(node, ast.Call) and ast.unparse(node.func).startswith("sys.path.") and not (
                    re.fullmatch(r"bench/\w+/[a-z]\w*\.py", name) and ast.unparse(node) == BENCH_BOOTSTRAP):
                path_edits.append(f"{name}:{node.lineno}")
    assert not aliases, f"alias modules: {aliases}"
    assert not path_edits, f"sys.path edits: {path_edits}"


ENTRY_POINT = re.compile(r"-m ((?:deliberation_env|baselines|bench)(?:\.\w+)*)")
DOCUMENTED = ("README.md", "CONTRIBUTING.md", "docs", "examples", "bench", "baselines", "deliberation_env", "scripts",
              ".ci")


def test_every_documented_entry_point_is_a_module_of_the_tree():
    """Every ``python -m ...`` of ours named in the docs, scripts and docstrings is a real module (or package with a
    ``__main__``) of the tree, so that the documented commands run."""
    missing = set()
    for top in DOCUMENTED:
        path = ROOT / top
        files = [path] if path.is_file() else [f for f in sorted(path.rglob("*")) if f.is_file()
                                               and (f.suffix in {".md", ".py", ".sh"} or f.name == "run")
                                               and not EXCLUDED_PARTS.intersection(f.relative_to(ROOT).parts)
                                               and "results" not in f.relative_to(ROOT).parts]
        for file in files:
            for module in ENTRY_POINT.findall(file.read_text(encoding="utf-8")):
                base = ROOT.joinpath(*module.split("."))
                if not (base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()):
                    missing.add(f"{file.relative_to(ROOT)}: python -m {module}")
    assert not missing, "documented entry points that are no module:\n" + "\n".join(sorted(missing))


def test_the_backend_protocol_knows_nothing_of_the_simulator_or_the_tasks(graph):
    """Requests carry no simulator state: ``backends.base`` (and the requests it re-exports) reaches neither
    ``backends.sim*``, the simulator's context nor ``tasks``, not even through the modules it imports (the sim asks the
    deliberation for its context: ``core.sim_context``)."""
    offenders = sorted(module for module in reachable(graph, {"deliberation_env.backends.base"})
                       if module.startswith(("deliberation_env.backends.sim", "deliberation_env.core",
                                             "deliberation_env.tasks")))
    assert not offenders, f"deliberation_env.backends.base reaches {offenders}"


def test_the_seam_is_on_its_own_floor(graph):
    """``deliberation_env.requests`` imports nothing of ours but chat messages; the core reaches no backend (it makes
    requests and reads completions through ``requests``; the sim's context is a hook the core owns); the grouper is
    above both; and ``backends.base`` still gives users the moved names."""
    assert graph["deliberation_env.requests"] <= {"deliberation_env.chat"}
    core = [module for module in graph if module.startswith("deliberation_env.core")]
    offenders = sorted(target for target in reachable(graph, set(core)) if target.startswith("deliberation_env.backends"))
    assert not offenders, f"the core reaches the backends: {offenders}"
    assert {"deliberation_env.core.tools", "deliberation_env.backends.base"} <= graph["deliberation_env.grouping"]
    import deliberation_env.backends.base as base
    import deliberation_env.requests as requests

    for name in ("Request", "Completion", "RequestKind", "sanitize_completion", "MAX_TOKEN_COUNT"):
        assert getattr(base, name) is getattr(requests, name) and name in base.__all__


@pytest.mark.parametrize("old, new", [("deliberation_env.backends.grouping", "deliberation_env.grouping"),
                                      ("deliberation_env.backends.sim_context", "deliberation_env.core.sim_context")])
def test_a_moved_module_is_an_error_naming_its_new_place(old, new):
    import importlib

    with pytest.raises(ImportError, match=f"{old} moved to {new}"):
        importlib.import_module(old)


GENERATE_EXCEPTIONS = {
    ("deliberation_env/backends/transformers.py", "_generate"): "calls the Hugging Face model's generate, no backend's",
    ("deliberation_env/cli.py", "build"): "generate([]) with no request: opens a cache file when the flags are read",
    ("deliberation_env/testing/lora_server.py", "_chat"): "a test server answering one HTTP request with a backend",
}
"""The calls of a ``generate`` method outside the grouper and the backend wrappers, each with the reason."""


def generate_calls(tree: ast.Module) -> Iterator[tuple[str | None, int]]:
    """(the innermost enclosing function's name, line) of every ``x.generate(...)`` call."""
    def visit(node: ast.AST, function: str | None) -> Iterator[tuple[str | None, int]]:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr == "generate":
                yield function, child.lineno
            yield from visit(child, inner)

    return visit(tree, None)


def test_requests_reach_backends_through_the_grouper():
    """Outside the grouper (``grouping.py``), a backend's ``generate`` is called only by another backend's
    ``generate`` (a wrapper: the cache, the tools, replay's fallback, the LLM trainer's samplers) and by the named
    exceptions: the recorder, the runner and the env forms send their batches through the grouper."""
    offenders = []
    for package in PACKAGES:
        for path in python_files(package):
            name = path.relative_to(ROOT).as_posix()
            for function, line in generate_calls(parse(path)):
                if name != GROUPER_MODULE and function != "generate" and (name, function) not in GENERATE_EXCEPTIONS:
                    offenders.append(f"{name}:{line} (in {function})")
    assert not offenders, f"send requests through deliberation_env.grouping (generate_grouped): {offenders}"
    assert list(generate_calls(parse(ROOT / GROUPER_MODULE))), "the grouper itself sends the requests"


EPISODE_LOOPS = {
    "deliberation_env/vector.py": "the episode runner itself",
    "deliberation_env/wrappers.py": "wrappers pass reset and step on to the env they wrap",
    "deliberation_env/engine/gym.py": "the compiled engine's Gymnasium form: its reset and step are the engine's arrays",
    "deliberation_env/demo.py": "prints a plain PettingZoo loop step by step, as a user writes one",
    "baselines/llm/rollout.py": "the text env's tree rollout: each node's env is forked per joint action and each fork "
                                "stepped with its own sampled completions; run_episodes plays episodes, not trees",
    "baselines/meta/tree_rollout.py": "plays a compiled tree (engine.TreeEnv: B episodes per numpy call, no backend)",
    "baselines/peers/benchmarl_task.py": "the engine under TorchRL's EnvBase, whose collector calls _reset and _step",
    "bench/benchmark/env_throughput.py": "measures the plain PettingZoo loop a user writes against another env's",
    "bench/benchmark/replay_benchmark.py": "reads signals off single states (each problem reset, then at most one "
                                           "REFINE step, per confidence source), not played episodes",
    "bench/benchmark/train_throughput.py": "its bare row is the plain PettingZoo loop that collect() is measured against",
    "examples/own_algorithm.py": "shows the PettingZoo loop a user's own algorithm writes",
    "examples/random_policy.py": "shows the PettingZoo loop a user writes",
    "examples/text_env_own_llm.py": "shows the text env's loop a user with their own LLM writes",
    "examples/interop/rllib_ppo.py": "shows a trained RLlib policy played in the PettingZoo loop",
}
"""The modules that reset and step envs by hand instead of through ``deliberation_env.vector.run_episodes``, each
with the reason: every other episode (rollouts, evaluation, analysis, the bench) is played by the runner."""
NOT_EPISODES = ("optimizer", "scheduler")
"""Receivers of ``.step()`` that are no env: torch's optimizers and learning-rate schedulers."""


def steps_episodes_by_hand(tree: ast.Module) -> bool:
    """Whether a module calls ``x.reset(...)`` and ``y.step(...)`` (y no optimizer or scheduler)."""
    called: dict[str, list[str]] = {"reset": [], "step": []}
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr in called:
            called[call.func.attr].append(ast.unparse(call.func.value))
    return bool(called["reset"]) and any(not receiver.endswith(NOT_EPISODES) for receiver in called["step"])


def test_episodes_are_played_by_the_runner_or_are_named_exceptions():
    """Every module that resets and steps envs itself is a named exception (``EPISODE_LOOPS``), and every exception
    still does: a new hand-written episode loop, or a stale exception, fails here."""
    found = {name for name, tree in library_and_script_files() if steps_episodes_by_hand(tree)}
    assert found - set(EPISODE_LOOPS) == set(), "play these episodes through run_episodes, or name the module in " \
                                                f"EPISODE_LOOPS with the reason: {sorted(found - set(EPISODE_LOOPS))}"
    assert set(EPISODE_LOOPS) - found == set(), f"stale EPISODE_LOOPS entries: {sorted(set(EPISODE_LOOPS) - found)}"



LONGEST_FUNCTION = 80
"""Lines of the longest function (its signature, docstring and body): past that, name its steps as functions."""


def test_no_function_is_longer_than_a_screen():
    long = [f"{name}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for name, tree in library_and_script_files() for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno is not None and node.end_lineno - node.lineno + 1 > LONGEST_FUNCTION]
    assert not long, f"functions over {LONGEST_FUNCTION} lines: {long}"
