"""No module under rlvr/ imports a layer above its own: imports point one way, down the table.

The table is the project's layering (docs/architecture.md draws it). Every import counts:
module level, inside functions (the lazy imports that keep the CLI fast), and under
TYPE_CHECKING. A new top-level module or package must be given a layer here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

RLVR = Path(__file__).resolve().parents[2] / "rlvr"

# Lowest first. A module may import its own layer and those before it, never one after it.
LAYERS: list[tuple[str, ...]] = [
    ("rlvr", "rlvr.types", "rlvr.rundir", "rlvr.process", "rlvr.rendezvous", "rlvr.models"),
    ("rlvr.recipe",),
    ("rlvr.data", "rlvr.rewards", "rlvr.algorithms", "rlvr.weight_arena", "rlvr.tiny"),
    ("rlvr.rollout", "rlvr.trainer", "rlvr.tools", "rlvr.quickstart"),
    ("rlvr.sync", "rlvr.monitor", "rlvr.evaluation"),
    ("rlvr.controller",),
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
    """The layer of `module`: that of its top-level unit (`rlvr.launch.node` -> `rlvr.launch`)."""
    parts = module.split(".")
    return LAYER_OF.get(".".join(parts[:2])) if len(parts) > 1 else LAYER_OF.get(module)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every `import` and `from ... import` in the file, at any depth."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((node.lineno, target))
    return [(line, module) for line, module in out if module == "rlvr" or module.startswith("rlvr.")]


SOURCES = sorted(RLVR.rglob("*.py"))


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
