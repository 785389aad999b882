"""scripts/gpu_check.sh --rehearse: every step of the GPU check on the CPU (Triton's interpreter, tiny shapes),
each step's RESULT line with the keys the GPU run prints; every script in scripts/ passes `bash -n` and shellcheck."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.requirements import require_tools

ROOT = Path(__file__).resolve().parents[2]
GPU_KEYS = {
    "device", "model", "step_ms_host", "step_ms_gpu", "launches_per_step", "copy_gbps", "floor_step_ms_b1",
    "decode", "prefill", "recipe_decode", "linear_recipes", "peer", "errors",
}  # fmt: skip
DECODE_KEYS = {"salon_tps", "peer_tps", "salon_over_peer_median_x", "salon_over_peer_range_x", "floor_step_ms"}


@pytest.mark.parametrize("script", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "scripts").glob("*.sh")))
def test_scripts_parse_and_pass_shellcheck(script):
    subprocess.run(["bash", "-n", script], cwd=ROOT, check=True)
    require_tools("shellcheck", why="Debian package shellcheck")
    subprocess.run(["shellcheck", "--external-sources", script], cwd=ROOT, check=True)  # and the files it sources


def test_wheel_list_pins_exact_versions():
    out = subprocess.run(["bash", "scripts/gpu_check.sh", "--list-wheels"], cwd=ROOT, capture_output=True, text=True)
    wheels = out.stdout.split()
    assert {"safetensors", "structlog", "gguf", "jinja2", "tokenizers", "sentencepiece"} <= {
        w.split("==")[0] for w in wheels
    }
    assert all("==" in w for w in wheels)


@pytest.mark.timeout(420)
def test_rehearsal_prints_every_result(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--rehearse"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=400
    )
    summary = (tmp_path / "summary.txt").read_text()
    for step in ("imports", "tests", "kernels", "gpu"):
        assert f"{step} exit=0" in summary, (summary, proc.stdout[-2000:], proc.stderr[-2000:])
    results = {}
    for line in (tmp_path / "results.txt").read_text().splitlines():
        step, _, payload = line.split(" ", 2)
        results[step] = json.loads(payload)
    assert results["imports"] == {"imports_missing": 0}
    assert results["kernels"]["cuda"] is False and results["kernels"]["interpreter_max_abs_err"]
    kernels = results["kernels"]
    assert kernels["interpreter_max_abs_err"]["w8a8_grouped"] == 0  # bit-equal to the grouped reference
    assert kernels["grouped_copy_gbps"] > 0 and 0 < kernels["grouped_best_copy_frac"]
    assert {r["layer"] for r in kernels["grouped_gemm"]} == {"qkv", "gate_up"}
    assert all(r["weight_copies"] * r["n"] * r["k"] > 2 * kernels["grouped_l2_bytes"] for r in kernels["grouped_gemm"])
    gpu = results["gpu"]
    assert GPU_KEYS <= gpu.keys() and gpu["rehearse"] is True
    assert set(gpu["decode"]) == {"1", "2"} and all(DECODE_KEYS <= row.keys() for row in gpu["decode"].values())
    # the peer is measured, never left out: transformers is in the dev extra
    assert gpu["peer"] is not None and gpu["decode"]["1"]["peer_tps"] > 0, gpu["errors"]
    assert gpu["decode"]["1"]["salon_tps"] > 0 and gpu["prefill"]["8"]["salon_tps"] > 0
    # the activation recipes, alternated: the engine's decode with each, and the Linear ops at the layer shapes
    recipe = gpu["recipe_decode"]["1"]
    assert recipe["two_terms_tps"] > 0 and recipe["group32_tps"] > 0, gpu["errors"]
    low, high = recipe["group32_over_two_terms_range_x"]
    assert low <= recipe["group32_over_two_terms_median_x"] <= high
    assert {(r["layer"], r["m"]) for r in gpu["linear_recipes"]} == {("qkv", 1), ("qkv", 3), ("down", 1), ("down", 3)}
    assert all(r["two_terms_ms"] > 0 and r["group32_ms"] > 0 for r in gpu["linear_recipes"])
