"""The README's design map against the code: every module of both packages is on it, and it reads top-down (each
entry imports only itself and the entries below it), so that the map a reader sees is the house that is built."""

from __future__ import annotations

import re

from tests.test_architecture import ROOT, build_graph, module_name, python_files

MAP_PACKAGES = ("baselines", "deliberation_env")
"""The packages whose every module the README's design map places."""


def design_map() -> list[tuple[str, str]]:
    """The README's design map as (name, text) entries, top to bottom: a package line (``deliberation_env/``) or an
    entry of one (``  core/``, ``  make.py``, ``  config.py, logger.py``, ``  analysis/calibrate.py``), each with its
    description and continuation lines. Names are paths inside the repository (``deliberation_env/core/``)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("## Design map", 1)[1].split("```", 2)[1]
    entries: list[tuple[str, str]] = []
    package = ""
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        head, _, description = line.strip().partition("  ")
        if indent == 0:
            package = head.split(",")[0].strip()
            entries.append((package, description))
        elif indent == 2:
            for name in head.split(","):
                entries.append((package + name.strip(), description))
        else:  # a continuation line: the entry above goes on
            name, before = entries[-1]
            entries[-1] = (name, f"{before} {line.strip()}")
    return entries


def map_entry_of(module: str, entries: list[tuple[str, str]]) -> int | None:
    """The index of the map entry that holds ``module`` (``deliberation_env.core.seeds``): its own file entry, else its
    folder's entry, which must name it (a package's ``__init__``, and ``__main__``, belong to the folder itself)."""
    path = module.replace(".", "/")
    names = [name for name, _ in entries]
    is_package = (ROOT / path / "__init__.py").is_file()
    if is_package:
        for candidate in (f"{path}/__init__.py", f"{path}/"):
            if candidate in names:
                return names.index(candidate)
        return None
    if f"{path}.py" in names:
        return names.index(f"{path}.py")
    folder, _, stem = path.rpartition("/")
    if f"{folder}/" in names:
        index = names.index(f"{folder}/")
        return index if stem.startswith("__") or re.search(rf"\b{stem}\b", entries[index][1]) else None
    return None


def test_every_package_module_is_on_the_design_map():
    entries = design_map()
    modules = [module_name(path) for package in MAP_PACKAGES for path in python_files(package)]
    missing = [module for module in modules if map_entry_of(module, entries) is None]
    assert not missing, f"modules the README's design map does not name (in their folder's entry): {missing}"
    names = [name for name, _ in entries]
    unknown = [name for name in names if name.partition("/")[0] in MAP_PACKAGES and "/" in name
               and not (ROOT / name).exists()]
    assert not unknown, f"the design map names what is not in the tree: {unknown}"


def test_the_design_map_is_read_top_down():
    """Each map entry imports only itself and the entries listed below it: no import runs back up the map."""
    entries, graph = design_map(), build_graph()
    place = {module: map_entry_of(module, entries) for module in graph}
    upward = sorted(f"{module} -> {target} ({entries[place[target]][0]} is above {entries[place[module]][0]})"
                    for module, targets in graph.items() for target in targets
                    if place[module] is not None and place[target] is not None and place[target] < place[module])
    assert not upward, "imports that run back up the design map:\n" + "\n".join(upward)


def test_the_map_check_sees_a_module_out_of_place():
    """The map check fails for a module left off its folder's entry and for an entry placed above what imports it."""
    entries = design_map()
    moved = [(name, text.replace("seeds", "")) if name == "deliberation_env/core/" else (name, text)
             for name, text in entries]
    assert map_entry_of("deliberation_env.core.seeds", entries) is not None
    assert map_entry_of("deliberation_env.core.seeds", moved) is None
    names = [name for name, _ in entries]
    assert names.index("deliberation_env/make.py") < names.index("deliberation_env/env.py")  # make imports env
