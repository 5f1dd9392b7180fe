"""Plug-in references -> objects: one loader for reward and tool plug-ins and reward worker jobs.

A reference is `package.module:attr` (`attr` may be dotted: `module:Class.method`); importing the
module runs it, so a module that registers on import (`@register` of a built-in reward) is loaded
by the same call. Every failure is one `PluginError` line that names the reference, what went wrong
and what was expected. Modules come from the installed packages, PYTHONPATH and the folders in
`RLVR_PLUGIN_PATH`, which `validate`, `launch` and `rewards check` set to the recipe's folder for
themselves and the processes they start (docs/rewards.md).
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

PLUGIN_PATH_ENV = "RLVR_PLUGIN_PATH"
"""Folders plug-ins are imported from (os.pathsep-separated), after the installed packages."""


class PluginError(ImportError):
    """A plug-in reference that does not resolve; `str()` is the one line a user sees."""


def load_plugin(ref: str, *, kind: str = "plug-in", form: str = "package.module:function") -> Any:
    """The object `ref` names. `kind` starts the error line (`tool plug-in 'x:y': ...`) and
    `form` is the reference's expected shape."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise PluginError(f"{kind} {ref!r} must look like {form!r}")
    module = import_plugin_module(module_name, ref=ref, kind=kind)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(module) if not n.startswith("_"))[:20]
            raise PluginError(f"{kind} {ref!r}: module {module_name!r} has no attribute {attr!r} (has: {public})")
        obj = getattr(obj, part)
    return obj


def import_plugin_module(module_name: str, *, ref: str, kind: str = "plug-in") -> ModuleType:
    """Import `module_name` from the plug-in folders too; a failure is a PluginError naming `ref`."""
    use_plugin_dirs()
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            where = ", ".join(searched_dirs())
            where = f"{where} or the installed packages" if where else "the installed packages"
            raise PluginError(
                f"{kind} {ref!r}: cannot import module {module_name!r}: no {exc.name!r} in {where} "
                "(plug-ins are imported from the recipe's folder, PYTHONPATH and the installed packages)"
            ) from exc
        raise PluginError(f"{kind} {ref!r}: importing module {module_name!r} failed: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - the plug-in's own code failed at import: one line, its cause
        raise PluginError(
            f"{kind} {ref!r}: importing module {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc


def add_plugin_dir(folder: str | Path) -> None:
    """Import plug-ins from `folder` too (the recipe's): in this process, and, through the
    environment, in every process it starts (the trainer that scores; tool plug-ins too)."""
    path = str(Path(folder).resolve())
    dirs = plugin_dirs()
    if path not in dirs:
        os.environ[PLUGIN_PATH_ENV] = os.pathsep.join([*dirs, path])
    use_plugin_dirs()


def plugin_dirs() -> list[str]:
    """The plug-in folders of `RLVR_PLUGIN_PATH`, in order."""
    return [d for d in os.environ.get(PLUGIN_PATH_ENV, "").split(os.pathsep) if d]


def use_plugin_dirs() -> None:
    """Append the plug-in folders to sys.path: after the installed packages, so a `types.py` or
    `datasets.py` beside a recipe cannot shadow a module rlvr needs."""
    missing = [d for d in plugin_dirs() if d not in sys.path]
    if missing:
        sys.path.extend(missing)
        importlib.invalidate_caches()


def searched_dirs() -> list[str]:
    """The folders an import looks in besides Python's own and the installed packages."""
    install = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    out: list[str] = []
    for entry in sys.path:
        folder = os.path.realpath(entry or os.getcwd())
        if (
            os.path.isdir(folder)
            and folder not in out
            and not any(folder == root or folder.startswith(root + os.sep) for root in install)
        ):
            out.append(folder)
    return out
