#!/usr/bin/env bash
# Quickstart command 1: set up (if needed) and run the local stack with the default model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/salon up "$@"
