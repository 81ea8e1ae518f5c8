#!/usr/bin/env bash
# ctest entry for the differential test: skips (exit 77) when node or the npm packages are absent.
# usage: run.sh NF4FLASH_BIN FIXTURES_DIR [extra differential.js args]
set -u
here="$(cd "$(dirname "$0")" && pwd)"
if ! command -v node >/dev/null 2>&1; then
  echo "SKIP: node is not installed (scripts/install-deps.sh installs it)"
  exit 77
fi
if [ ! -d "$here/node_modules/@anush008/tokenizers" ]; then
  echo "SKIP: $here/node_modules is missing (run: cd tests/differential && npm ci)"
  exit 77
fi
bin="$1"; fixtures="$2"; shift 2
exec node "$here/differential.js" --bin "$bin" --fixtures "$fixtures" "$@"
