#!/usr/bin/env bash
# The one prepared check for a lent NVIDIA GPU (an H100 or H200 image: PyTorch, Triton, transformers, numpy,
# pytest; no network; a command runs at most 600 s). From the repo root, with .whl/ filled by
# scripts/gpu_wheels.sh and carried along:
#   OUT=/some/dir bash scripts/gpu_check.sh            on the GPU machine (480 s in all at most)
#   OUT=/some/dir bash scripts/gpu_check.sh --rehearse on a CPU: every step at tiny shapes in Triton's interpreter
# Steps, each under its own `timeout`, each log and its RESULT line under $OUT (summary.txt, results.txt):
#   wheels   the packages the GPU image lacks, from .whl/ into /tmp/site (GPU_WHEELS below; not when rehearsing)
#   imports  every module the later steps import, before anything runs (a missing one names its wheel)
#   tests    pytest -m gpu over tests/kernels tests/engine tests/model (tests needing a GGUF skip without it)
#   kernels  python -m bench.kernels --quick
#   gpu      python -m bench.gpu --quick (salon's engine against transformers' compiled Gemma 3, and the floor)
# No model file travels: the benches build synthetic-gemma-3-270m on the device (salon/engine/model/synthetic_gemma.py).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

# What the GPU image lacks, exact versions (scripts/gpu_wheels.sh downloads these; keep the two in step).
GPU_WHEELS=(
  safetensors==0.8.0
  grpcio==1.85.3
  httpx==0.29.0
  httpcore==1.0.9
  h11==0.16.0
  anyio==4.16.0
  certifi==2026.10.19.post1
  idna==3.21
  sniffio==1.3.1
  sentencepiece==0.2.3
  tokenizers==0.23.3
  gguf==0.19.0
  structlog==26.1.0
  jinja2==3.1.6
  markupsafe==3.0.4
  prometheus-client==0.26.0
  grpcio-health-checking==1.85.1
  grpcio-reflection==1.85.1
  protobuf==7.36.2
  googleapis-common-protos==1.76.0
  wrapt==2.5.2
  opentelemetry-api==1.45.2
  opentelemetry-sdk==1.45.2
  opentelemetry-proto==1.45.2
  opentelemetry-semantic-conventions==0.66b2
  opentelemetry-instrumentation==0.66b2
  opentelemetry-instrumentation-grpc==0.66b2
  opentelemetry-exporter-otlp-proto-common==1.45.2
  opentelemetry-exporter-otlp-proto-grpc==1.45.2
  opentelemetry-exporter-otlp-proto-http==1.45.2
  xgrammar==0.2.9
  apache-tvm-ffi==0.1.15.post2
)
[ "${1:-}" = --list-wheels ] && { printf '%s\n' "${GPU_WHEELS[@]}"; exit 0; }
REHEARSE=0
[ "${1:-}" = --rehearse ] && REHEARSE=1
OUT=${OUT:-$PWD/gpu-check-out}
PY=${PYTHON:-python3}
GPU_TESTS=${GPU_TESTS:-tests/kernels tests/engine tests/model}
mkdir -p "$OUT"
: > "$OUT/summary.txt"
: > "$OUT/results.txt"
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
if [ "$REHEARSE" = 1 ]; then
  export TRITON_INTERPRET=1
  # the same steps at tiny shapes: a test selection that runs no GPU test, the CPU checks of bench.kernels
  TEST_ARGS=(-m gpu --collect-only -q)
  KERNEL_ARGS=()
  GPU_ARGS=(--rehearse)
  LIMITS=(60 60 120 120 240)
else
  TEST_ARGS=(-m gpu -q -s)
  KERNEL_ARGS=(--quick)
  GPU_ARGS=(--quick)
  LIMITS=(30 30 120 90 210)  # wheels, imports, tests, kernels, gpu: 480 s together
fi

step() {  # step NAME SECONDS COMMAND...: run it under timeout, keep its log, collect its RESULT line
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name exit=$rc seconds=$((SECONDS - start)) limit=$limit" | tee -a "$OUT/summary.txt"
  grep '^RESULT ' "$OUT/$name.log" | sed "s/^/$name /" >> "$OUT/results.txt"
  return $rc
}

{ nvidia-smi || true; "$PY" -c "import torch, triton; print(torch.__version__, triton.__version__, \
torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA')"; } > "$OUT/device.txt" 2>&1

if [ "$REHEARSE" = 0 ]; then
  if ls .whl/*.whl > /dev/null 2>&1; then
    step wheels "${LIMITS[0]}" "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /tmp/site .whl/*.whl
    # PYTHONPATH precedes site-packages: the wheels above shadow the image only where it has the same package
    export PYTHONPATH=$PYTHONPATH:/tmp/site
  else
    echo "wheels exit=1 no .whl/ (run scripts/gpu_wheels.sh and carry .whl)" | tee -a "$OUT/summary.txt"
  fi
fi
IMPORTS="torch triton transformers numpy pytest safetensors sentencepiece tokenizers gguf structlog jinja2 \
prometheus_client httpx grpc grpc_health grpc_reflection opentelemetry.sdk salon.engine.model.loader \
salon.engine.worker.model_runner salon.kernels.backend bench.model bench.kernels bench.gpu"
# shellcheck disable=SC2086  # IMPORTS is a list of module names
step imports "${LIMITS[1]}" "$PY" -c "
import importlib, sys
missing = []
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as e:
        missing.append(f'{name}: {type(e).__name__}: {e}')
print('\n'.join(missing) or 'every import resolves')
print('RESULT {\"imports_missing\": %d}' % len(missing))
sys.exit(1 if missing else 0)" $IMPORTS
# shellcheck disable=SC2086  # GPU_TESTS is a list of folders
step tests "${LIMITS[2]}" "$PY" -m pytest "${TEST_ARGS[@]}" -p no:cacheprovider $GPU_TESTS
step kernels "${LIMITS[3]}" "$PY" -m bench.kernels "${KERNEL_ARGS[@]}"
step gpu "${LIMITS[4]}" "$PY" -m bench.gpu "${GPU_ARGS[@]}"
echo "total seconds=$SECONDS" | tee -a "$OUT/summary.txt"
cat "$OUT/results.txt"
