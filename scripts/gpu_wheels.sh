#!/usr/bin/env bash
# Downloads into .whl/ the wheels scripts/gpu_check.sh installs on the GPU machine (its GPU_WHEELS list, exact
# versions, no dependencies: the GPU image has the rest) for its Python 3.12 on x86-64 Linux, and checks that
# they fit the 64 MiB that may travel with the repository. Run from anywhere, with network; then carry `.whl`.
set -euo pipefail
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python3}
mapfile -t WHEELS < <(bash scripts/gpu_check.sh --list-wheels)
rm -rf .whl
mkdir -p .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --platform any -d .whl "${WHEELS[@]}"
total=$(du -cb .whl/*.whl | tail -1 | cut -f1)
echo "${#WHEELS[@]} wheels, $total bytes in .whl/"
[ "$total" -le $((64 << 20)) ] || { echo "over 64 MiB: too large to travel" >&2; exit 1; }
