#!/usr/bin/env bash
# Set up what the tests need besides serving (scripts/setup.sh, which runs first): the package's test
# extras; from Debian, redis-server (session-table tests), shellcheck (the scripts' check), promtool, protoc with the
# Go and Java gRPC plugins and the Go and Java runtimes the stub commands build against; from npm, pinned by
# each package-lock.json, buf (lint, breaking, generate) and @grpc/proto-loader in tools/, and ts-proto, tsc,
# @grpc/grpc-js and openai in clients/node/. One line per step (output in .venv/setup.log); --dry-run prints
# the steps instead. Safe to run again: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

SETUP_ARGS=(--redis)
for arg in "$@"; do
  case $arg in
    --dry-run) export DRY_RUN=1 && SETUP_ARGS+=(--dry-run) ;;
    *) echo "setup_dev.sh: unknown argument $arg (--dry-run)" >&2 && exit 2 ;;
  esac
done
bash scripts/setup.sh "${SETUP_ARGS[@]}"
# shellcheck source=scripts/setup_steps.sh
source scripts/setup_steps.sh

step "installing salon's test extras" .venv/bin/python -m pip install -c constraints.txt -e '.[dev]'

# Debian packages, each with a command or file that shows it is installed: shellcheck, protoc with the Go and
# Java gRPC plugins, the Go and Java runtimes of protobuf and gRPC the README's stub commands build against, and
# promtool (from Prometheus's package: the metrics test lints every scrape with it).
debian_step "installing the test tools from Debian" \
  shellcheck:shellcheck \
  promtool:prometheus \
  protoc:protobuf-compiler \
  protoc-gen-go:protoc-gen-go \
  protoc-gen-go-grpc:protoc-gen-go-grpc \
  grpc_java_plugin:protobuf-compiler-grpc-java-plugin \
  go:golang-go \
  /usr/share/gocode/src/google.golang.org/protobuf:golang-google-protobuf-dev \
  /usr/share/gocode/src/google.golang.org/grpc:golang-google-grpc-dev \
  javac:default-jdk-headless \
  /usr/share/java/protobuf.jar:libprotobuf-java \
  /usr/share/java/grpc-stub.jar:libgrpc-java

# npm packages exactly as each package-lock.json pins them (npm ci); skipped while node_modules holds
# the install of the same lock file.
npm_ci_in() {
  (cd "$1" && npm ci --no-audit --no-fund)
}
npm_ci() {
  local dir=$1 stamp="$1/node_modules/.salon-package-lock.sha256" want
  want=$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || [ "$DRY_RUN" = 1 ]; then
    step "installing the npm packages of $dir" npm_ci_in "$dir"
    [ "$DRY_RUN" = 1 ] || echo "$want" >"$stamp"
  fi
}
if command -v npm >/dev/null 2>&1 || [ "$DRY_RUN" = 1 ]; then
  npm_ci tools
  npm_ci clients/node
else
  echo "setup: npm is missing; buf, the TypeScript stubs and the Node.js client tests need Node.js + npm" >&2
fi
