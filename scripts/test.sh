#!/usr/bin/env bash
# Quickstart command 2: set up (if needed) and run the whole test suite, in tiers (docs/testing.md): the unit tier
# first, stopping at its first failure; then the process and model tiers; then, on an AVX-512 CPU, the kernel and
# model-exactness tests once more as on an AVX2 CPU (SALON_CPU_ISA=avx2). Arguments: one pytest run with them instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_dev.sh
# Convert the default model once (a no-op when cached) before tests start engines in parallel.
.venv/bin/salon convert
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest -q "$@"
fi
.venv/bin/python -m pytest -q -m unit -x
.venv/bin/python -m pytest -q -m "not unit"
if grep -qw avx512f /proc/cpuinfo; then
    # The C kernels' tests (not their PyTorch paths, nor the build cache's: those have no ISA) and the model's
    # exactness tests (not the fused layer's long-context case, 4 of this pass's 8 minutes), with AVX-512 masked:
    # the AVX2 builds and the int16 recipe as an AVX2 CPU serves them.
    SALON_CPU_ISA=avx2 .venv/bin/python -m pytest -q \
        -k "not torch and not test_kernels_cpu_native and not past_the_window" \
        tests/kernels/test_kernels_backend.py tests/kernels/test_kernels_cpu_*.py \
        tests/model/test_model_decoder_block.py tests/model/test_model_fused_linear.py \
        tests/engine/test_engine_logits_exact.py
fi
