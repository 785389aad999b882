"""The whole tree passes ruff's lint and format checks, with the settings in pyproject.toml."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _ruff() -> list[str]:
    exe = Path(sys.executable).with_name("ruff")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed: `pip install -e '.[dev]'` installs the pinned version")
    return [found]


@pytest.mark.parametrize(
    "command", [["check", "--output-format", "concise"], ["format", "--check", "--diff"]], ids=["lint", "format"]
)
def test_ruff(command):
    run = subprocess.run([*_ruff(), *command, "."], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
