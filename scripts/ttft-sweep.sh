#!/usr/bin/env bash
# TTFT of the NF4-dq Llama-3-8B preset under the 4-bit prefill GEMM choices (run on the GPU
# machine after scripts/gpu-check.sh has built build-gpu): the default (auto: fused wgmma GEMM up to
# NF4FLASH_Q4GEMM_FUSED_MAX_ROWS rows, dequantize + cuBLAS above), dequantize + cuBLAS always, and
# the fused GEMM always (sm_90a builds on a compute capability 9.0 GPU; elsewhere that row is an
# error). JSON and text to $OUT (or build-gpu/out); a summary table last.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build-gpu/out}
mkdir -p "$out"
B=(./build-gpu/nf4flash bench --preset llama3-8b --device cuda --quant nf4 --double-quant --attn flash -n 16 --ctx 512 -r 3)
run() {  # name prompt-lengths env...
  local name=$1 p=$2
  shift 2
  env "$@" "${B[@]}" -p "$p" --json "$out/ttft-$name.json" >"$out/ttft-$name.txt" 2>&1 || echo "ttft $name failed"
}
run auto 512,1024,2048,4096
run dequant 512,1024,2048,4096 NF4FLASH_Q4_GEMM=dequant
run fused 1024,2048,4096 NF4FLASH_Q4_GEMM=fused
echo "== TTFT (ms, median of 3) =="
for n in auto dequant fused; do
  printf "%-16s %s\n" "$n" "$(grep -E "TTFT pp" "$out/ttft-$n.txt" | awk -F'|' '{gsub(/ /,"",$7); gsub(/ /,"",$8); printf "%s=%s  ", $7, $8}')"
done
