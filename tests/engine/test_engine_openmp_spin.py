"""The engine bounds its OpenMP threads' spin before torch loads libgomp, unless the operator chose one
(salon/engine/openmp_spin.py); what the bound does is tests/engine/test_engine_openmp_team.py's neighbour test."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from salon.engine.openmp_spin import OPERATOR_CHOICES, SPIN_COUNT, bound_openmp_spin


def _python(code: str, env: dict[str, str]) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in OPERATOR_CHOICES}
    done = subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout.strip()


def test_the_engine_entry_point_sets_the_spin_before_torch_loads():
    code = (
        "import os, sys\n"
        "import salon.engine.__main__\n"
        "print(os.environ.get('GOMP_SPINCOUNT'), 'torch' in sys.modules)\n"
    )
    assert _python(code, {}) == f"{SPIN_COUNT} True"


@pytest.mark.parametrize(
    ("chosen", "expected"),
    [
        ({}, {"GOMP_SPINCOUNT": str(SPIN_COUNT)}),
        ({"GOMP_SPINCOUNT": "7"}, {"GOMP_SPINCOUNT": "7"}),
        ({"OMP_WAIT_POLICY": "active"}, {"OMP_WAIT_POLICY": "active"}),
    ],
)
def test_an_operators_choice_stands(chosen, expected):
    code = (
        "import json\n"
        "from salon.engine.openmp_spin import bound_openmp_spin\n"
        f"environ = {chosen!r}\n"
        "bound_openmp_spin(environ)\n"
        "print(json.dumps(environ))\n"
    )
    assert json.loads(_python(code, {})) == expected


def test_too_late_once_torch_is_loaded():
    import torch  # noqa: F401

    with pytest.raises(RuntimeError, match="before torch is imported"):
        bound_openmp_spin({})
