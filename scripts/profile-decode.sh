#!/usr/bin/env bash
# Profile one decode run of a preset (llama3-8b unless PROFILE_PRESET names another; NF4-dq, bf16,
# flash, graphs) with Nsight Compute on the GPU machine. Writes to $OUT (default build-gpu/out):
#   ncu-times.csv   gpu__time_duration of every kernel (prefill to ctx 512, then 3 decode tokens);
#                   scripts/ncu-step-table.py turns it into a per-step breakdown
#   ncu-<regex>.txt the detailed sections for the kernels matching each extra regex argument
#                   (SOL, warp states, occupancy, pipes, memory, instruction stats, stall sources)
# Usage: scripts/profile-decode.sh BIN [KERNEL_REGEX...]   e.g. build-gpu/nf4flash attn_decode
#   (kernel names: the first column of scripts/ncu-step-table.py's output)
#   PROFILE_TIMES=0 skips the timing run; PROFILE_SKIP / PROFILE_COUNT pick the detailed launches
#   (default: skip 8, profile 4 = one layer's four GEMVs when the regex matches them);
#   PROFILE_QUANT="none" profiles the bf16-weight model (default "nf4 --double-quant");
#   PROFILE_SOURCE=1 adds ncu-<regex>-sass.csv: per-SASS-instruction counts and stall samples
#   PROFILE_CMD="..." profiles that command instead of the decode run, e.g. the fused 4-bit GEMM at
#   32 rows: PROFILE_TIMES=0 PROFILE_SKIP=0 NF4FLASH_Q4_SKINNY_MAX_ROWS=0 \
#     PROFILE_CMD="build-gpu/bench/kernels/nf4flash-kernel-bench --gemv-only" scripts/profile-decode.sh - gemm_q4_ws
#   The detail sections include the memory tables (shared-memory bank conflicts per instruction kind).
set -uo pipefail
bin=${1:-build-gpu/nf4flash}
shift || true
out=${OUT:-build-gpu/out}
mkdir -p "$out"
read -ra quant <<<"${PROFILE_QUANT:-nf4 --double-quant}"
run=("$bin" bench --preset "${PROFILE_PRESET:-llama3-8b}" --device cuda --quant "${quant[@]}" --attn flash -p 16 -n 3
     --ctx 512 -r 1 --warmup 0 -q)
# nf4flash bench starts the profiler's collection after the load (gpu_profiler_start): the load's
# kernels (a preset's 4-bit repacks: tens of thousands for qwen3-30b-a3b) stay out
from=(--profile-from-start off)
[ -n "${PROFILE_CMD:-}" ] && { read -ra run <<<"$PROFILE_CMD"; from=(); }
if [ "${PROFILE_TIMES:-1}" = 1 ]; then
  timeout 300 ncu --clock-control none "${from[@]}" --metrics gpu__time_duration.sum --csv "${run[@]}" \
    >"$out/ncu-times.csv" 2>"$out/ncu-times.err" || echo "ncu timing run failed (see ncu-times.err)"
fi
for rx in "$@"; do
  name=$(echo "$rx" | tr -c 'A-Za-z0-9_\n' '_')
  timeout 300 ncu --clock-control none "${from[@]}" -k "regex:$rx" --launch-skip "${PROFILE_SKIP:-8}" -c "${PROFILE_COUNT:-4}" --print-details all \
    --section SpeedOfLight --section WarpStateStats --section Occupancy --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section InstructionStats --section SchedulerStats \
    --section LaunchStats --section SourceCounters "${run[@]}" >"$out/ncu-$name.txt" 2>&1 \
    || echo "ncu detail run for $rx failed (see ncu-$name.txt)"
  if [ "${PROFILE_SOURCE:-0}" = 1 ]; then
    timeout 300 ncu --clock-control none "${from[@]}" -k "regex:$rx" --launch-skip "${PROFILE_SKIP:-8}" -c 1 \
      --section SourceCounters --section WarpStateStats --page source --print-source sass --csv "${run[@]}" \
      >"$out/ncu-$name-sass.csv" 2>&1 || echo "ncu source run for $rx failed (see ncu-$name-sass.csv)"
  fi
done
