#!/usr/bin/env bash
# ctest entry for the node.js tests: skips (exit 77) when node or the test's npm packages are absent
# (scripts/install-deps.sh installs both), else runs the script.
# usage: node_test.sh DIR PACKAGE SCRIPT [args...]   (DIR under tests/, PACKAGE the npm package it needs)
set -u
here="$(cd "$(dirname "$0")" && pwd)"
dir="$here/$1"; package="$2"; script="$3"
shift 3
if ! command -v node >/dev/null 2>&1; then
  echo "SKIP: node is not installed (scripts/install-deps.sh installs it)"
  exit 77
fi
if [ ! -d "$dir/node_modules/$package" ]; then
  echo "SKIP: $dir/node_modules is missing (run: cd tests/$1 && npm ci)"
  exit 77
fi
exec node "$dir/$script" "$@"
