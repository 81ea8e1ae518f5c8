#!/usr/bin/env bash
# Run on the GPU machine from the repo root: configure + build (build-gpu), run the `gpu` tests,
# then the CUDA kernel microbenchmark, torch SDPA (where torch is installed), the reference model
# benchmark and two peak-VRAM runs; print a short table last. Logs and JSON go to $OUT when set,
# else build-gpu/out; result files are named after the GPU (nvidia-smi's name, spaces as dashes).
#   NF4FLASH_GPU_TESTS=0  skip the tests;  NF4FLASH_GPU_BENCH=0  skip the benchmarks
#   NF4FLASH_GTEST_FILTER=...  pass a gtest filter to the gpu tests
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${OUT:-$root/build-gpu/out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used,memory.total --format=csv \
  >"$out/gpu.txt" 2>&1 || true
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr ' ' '-')
gpu=${gpu:-gpu}
start=$(date +%s)
commit_flag=()
[ -n "${NF4FLASH_COMMIT:-}" ] && commit_flag=(-DCMAKE_CXX_FLAGS="-DNF4FLASH_GIT_COMMIT=\\\"$NF4FLASH_COMMIT\\\"")
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$root/.device-deps/usr" "${commit_flag[@]}" \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DNF4FLASH_NATIVE=ON >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
targets=(nf4flash nf4flash-kernel-bench)
[ "${NF4FLASH_GPU_TESTS:-1}" = 1 ] && targets+=(nf4flash_gpu_tests)
ninja -C build-gpu -j16 "${targets[@]}" >"$out/build.log" 2>&1 || { grep -E "error|FAILED" "$out/build.log" | head -40; exit 1; }
build_s=$(( $(date +%s) - start ))

test_status="skipped"
if [ "${NF4FLASH_GPU_TESTS:-1}" = 1 ]; then
  if [ -n "${NF4FLASH_GTEST_FILTER:-}" ]; then
    ./build-gpu/tests/nf4flash_gpu_tests --gtest_filter="$NF4FLASH_GTEST_FILTER" >"$out/gpu-tests.log" 2>&1
  else
    (cd build-gpu && ctest -L gpu --output-on-failure --timeout 900) >"$out/gpu-tests.log" 2>&1
  fi
  rc=$?
  test_status=$([ $rc = 0 ] && echo "pass" || echo "FAIL (rc $rc)")
  grep -E "Failure|FAILED|Expected|Which is|rel|error" "$out/gpu-tests.log" | head -40
fi

bench_status="skipped"
if [ "${NF4FLASH_GPU_BENCH:-1}" = 1 ]; then
  ./build-gpu/bench/kernels/nf4flash-kernel-bench --json "$out/$gpu-kernel-bench.json" >"$out/kernel-bench.txt" 2>&1
  bench_status=$([ $? = 0 ] && echo "ok" || echo "FAIL")
  # yardstick for the kernel benchmark's prefill attention rows: torch SDPA, where torch is installed
  if python3 -c "import torch" 2>/dev/null; then
    python3 scripts/sdpa_bench.py --json "$out/$gpu-torch-sdpa.json" >"$out/torch-sdpa.txt" 2>&1 || echo "sdpa_bench failed"
  fi
  # the reference model benchmark (docs/performance.md), then peak VRAM for NF4 at ctx 8192
  ./build-gpu/nf4flash bench --preset llama3-8b --device cuda --quant none,nf4 --double-quant \
    --attn flash,sdpa,eager -p 512,4096 -n 128 --ctx 512,32768 --no-cache -r 3 \
    --json "$out/$gpu-llama3-8b.json" --svg "$out/$gpu-llama3-8b.svg" --markdown "$out/$gpu-llama3-8b.md" \
    >"$out/bench.txt" 2>"$out/bench.err" || echo "model bench failed (see bench.err)"
  ./build-gpu/nf4flash bench --preset llama3-8b --device cuda --quant nf4 --double-quant --ctx-size 8192 \
    -p 512 --ctx 8000 -n 32 -r 1 --json "$out/$gpu-llama3-8b-vram-ctx8192.json" \
    >"$out/bench-vram.txt" 2>&1 || echo "vram bench failed"
  # the same with 512-row prefill chunks (the activation buffers are sized by --ubatch)
  ./build-gpu/nf4flash bench --preset llama3-8b --device cuda --quant nf4 --double-quant --ctx-size 8192 --ubatch 512 \
    -p 512 --ctx 8000 -n 32 -r 1 --json "$out/$gpu-llama3-8b-vram-ctx8192-ubatch512.json" \
    >"$out/bench-vram-ub512.txt" 2>&1 || echo "vram bench (ubatch 512) failed"
fi

echo
echo "== gpu-check summary ($(head -2 "$out/gpu.txt" | tail -1)) =="
printf "%-12s %s\n" build "${build_s}s" tests "$test_status" kernel-bench "$bench_status"
[ -f "$out/gpu-tests.log" ] && grep -E "tests passed|tests failed|PASSED|FAILED  " "$out/gpu-tests.log" | tail -3
[ -f "$out/kernel-bench.txt" ] && cat "$out/kernel-bench.txt"
[ -f "$out/torch-sdpa.txt" ] && grep -vE "Warning|warn|return F" "$out/torch-sdpa.txt"
[ -f "$out/bench.txt" ] && cat "$out/bench.txt"
[ -f "$out/bench-vram.txt" ] && echo "ctx 8192, default ubatch: $(grep -E "peak VRAM" "$out/bench-vram.txt" | tail -1)"
[ -f "$out/bench-vram-ub512.txt" ] && echo "ctx 8192, --ubatch 512: $(grep -E "peak VRAM" "$out/bench-vram-ub512.txt" | tail -1)"
[ "$test_status" = pass ] || [ "$test_status" = skipped ]
