"""Which paged-attention build the CPU family runs (salon.kernels.cpu.paged_attention.build): the builds give
different bits, so the engine's KV namespace names it (tests/crossturn/test_crossturn_kv_transfer.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from salon.kernels.backend import cpu_ops
from salon.kernels.cpu import native
from salon.kernels.cpu import paged_attention as cpu_attention


def test_the_build_is_this_cpus_first_c_kernel():
    if not cpu_attention.c_isas():
        pytest.skip("no C kernel runs on this CPU")
    assert cpu_attention.build() == cpu_attention.c_isas()[0]
    assert cpu_ops().build == cpu_attention.build()


def test_without_a_c_kernel_the_build_is_the_pytorch_path(monkeypatch):
    monkeypatch.setattr(native, "simd_isa", lambda isa=None: None)
    assert cpu_attention.build() == "torch"


def test_an_avx2_process_on_an_avx512_cpu_runs_and_names_the_avx2_build():
    if "avx512" not in cpu_attention.c_isas():
        pytest.skip("this CPU does not run the avx512 C kernel")
    code = (
        "from salon.engine.worker.model_loading import load_model\n"
        "from tests.engine_testlib import make_core\n"
        "print(make_core(load_model('synthetic-tiny', 'int8'), kv_bytes=1 << 20).kernel_family)\n"
    )
    env = {**os.environ, native.CPU_ISA_ENV: "avx2"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "cpu-avx2"
