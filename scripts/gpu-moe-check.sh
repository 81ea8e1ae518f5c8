#!/usr/bin/env bash
# GPU check of the mixture-of-experts decode path, from the repo root on the GPU machine:
#   1. builds this tree into build-gpu (nf4flash, the kernel benchmark, the gpu tests) and, with
#      BASE=DIR, another source tree into build-base (nf4flash and the kernel benchmark), both at once
#   2. the MoE gpu tests (MoeGpu*; GTEST_FILTER overrides)
#   3. the MoE layer of the kernel benchmark (--moe-only: qwen3-30b-a3b's layer at T = 1, 4, 16),
#      per tree, ROUNDS times alternated (base first)
#   4. with NCU=1 (and ncu on PATH): the layer's kernels at T = 1 under ncu, time and warp
#      instructions each, per tree
#   5. bench --preset qwen3-30b-a3b --quant nf4 --double-quant -p 512 -n 128 -r 3 per tree, ROUNDS
#      times alternated: decode tok/s, and its share of FLOOR (default 1450 tok/s, the H100's)
# Logs and JSON go to $OUT (default build-gpu/out); one summary line per measurement on stdout.
source "$(dirname "$0")/gpu-common.sh"
deps=(-DCMAKE_PREFIX_PATH="$root/.device-deps/usr" -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release -DNF4FLASH_SERVE=OFF)
rounds=${ROUNDS:-2}
trees="gpu"
[ -n "${BASE:-}" ] && trees="base gpu"

cmake -S . -B build-gpu -G Ninja "${deps[@]}" >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
pb=
if [ -n "${BASE:-}" ]; then
  cmake -S "$BASE" -B build-base -G Ninja "${deps[@]}" -DNF4FLASH_TESTS=OFF >"$out/configure-base.log" 2>&1 ||
    { tail -20 "$out/configure-base.log"; exit 1; }
  ninja -C build-base -j6 nf4flash nf4flash-kernel-bench >"$out/build-base.log" 2>&1 &
  pb=$!
fi
ninja -C build-gpu -j"${JOBS:-10}" nf4flash nf4flash-kernel-bench nf4flash_gpu_tests >"$out/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$out/build.log" | head -30; exit 1; }
if [ -n "$pb" ]; then wait "$pb" || { grep -E "error|FAILED" "$out/build-base.log" | head -20; exit 1; }; fi
stamp "built"

./build-gpu/tests/nf4flash_gpu_tests --gtest_filter="${GTEST_FILTER:-MoeGpu*}" >"$out/moe-tests.log" 2>&1
stamp "tests rc=$?: $(grep -E '^\[  (PASSED|FAILED)  \]' "$out/moe-tests.log" | tr '\n' ' ')"
grep -E "Failure|Expected|Which is|rel_err" "$out/moe-tests.log" | head -20

for r in $(seq 1 "$rounds"); do
  for t in $trees; do
    ./build-$t/bench/kernels/nf4flash-kernel-bench --moe-only --json "$out/$gpu-moe-kernel-$t-$r.json" \
      >"$out/moe-kernel-$t-$r.txt" 2>&1 || echo "kernel bench ($t) failed"
    grep -E "^moe " "$out/moe-kernel-$t-$r.txt" | sed "s/^/$t round $r: /"
  done
done

if [ "${NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
  for t in $trees; do
    ncu --clock-control none --metrics gpu__time_duration.sum,smsp__inst_executed.sum -k regex:moe -c 4 \
      ./build-$t/bench/kernels/nf4flash-kernel-bench --moe-only --reps 1 --trials 1 >"$out/moe-ncu-$t.txt" 2>&1
    awk -v t="$t" '/moe_[a-z_]*kernel/ { k = $0; sub(/^ +/, "", k); sub(/\(Moe.*/, "", k) }
      /gpu__time_duration.sum/ { us = $NF } /smsp__inst_executed.sum/ { printf "%s ncu: %-60s %8s us %12s warp instructions\n", t, k, us, $NF }' \
      "$out/moe-ncu-$t.txt"
  done
fi

for r in $(seq 1 "$rounds"); do
  for t in $trees; do
    ./build-$t/nf4flash bench --preset qwen3-30b-a3b --device cuda --quant nf4 --double-quant -p 512 -n 128 -r 3 \
      --json "$out/$gpu-qwen3-30b-a3b-$t-$r.json" >"$out/qwen3-$t-$r.txt" 2>&1 || { echo "bench ($t) failed"; continue; }
    bench_summary "$out/$gpu-qwen3-30b-a3b-$t-$r.json" "qwen3-30b-a3b, $t round $r" "${FLOOR:-1450}"
  done
done
stamp "done"
