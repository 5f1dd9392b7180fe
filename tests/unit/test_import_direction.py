"""No module under rlvr/ imports a layer above its own, and no rlvr modules import each other in a cycle.

The table is the project's layering (docs/architecture.md draws it). Every import counts:
module level, inside functions (the lazy imports that keep the CLI fast), and under
TYPE_CHECKING. A new top-level module or package must be given a layer here.

Within a layer imports may go either way, but never round: the graph of every import between rlvr
modules has no cycle (`a -> b -> a`), so a function-level import is never what keeps two modules
apart. Its edges: `import a.b` and `from a.b import c` point at `a.b`, or at the submodule `a.b.c`
when `c` is one (`from rlvr.trainer import dist`); relative imports are resolved. Importing `a.b`
also runs the package `a/__init__.py`, but that is no edge: a package is reached only by importing
it by name. A package `__init__` that imports its own submodules (`rlvr.sync`) has those edges like
any module, so a submodule importing a name from its package's `__init__` back is a cycle too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

RLVR = Path(__file__).resolve().parents[2] / "rlvr"

# Lowest first. A module may import its own layer and those before it, never one after it.
LAYERS: list[tuple[str, ...]] = [
    (
        "rlvr",
        "rlvr.types",
        "rlvr.rundir",
        "rlvr.process",
        "rlvr.rendezvous",
        "rlvr.models",
        "rlvr.bridge",
        "rlvr.plugins",
    ),
    ("rlvr.recipe",),
    ("rlvr.sandbox", "rlvr.sync.group", "rlvr.sync.fingerprint"),
    ("rlvr.data", "rlvr.rewards", "rlvr.algorithms", "rlvr.weight_arena", "rlvr.tiny"),
    ("rlvr.rollout", "rlvr.server", "rlvr.trainer", "rlvr.tools", "rlvr.quickstart"),
    ("rlvr.sync", "rlvr.monitor", "rlvr.evaluation", "rlvr.validate"),
    ("rlvr.collect",),
    ("rlvr.loop",),
    ("rlvr.worker",),
    ("rlvr.launch",),
    ("rlvr.cli",),
]
LAYER_OF = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(RLVR.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int | None:
    """The layer of `module`: its own entry if it has one (`rlvr.sync.group`, which rollout servers
    import), else that of its top-level unit (`rlvr.launch.node` -> `rlvr.launch`)."""
    parts = module.split(".")
    if module in LAYER_OF:
        return LAYER_OF[module]
    return LAYER_OF.get(".".join(parts[:2])) if len(parts) > 1 else None


def imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every `import` (names: []) and `from module import names` in the
    file, at any depth; relative modules resolved."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[tuple[int, str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((node.lineno, target, [alias.name for alias in node.names]))
    return out


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every `import` and `from ... import` of rlvr in the file, at any depth."""
    return [(line, module) for line, module, _ in imports(path) if module == "rlvr" or module.startswith("rlvr.")]


SOURCES = sorted(RLVR.rglob("*.py"))
MODULES = {module_name(p) for p in SOURCES}


def import_graph() -> dict[str, set[str]]:
    """Module -> the rlvr modules it imports (see the docstring above for what is an edge)."""
    graph: dict[str, set[str]] = {}
    for path in SOURCES:
        name = module_name(path)
        targets = graph.setdefault(name, set())
        for _, module, names in imports(path):
            for target in [f"{module}.{n}" if f"{module}.{n}" in MODULES else module for n in names] or [module]:
                if target in MODULES and target != name:
                    targets.add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The shortest cycle through each module that lies on one, each once, starting at its
    smallest module: `[a, b, a]` for a module `a` importing `b` and `b` importing `a`."""
    found: set[tuple[str, ...]] = set()
    for start in sorted(graph):
        parent: dict[str, str] = {}
        frontier, seen = [start], {start}
        while frontier and start not in parent:  # breadth first: the first way back is a shortest one
            step = []
            for module in frontier:
                for target in sorted(graph.get(module, ())):
                    if target == start and start not in parent:
                        parent[start] = module
                    elif target not in seen:
                        seen.add(target)
                        parent[target] = module
                        step.append(target)
            frontier = step
        if start in parent:
            path, module = [], parent[start]  # walked back from the module that imports start
            while module != start:
                path.append(module)
                module = parent[module]
            path = [start, *reversed(path)]
            first = path.index(min(path))
            found.add(tuple(path[first:] + path[:first]))
    return [[*cycle, cycle[0]] for cycle in sorted(found)]


def test_every_module_has_a_layer() -> None:
    missing = sorted({module_name(p) for p in SOURCES if layer(module_name(p)) is None})
    assert not missing, f"give these a layer in LAYERS: {missing}"


@pytest.mark.parametrize("path", SOURCES, ids=[module_name(p) for p in SOURCES])
def test_imports_point_down(path: Path) -> None:
    own = layer(module_name(path))
    assert own is not None
    upward = [
        f"{path.relative_to(RLVR.parent)}:{line} imports {module} ({LAYERS[target][0]} layer)"
        for line, module in imported_modules(path)
        if (target := layer(module)) is not None and target > own
    ]
    assert not upward, "\n".join(upward)


def test_the_check_sees_function_level_imports(tmp_path: Path) -> None:
    """A lazy import inside a function counts like one at the top of the file."""
    source = RLVR / "worker.py"
    lazy = [module for line, module in imported_modules(source) if module == "rlvr.loop"]
    assert lazy, "rlvr.worker imports rlvr.loop inside main(): the scan must see it"
    assert layer("rlvr.launch.node") == layer("rlvr.launch") > layer("rlvr.worker")


def test_no_import_cycles() -> None:
    """A cycle is removed by moving the code both modules need below them, never by hiding an import."""
    found = cycles(import_graph())
    assert not found, "import cycles between rlvr modules:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_cycle_check_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c", "a"}, "c": {"a"}, "d": {"a"}, "e": {"e2"}, "e2": {"e"}}
    assert cycles(graph) == [["a", "b", "a"], ["a", "b", "c", "a"], ["e", "e2", "e"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_graph_resolves_submodules_and_sees_function_level_imports() -> None:
    graph = import_graph()
    assert "rlvr.trainer.dist" in graph["rlvr.trainer.model"]  # `from rlvr.trainer import dist as d`
    assert "rlvr.loop" in graph["rlvr.worker"]  # inside main()
    assert "rlvr.sandbox" in graph["rlvr.sandbox.local"]  # a name from the package __init__
