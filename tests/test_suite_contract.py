"""The suite's own contract (docs/testing.md): under CI a missing requirement fails and only the expected skips
pass, and every test gets its tier."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.expected_skips import category
from tests.tiers import module_tiers, tiers_of

REPO = Path(__file__).resolve().parents[1]

SAMPLE = """
import pytest

from tests.requirements import missing


def test_gpu_only():
    pytest.skip("needs CUDA")


def test_stray_skip():
    pytest.skip("the server was slow today")


def test_needs_redis():
    missing("redis-server", "Debian package redis-server")


def test_runs():
    assert True
"""


def test_skip_reasons_by_category() -> None:
    assert category("needs CUDA") == "needs CUDA"
    assert category("no llama.cpp build here (SALON_LLAMA_CPP=DIR, ...)") == "needs llama.cpp"
    assert category("this CPU has no vnni") == "needs AVX-512 (its AVX2 counterpart runs)"
    for reason in (
        "this CPU has no avx2",
        "needs x86-64 with AVX2 and cc",
        "redis-server is missing (Debian package redis-server)",
        "reference file greedy_ref_f64.jsonl is missing (the reference data lives in ../shared/reference)",
        "buf is missing (scripts/setup.sh installs it)",
        "needs CUDA, or a good excuse",
    ):
        assert category(reason) is None, reason


def _run_sample(tmp_path: Path, ci: bool, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(REPO)
    if ci:
        env["CI"] = "true"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "tests.expected_skips", "-p", "no:cacheprovider"]
    return subprocess.run(
        [*command, "-rs", *args, "test_sample.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )


def test_locally_a_missing_requirement_skips(tmp_path) -> None:
    result = _run_sample(tmp_path, ci=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed, 3 skipped" in result.stdout
    assert "redis-server is missing (Debian package redis-server)" in result.stdout


def test_under_ci_a_missing_requirement_fails_and_a_stray_skip_fails_the_session(tmp_path) -> None:
    result = _run_sample(tmp_path, ci=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 failed, 1 passed, 2 skipped" in result.stdout
    assert "redis-server is missing (Debian package redis-server): CI must run this test" in result.stdout
    assert "1 skipped tests that CI must run" in result.stdout
    assert "test_sample.py::test_stray_skip: the server was slow today" in result.stdout
    assert "test_gpu_only" not in result.stdout.split("skipped tests that CI must run")[1]
    # The stray skip alone (every test that ran passed) fails the session.
    result = _run_sample(tmp_path, True, "-k", "not needs_redis")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 passed, 2 skipped, 1 deselected" in result.stdout
    assert "test_sample.py::test_stray_skip: the server was slow today" in result.stdout
    # ... and without it the session passes, the expected skip included.
    result = _run_sample(tmp_path, True, "-k", "not needs_redis and not stray")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed, 1 skipped, 2 deselected" in result.stdout


@pytest.mark.parametrize(
    "path, tiers",
    [
        ("tests/gateway/test_gateway_ring.py", {"unit"}),
        ("tests/gateway/test_gateway_tracing.py", {"process"}),
        ("tests/model/test_model_quality.py", {"model"}),
        ("tests/hardening/test_hardening_tenants.py", {"process"}),
        ("tests/model/test_model_serving_path.py", {"model"}),
    ],
)
def test_tiers_of_known_modules(path: str, tiers: set[str]) -> None:
    assert tiers_of(REPO / path, set()) == tiers


def test_a_tier_marker_set_by_hand_takes_a_test_out_of_the_unit_tier(tmp_path) -> None:
    module = tmp_path / "test_plain.py"
    module.write_text("def test_plain():\n    assert True\n")
    assert module_tiers(module) == frozenset()
    assert tiers_of(module, set()) == {"unit"}
    assert tiers_of(module, {"process"}) == {"process"}
    starts = tmp_path / "test_starts.py"
    starts.write_text("import subprocess\n\ndef test_starts():\n    subprocess.run(['true'], check=True)\n")
    assert tiers_of(starts, set()) == {"process"}
