"""The tier of a test: `unit`, `process` or `model` (pytest markers, assigned at collection by tests/conftest.py).

- process: the test's module starts other processes (a service, redis-server, a script, a compiler run by a
  subprocess), or imports a helper that does;
- model: the module loads a real model (the 135M or 270M checkpoint, the model fixtures of tests/model/conftest.py);
- unit: neither; in-process and quick, so scripts/test.sh runs this tier first and stops at its first failure.

A test in both process and model gets both markers. The tier is read from the module's source, so a new test file
gets its tier without a marker of its own; `@pytest.mark.process` or `@pytest.mark.model` on a test adds one the
scan cannot see (and takes it out of the unit tier).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

TIERS = ("unit", "process", "model")

# Calls and names that start a process: the standard library's, and the test helpers' that start services.
_PROCESS = re.compile(
    r"\bsubprocess\b|\bPopen\b|\bmultiprocessing\b|\bos\.fork\b|\bstart_service\b|\bstart_engine\b"
    r"|\bstart_gateway\b|\bstart_stack\b|\bstart_kvstore\b|\bKVStoreProcess\b|\bServiceProcess\b"
    r"|\bRedisServer\b|\bredis_server\b|\bcreate_subprocess_exec\b"
)
# A real model's name, or a fixture that holds one (tests/model/conftest.py).
_MODEL = re.compile(
    r"(?<!synthetic-)\bgemma-3-270m\b|\bsmollm2-135m|\bSMOLLM\b|\bint8_model\b|\bfp32_model\b|\bgreedy_refs\b"
    r"|\bsmollm_reference\b|\bDEFAULT_MODEL\b|\bdefault_gguf_path\b"
)


@functools.cache
def module_tiers(path: Path) -> frozenset[str]:
    """The tiers other than unit that a test module's source shows ({} for a unit module)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return frozenset()
    found = set()
    if _PROCESS.search(text):
        found.add("process")
    if _MODEL.search(text):
        found.add("model")
    return frozenset(found)


def tiers_of(path: Path, explicit: set[str]) -> set[str]:
    """The tiers of a test in module `path` with the tier markers `explicit` set on it by hand."""
    heavy = set(module_tiers(path)) | (explicit & {"process", "model"})
    return heavy or {"unit"}
