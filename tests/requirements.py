"""What a test needs from the machine beyond the Python packages: a tool (buf, node, go, javac, shellcheck, ...),
redis-server, or the reference data in ../shared/reference.

Locally a missing one skips the test, with a reason that says what is missing. Under CI (CI=true, as .ci/run sets)
it fails the test instead: CI installs everything (scripts/setup.sh) and has the reference data, so a test there
never passes by skipping. docs/testing.md has the contract, and tests/expected_skips.txt the skips CI allows.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"


def missing(what: str, why: str) -> None:
    """`what` is missing here: skip the test (fail it under CI). `why` says what provides it."""
    message = f"{what} is missing ({why})"
    if IN_CI:
        pytest.fail(f"{message}: CI must run this test", pytrace=False)
    pytest.skip(message)


def require(present: bool, what: str, why: str) -> None:
    """Go on if `present`; else as `missing(what, why)`."""
    if not present:
        missing(what, why)


def require_tools(*tools: str | Path, why: str = "scripts/setup.sh installs it") -> None:
    """Every tool on PATH (a name) or present (a Path); else as `missing`, naming the missing ones."""
    absent = [str(t) for t in tools if not (Path(t).exists() if isinstance(t, Path) else shutil.which(t))]
    require(not absent, ", ".join(absent), why)
