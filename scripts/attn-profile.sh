#!/usr/bin/env bash
# Decode attention and read order on the GPU machine, from the repo root: build nf4flash (no tests;
# SKIP_BUILD=1 reuses build-gpu), time kernel-bench --read-patterns (the same bytes read in the
# decode kernels' block orders) and --attn-decode (contexts 128..32768, cache read from HBM, per
# kernel and split order), then with NCU=1 ncu's detail sections and source page for single
# decode-attention launches (NCU_CTXS, default "512 32768"; NCU_VARIANTS, default "0 1" = simt and
# simt interleave in kernel-bench's order simt, simt interleave, mma, mma interleave). KB=0 skips the
# kernel-bench rows (ncu only).
# Writes to $OUT (default build-gpu/out): kb-attn.{txt,json}, ncu-attn-<ctx>-<variant>.txt,
# ...-sass.csv.gz, ...-summary.txt, packed into all.tgz after each step.
set -uo pipefail
out=${OUT:-build-gpu/out}
mkdir -p "$out"
pack() { (cd "$out" && tar czf all.tgz --exclude=all.tgz --exclude='*.ncu-rep' * 2>/dev/null); }
B=build-gpu/nf4flash
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  NF4FLASH_GPU_TESTS=0 NF4FLASH_GPU_BENCH=0 bash scripts/gpu-check.sh >"$out/build.txt" 2>&1 || { tail -20 "$out/build.txt"; exit 1; }
fi
if [ "${KB:-1}" = 1 ]; then  # KB=0: only the ncu launches
  timeout ${KB_ATTN_TIMEOUT:-240} $B kernel-bench --read-patterns --attn-decode --json "$out/kb-attn.json" >"$out/kb-attn.txt" 2>&1
  python3 scripts/kb-table.py "$out/kb-attn.json" 2>&1 | tee "$out/kb-attn-table.txt"
  pack
fi
[ "${NCU:-1}" = 1 ] || exit 0
source scripts/ncu-one.sh
names=(simt simt-interleave mma mma-interleave)
reps=4 trials=1  # launches of the decode kernel per variant row: reps x (1 + trials) (one cache layer:
                 # ncu flushes the caches before each launch it profiles, so K/V come from HBM anyway)
for ctx in ${NCU_CTXS:-512 32768}; do
  for v in ${NCU_VARIANTS:-0 1}; do
    rep="$out/ncu-attn-$ctx-${names[$v]}"
    NF4FLASH_KB_ATTN_CTXS=$ctx NF4FLASH_KB_ATTN_ROTATE=0 ncu_one "$rep" attn_decode $(( v * reps * (1 + trials) + 2 )) \
      $B kernel-bench --attn-decode --reps $reps --trials $trials || { echo "ncu attn $ctx ${names[$v]} failed"; continue; }
    python3 scripts/ncu-sass-summary.py "$rep-sass.csv.gz" >"$rep-summary.txt" 2>&1
    echo "attn $ctx ${names[$v]}: $(grep -E '^ +Duration' "$rep.txt" | head -1 | sed -E 's/ +/ /g') |" \
      "$(grep -E '^ +(DRAM Throughput|Memory Throughput)' "$rep.txt" | head -2 | sed -E 's/ +/ /g' | tr '\n' ' ')"
    head -2 "$rep-summary.txt"
    pack
  done
done
