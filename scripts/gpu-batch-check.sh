#!/usr/bin/env bash
# GPU check of the batched engine, from the repo root on the GPU machine. Stages (STAGES, default
# "build test bench"):
#   build  this tree into build-gpu (nf4flash + gpu tests) and, with BASE=DIR, another source tree
#          into build-NAME (nf4flash only; NAME: BASE_NAME, default base), both at once
#   test   the gpu tests of the batched engine (*GpuBatch*: the parametrized suite Models/GpuBatch;
#          GTEST_FILTER overrides)
#   bench  bench --batch 1,8,32,64 on the reference preset (llama3-8b, NF4 double quant, -p 512 -n 128)
#          once per NF4FLASH_GEMV_MAX_ROWS value in GEMV_ROWS (default: "" = the built-in default)
#          and per --graphs value in GRAPHS (default "auto"; "off auto off auto" alternates the
#          uncaptured and the graphed decode steps) and per NF4FLASH_Q4_SKINNY_KERNEL value in SKINNY
#          (default: "" = the built-in default; "mma wgmma" times both forms of the skinny GEMM, alternated
#          inside each --graphs round) and per NF4FLASH_Q4_SKINNY_MAX_ROWS value in SKINNY_ROWS
#          (default: "" = the built-in default); with BASE, each of them for the base tree (files
#          and lines labelled NAME), then
#          this one (the A/B of two trees in one call: GRAPHS="auto auto" for two rounds);
#          with BASE, also the single-sequence NF4 benchmark (-p 512 -n 128 -r 5) of both trees,
#          alternated ROUNDS times (batch 1 must not get slower)
# Logs, JSON and Markdown go to $OUT (default build-gpu/out), named after the GPU.
source "$(dirname "$0")/gpu-common.sh"
deps=(-DCMAKE_PREFIX_PATH="$root/.device-deps/usr" -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release -DNF4FLASH_SERVE=${SERVE:-OFF})
use_prebuilt
stages=${STAGES:-build test bench}
bn=${BASE_NAME:-base}  # the base tree's build directory is build-$bn

if [[ " $stages " == *" build "* ]] && [ "$prebuilt" = 0 ]; then  # PREBUILT=1: the unpacked binaries
  cmake -S . -B build-gpu -G Ninja "${deps[@]}" >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
  pb=
  if [ -n "${BASE:-}" ]; then
    cmake -S "$BASE" -B "build-$bn" -G Ninja "${deps[@]}" -DNF4FLASH_TESTS=OFF >"$out/configure-$bn.log" 2>&1 ||
      { tail -20 "$out/configure-$bn.log"; exit 1; }
    ninja -C "build-$bn" -j8 nf4flash >"$out/build-$bn.log" 2>&1 &
    pb=$!
  fi
  ninja -C build-gpu -j"${JOBS:-12}" nf4flash nf4flash_gpu_tests >"$out/build.log" 2>&1 ||
    { grep -E "error|FAILED" "$out/build.log" | head -30; exit 1; }
  if [ -n "$pb" ]; then wait "$pb" || { grep -E "error|FAILED" "$out/build-$bn.log" | head -20; exit 1; }; fi
  stamp "built"
fi

if [[ " $stages " == *" test "* ]]; then
  ./build-gpu/tests/nf4flash_gpu_tests --gtest_filter="${GTEST_FILTER:-*GpuBatch*}" >"$out/batch-tests.log" 2>&1
  stamp "tests rc=$?"
  grep -E "FAILED|Failure|Expected|Which is|rel_l2|request [0-9]|PASSED" "$out/batch-tests.log" | head -60
fi

if [[ " $stages " == *" bench "* ]]; then
  trees="gpu"
  [ -n "${BASE:-}" ] && trees="$bn gpu"
  for rows in ${GEMV_ROWS:-default}; do
    if [ "$rows" = default ]; then env_set=(); else env_set=(NF4FLASH_GEMV_MAX_ROWS=$rows); fi
    k=0
    for graphs in ${GRAPHS:-auto}; do
      k=$((k + 1))
      for skr in ${SKINNY_ROWS:-default}; do
        for sk in ${SKINNY:-default}; do
          sk_set=()
          [ "$sk" != default ] && sk_set=(NF4FLASH_Q4_SKINNY_KERNEL=$sk)
          [ "$skr" != default ] && sk_set+=(NF4FLASH_Q4_SKINNY_MAX_ROWS=$skr)
          for t in $trees; do
            tag=$gpu-batch-$t-gemv$rows-skinny$sk-rows$skr-graphs$graphs-$k
            env "${env_set[@]}" "${sk_set[@]}" ./build-$t/nf4flash bench --preset llama3-8b --device cuda --quant nf4 \
              --double-quant --batch ${BATCHES:-1,8,32,64} -p 512 -n 128 --graphs "$graphs" --json "$out/$tag.json" \
              --markdown "$out/$tag.md" >/dev/null 2>"$out/$tag.err" ||
              { echo "bench --batch ($t, $rows, skinny $sk, skinny rows $skr, graphs $graphs) failed"; tail -3 "$out/$tag.err"; }
            stamp "bench --batch, tree $t, GEMV rows $rows, skinny $sk, skinny rows $skr, graphs $graphs"
            cat "$out/$tag.md" 2>/dev/null | sed -n '3,8p'
          done
        done
      done
    done
  done
  if [ -n "${BASE:-}" ]; then
    for r in $(seq 1 "${ROUNDS:-2}"); do
      for t in gpu "$bn"; do
        ./build-$t/nf4flash bench --preset llama3-8b --device cuda --quant nf4 --double-quant -p 512 -n 128 -r 5 \
          --json "$out/$gpu-single-$t-$r.json" >/dev/null 2>&1 || echo "single bench $t failed"
        bench_summary "$out/$gpu-single-$t-$r.json" "$t"
      done
    done
    stamp "single-sequence benches"
  fi
fi
