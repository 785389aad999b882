#!/usr/bin/env bash
# Quickstart command 2: set up (if needed) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_dev.sh
# Convert the default model once (a no-op when cached) before tests start engines in parallel.
.venv/bin/salon convert
exec .venv/bin/python -m pytest -q "$@"
