#!/usr/bin/env bash
# Profile the 4-bit decode GEMV alone, on the GPU machine from the repo root: build nf4flash (no
# tests), time kernel-bench's focused rows (--gemv-shape, T=1, nf4-dq and nf4), dump the lean
# kernel's SASS, and with NCU=1 take per shape ncu's detail sections and its per-SASS-instruction
# source page for the first variant's nf4-dq and nf4 launches, summarized by
# scripts/ncu-sass-summary.py. Writes to $OUT (default build-gpu/out): kb-focus.{txt,json},
# lean-sass.txt.gz, ncu-<shape>-<dq|nf4>.txt, ...-sass.csv.gz, ...-summary.txt, and all of it
# packed into all.tgz after each step (the device tool brings back only 8 files one by one).
#   GEMV_SHAPES="4096x14336 14336x4096"  GEMV_VARIANTS="seq seq-p8u4d3 grouped ablate"  NCU=1
# (ablate: the default kernel's speed-of-light ablations, nf4-dq rows only; never first, as ncu
# profiles the first variant)
set -uo pipefail
out=${OUT:-build-gpu/out}
mkdir -p "$out"
pack() { (cd "$out" && tar czf all.tgz --exclude=all.tgz --exclude='*.ncu-rep' * 2>/dev/null); }
B=build-gpu/nf4flash
NF4FLASH_GPU_TESTS=0 NF4FLASH_GPU_BENCH=0 bash scripts/gpu-check.sh >"$out/build.txt" 2>&1 || { tail -20 "$out/build.txt"; exit 1; }
read -ra shapes <<<"${GEMV_SHAPES:-4096x14336 14336x4096}"
read -ra variants <<<"${GEMV_VARIANTS:-seq}"
args=()
for s in "${shapes[@]}"; do args+=(--gemv-shape "$s"); done
for v in "${variants[@]}"; do args+=(--gemv-variant "$v"); done
$B kernel-bench "${args[@]}" --json "$out/kb-focus.json" >"$out/kb-focus.txt" 2>&1
grep -E "gemv|copy" "$out/kb-focus.txt"
o=$(find build-gpu -name 'ops_gemv_lean.cu.o' | head -1)
[ -n "$o" ] && cuobjdump -sass "$o" 2>/dev/null | gzip >"$out/lean-sass.txt.gz"
pack
[ "${NCU:-1}" = 1 ] || exit 0
source scripts/ncu-one.sh
# launches per row: reps x (1 + trials) = 8 x 3; ncu runs the first variant alone, so its nf4
# row follows its one nf4-dq row (the other variants are only in the timed rows above)
for s in "${shapes[@]}"; do
  for kind in dq nf4; do
    skip=10
    [ $kind = nf4 ] && skip=$(( 24 + 10 ))
    rep="$out/ncu-$s-$kind"
    ncu_one "$rep" "gemv_q4_lean|gemv_q4_seq" $skip $B kernel-bench --gemv-shape "$s" --gemv-variant "${variants[0]}" \
      --reps 8 --trials 2 || { echo "ncu $s $kind failed"; continue; }
    r=${s%x*} k=${s#*x}
    python3 scripts/ncu-sass-summary.py "$rep-sass.csv.gz" --tiles $(( (r + 15) / 16 * (k / 64) )) >"$rep-summary.txt" 2>&1
    echo "$s $kind: $(grep -E '^ +Duration' "$rep.txt" | head -1 | sed -E 's/ +/ /g')"; head -2 "$rep-summary.txt"
    pack
  done
done
