#!/usr/bin/env bash
# Same-speed check of this tree against another source tree on one GPU, in one run of the
# benchmark: builds both (build-gpu here, build-base for the other; Hopper, -DCMAKE_CUDA_ARCHITECTURES=90),
# then runs the reference benchmark (bench --preset llama3-8b: bf16 and NF4 double quant, flash,
# TTFT at prompts 512 / 4096, decode at contexts 512 / 32768) ROUNDS times per tree, alternating
# the trees, and prints the median of each metric per tree and their ratio. JSON per run to $OUT
# (default build-gpu/out). The other tree: e.g. `git archive <commit> | tar -x -C .base-tree`.
#   scripts/compare-trees.sh BASE_DIR [ROUNDS]
#   BUILD_ONLY=1: build both trees and stop;  BENCH_ONLY=1: use the existing builds
set -uo pipefail
base=${1:?usage: compare-trees.sh BASE_DIR [ROUNDS]}
rounds=${2:-2}
root=$(cd "$(dirname "$0")/.." && pwd)
base=$(cd "$base" && pwd)
out=${OUT:-$root/build-gpu/out}
mkdir -p "$out"
deps=(-DCMAKE_PREFIX_PATH="$root/.device-deps/usr")
if [ "${BENCH_ONLY:-0}" != 1 ]; then
  cmake -S "$base" -B "$root/build-base" -G Ninja -DCMAKE_BUILD_TYPE=Release "${deps[@]}" -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DNF4FLASH_TESTS=OFF >"$out/configure-base.log" 2>&1 || { tail -20 "$out/configure-base.log"; exit 1; }
  cmake -S "$root" -B "$root/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release "${deps[@]}" -DCMAKE_CUDA_ARCHITECTURES=90 \
    >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
  # both at once: each build's longest translation units overlap the other's
  ninja -C "$root/build-base" -j8 nf4flash >"$out/build-base.log" 2>&1 &
  pb=$!
  ninja -C "$root/build-gpu" -j8 ${TARGETS:-nf4flash} >"$out/build.log" 2>&1
  rn=$?
  wait $pb
  rb=$?
  [ $rn = 0 ] || { grep -E "error|FAILED" "$out/build.log" | head -20; exit 1; }
  [ $rb = 0 ] || { grep -E "error|FAILED" "$out/build-base.log" | head -20; exit 1; }
  echo "built both trees"
fi
[ "${BUILD_ONLY:-0}" = 1 ] && exit 0
for r in $(seq 1 "$rounds"); do
  for t in base head; do
    bin="$root/build-gpu/nf4flash"
    [ $t = base ] && bin="$root/build-base/nf4flash"
    "$bin" bench --preset llama3-8b --device cuda --quant none,nf4 --double-quant --attn flash -p 512,4096 -n 128 \
      --ctx 512,32768 -r 3 --json "$out/cmp-$t-$r.json" >"$out/cmp-$t-$r.txt" 2>&1 || echo "bench $t round $r failed"
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def metrics(path):
    d = json.load(open(path))
    m = {}
    for c in d["configs"]:
        q = "nf4-dq" if c["quant"] == "nf4" else "bf16"
        for p in c.get("prefill", []):
            m[f"{q} TTFT p{p['prompt']} ms"] = p["ttft_ms"]["median"]
        for x in c.get("decode", []):
            m[f"{q} decode @{x['ctx']} tok/s"] = x["tok_s"]["median"]
    return m, d.get("gpus", [{}])[0].get("name", "?"), d.get("commit", "?")
runs = {t: [metrics(f"{out}/cmp-{t}-{r}.json") for r in range(1, rounds + 1)] for t in ("base", "head")}
gpu = runs["head"][0][1]
print(f"== same-speed check on {gpu}: base {runs['base'][0][2]} vs head {runs['head'][0][2]}, {rounds} rounds each (median of rounds) ==")
print(f"{'metric':<28} {'base':>10} {'head':>10} {'head/base':>10}")
for k in runs["head"][0][0]:
    b = statistics.median(r[0][k] for r in runs["base"] if k in r[0])
    h = statistics.median(r[0][k] for r in runs["head"] if k in r[0])
    print(f"{k:<28} {b:>10.2f} {h:>10.2f} {h / b:>10.4f}")
PY
