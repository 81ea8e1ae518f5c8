#!/usr/bin/env bash
# GPU check of the mixture-of-experts decode path, from the repo root on the GPU machine:
#   1. builds this tree into build-gpu (nf4flash, the kernel benchmark, the gpu tests) and, with
#      BASE=DIR, another source tree into build-base (nf4flash and the kernel benchmark), and with
#      MID=DIR a third into build-mid, all at once (the trees run in the order base, mid, gpu)
#   2. the MoE gpu tests (MoeGpu*; GTEST_FILTER overrides)
#   3. the MoE layer of the kernel benchmark (--moe-only: qwen3-30b-a3b's layer at T = 1, 4, 16),
#      per tree, ROUNDS times alternated (base first)
#   4. with NCU=1 (and ncu on PATH): the layer's kernels at T = 1 under ncu, time and warp
#      instructions each, per tree; STALLS=1 adds issue-slot use and the stall reasons above 0.2
#      cycles an issued instruction
#   5. bench --preset qwen3-30b-a3b --quant nf4 --double-quant -p 512 -n 128 -r 3 per tree, ROUNDS
#      times alternated: decode tok/s, and its share of FLOOR (default 1450 tok/s, the H100's)
# Logs and JSON go to $OUT (default build-gpu/out); one summary line per measurement on stdout.
source "$(dirname "$0")/gpu-common.sh"
deps=(-DCMAKE_PREFIX_PATH="$root/.device-deps/usr" -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release -DNF4FLASH_SERVE=OFF)
rounds=${ROUNDS:-2}
trees=""
[ -n "${BASE:-}" ] && trees="base"
[ -n "${MID:-}" ] && trees="$trees mid"
trees="$trees gpu"

cmake -S . -B build-gpu -G Ninja "${deps[@]}" >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
pids=()
for t in base mid; do  # the other trees beside this one's build
  src=${BASE:-}
  [ "$t" = mid ] && src=${MID:-}
  [ -n "$src" ] || continue
  cmake -S "$src" -B build-$t -G Ninja "${deps[@]}" -DNF4FLASH_TESTS=OFF >"$out/configure-$t.log" 2>&1 ||
    { tail -20 "$out/configure-$t.log"; exit 1; }
  ninja -C build-$t -j6 nf4flash nf4flash-kernel-bench >"$out/build-$t.log" 2>&1 &
  pids+=($!)
done
ninja -C build-gpu -j"${JOBS:-10}" nf4flash nf4flash-kernel-bench nf4flash_gpu_tests >"$out/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$out/build.log" | head -30; exit 1; }
for p in "${pids[@]}"; do wait "$p" || { grep -hE "error|FAILED" "$out"/build-base.log "$out"/build-mid.log 2>/dev/null | head -20; exit 1; }; done
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
  metrics=gpu__time_duration.sum,smsp__inst_executed.sum
  [ "${STALLS:-0}" = 1 ] &&
    metrics="$metrics,smsp__issue_active.avg.pct_of_peak_sustained_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
  for t in $trees; do
    ncu --clock-control none --metrics "$metrics" -k regex:moe -c 4 \
      ./build-$t/bench/kernels/nf4flash-kernel-bench --moe-only --reps 1 --trials 1 >"$out/moe-ncu-$t.txt" 2>&1
    # one line a kernel launch: time and instructions, then (STALLS) issue-slot use and stalls
    awk -v t="$t" 'function flush() { if (k != "") printf "%s ncu: %-60s %8s us %12s warp instructions%s\n", t, k, us, ins, ex; ex = "" }
      /moe_[a-z_]*kernel/ { flush(); k = $0; sub(/^ +/, "", k); sub(/\(Moe.*/, "", k) }
      /gpu__time_duration.sum/ { us = $NF } /smsp__inst_executed.sum/ { ins = $NF }
      /smsp__issue_active/ { ex = ex sprintf(" | issue %s%%", $NF) }
      /issue_stalled/ && $NF + 0 > 0.2 { m = $1; sub(/smsp__average_warps_issue_stalled_/, "", m); sub(/_per_issue_active.ratio/, "", m); ex = ex " | " m " " $NF }
      END { flush() }' "$out/moe-ncu-$t.txt"
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
