#!/usr/bin/env bash
# ctest entry for serve_openai.mjs: skips (exit 77) when node or the openai npm package is absent.
# usage: run.sh NF4FLASH_BIN MODEL_DIR
set -u
here="$(cd "$(dirname "$0")" && pwd)"
if ! command -v node >/dev/null 2>&1; then
  echo "SKIP: node is not installed (scripts/install-deps.sh installs it)"
  exit 77
fi
if [ ! -d "$here/node_modules/openai" ]; then
  echo "SKIP: $here/node_modules is missing (run: cd tests/serve && npm ci)"
  exit 77
fi
exec node "$here/serve_openai.mjs" "$1" "$2"
