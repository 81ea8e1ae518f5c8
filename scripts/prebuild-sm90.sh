#!/usr/bin/env bash
# Builds the GPU scripts' binaries for compute capability 9.0 on a machine without a GPU (nvcc and
# the packages of scripts/install-deps.sh present) and packs them into .prebuilt/bin.tar.xz, so
# that the GPU machine runs them without building (PREBUILT=1 in scripts/gpu-common.sh):
#   this tree   -> build-gpu/: nf4flash, nf4flash-kernel-bench and, with TESTS=1, nf4flash_gpu_tests
#   BASE=DIR    -> build-NAME/ (NAME: BASE_NAME, default base): nf4flash and nf4flash-kernel-bench of
#                  another source tree (e.g. `git archive REV | tar -x -C DIR`)
# The code is portable x86-64 (NF4FLASH_NATIVE=OFF) and stripped; the CLI is built without the
# HTTP server. The builds live in $PREBUILD_DIR (default /tmp/nf4flash-prebuild): the gpu tests
# read their fixtures from $PREBUILD_DIR/build-gpu/fixtures, which the unpacking recreates there
# from tests/fixtures.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dir=${PREBUILD_DIR:-/tmp/nf4flash-prebuild}
bn=${BASE_NAME:-base}
opts=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DNF4FLASH_NATIVE=OFF -DNF4FLASH_SERVE=OFF)
command -v nvcc >/dev/null || { echo "prebuild-sm90: nvcc is not on PATH" >&2; exit 1; }
if [ -n "${BASE:-}" ] && [ ! -f "$BASE/CMakeLists.txt" ]; then
  echo "prebuild-sm90: BASE=$BASE holds no CMakeLists.txt" >&2
  exit 1
fi
mkdir -p "$dir"
build() {  # source dir, build name, tests ON/OFF, targets...
  local src=$1 name=$2 tests=$3
  shift 3
  echo "prebuild-sm90: $src -> $name ($*)"
  cmake -S "$src" -B "$dir/$name" "${opts[@]}" -DNF4FLASH_TESTS="$tests" >"$dir/$name.configure.log" 2>&1 ||
    { tail -20 "$dir/$name.configure.log"; exit 1; }
  ninja -C "$dir/$name" -j"${JOBS:-$(nproc)}" "$@" >"$dir/$name.build.log" 2>&1 ||
    { grep -E "error|FAILED" "$dir/$name.build.log" | head -30; exit 1; }
}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
pack() {  # build name, binaries (paths in the build)...: stripped copies under the same name
  local name=$1 b
  shift
  for b in "$@"; do
    mkdir -p "$stage/$name/$(dirname "$b")"
    cp "$dir/$name/$b" "$stage/$name/$b"
    strip "$stage/$name/$b"
  done
}
bins=(nf4flash bench/kernels/nf4flash-kernel-bench)
if [ "${TESTS:-0}" = 1 ]; then
  build "$root" build-gpu ON nf4flash nf4flash-kernel-bench nf4flash_gpu_tests
  pack build-gpu "${bins[@]}" tests/nf4flash_gpu_tests
  echo "$dir/build-gpu/fixtures" >"$stage/build-gpu/FIXTURES_DIR"
else
  build "$root" build-gpu OFF nf4flash nf4flash-kernel-bench
  pack build-gpu "${bins[@]}"
fi
if [ -n "${BASE:-}" ]; then
  build "$BASE" "build-$bn" OFF nf4flash nf4flash-kernel-bench
  pack "build-$bn" "${bins[@]}"
fi
mkdir -p .prebuilt
tar -cJf .prebuilt/bin.tar.xz -C "$stage" .
echo "prebuild-sm90: .prebuilt/bin.tar.xz ($(du -h .prebuilt/bin.tar.xz | cut -f1)): $(cd "$stage" && find . -type f | sort | tr '\n' ' ')"
