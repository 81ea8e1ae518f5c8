#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages nf4flash builds with (run as root, or with sudo available).
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
pkgs=(build-essential cmake ninja-build pkg-config xz-utils python3
      nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev libcpp-httplib-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# ---- node packages: tokenizer differential test and benchmark, serve client test ----------------
# Node.js and the Hugging Face tokenizers binding (@anush008/tokenizers, pinned in
# tests/differential/package-lock.json) for tests/differential and scripts/bench-tokenizer.sh.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm
fi
_diff_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/differential"
if [ ! -d "$_diff_dir/node_modules/@anush008/tokenizers" ]; then
  (cd "$_diff_dir" && { npm ci --no-audit --no-fund --loglevel=error || npm install --no-audit --no-fund --loglevel=error; }) ||
    echo "install-deps: npm install in tests/differential failed; the differential test will skip" >&2
fi
# The official openai npm client for the serve test (tests/serve, pinned in its package-lock.json).
_serve_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/serve"
if [ ! -d "$_serve_dir/node_modules/openai" ]; then
  (cd "$_serve_dir" && { npm ci --no-audit --no-fund --loglevel=error || npm install --no-audit --no-fund --loglevel=error; }) ||
    echo "install-deps: npm install in tests/serve failed; the serve client test will skip" >&2
fi
# ---- end tokenizer section ------------------------------------------------------------------------
