"""Run a script with SGLang's own modules importable on a CPU machine (see sglang_env.py).

Usage: python sglang_boot.py SCRIPT [ARGS...] with SGLang's cache folder on PYTHONPATH.

triton: SGLang ships a stub for machines without it (`sglang/_platform_stubs.py`,
`install_platform_stubs`, used on Apple silicon); it is installed here by making that
function believe it runs there. torchvision: SGLang's multimodal configs import it at
module level; a stub module of the same kind stands in (transformers is asked first, so
it keeps treating torchvision as absent).
"""

from __future__ import annotations

import importlib.util
import platform
import runpy
import sys
from pathlib import Path


def _load_stubs():
    for entry in sys.path:
        path = Path(entry or ".") / "sglang" / "_platform_stubs.py"
        if path.exists():
            spec = importlib.util.spec_from_file_location("_sglang_platform_stubs", path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            return module
    raise SystemExit("sglang is not on PYTHONPATH")


def install() -> None:
    import torch
    from transformers.utils import import_utils

    stubs = _load_stubs()
    saved = sys.platform, platform.machine, torch.backends.mps.is_available
    sys.platform, platform.machine, torch.backends.mps.is_available = "darwin", (lambda: "arm64"), (lambda: True)  # type: ignore[misc]
    try:
        stubs.install_platform_stubs()
    finally:
        sys.platform, platform.machine, torch.backends.mps.is_available = saved  # type: ignore[misc]
    import_utils.is_torchvision_available()  # cached False before the stub exists

    class TorchvisionStub:
        def find_spec(self, fullname, path=None, target=None):
            if fullname.split(".")[0] != "torchvision":
                return None
            if fullname not in sys.modules:
                module = stubs._make_mock(fullname)
                parent, _, child = fullname.rpartition(".")
                if parent in sys.modules:
                    setattr(sys.modules[parent], child, module)
            return sys.modules[fullname].__spec__

    sys.meta_path.insert(0, TorchvisionStub())


if __name__ == "__main__":
    install()
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
