#!/usr/bin/env bash
# The speed targets' benchmarks (docs/performance.md, "Targets") in one run, from the repo root on the
# GPU machine: builds nf4flash into build-gpu, then
#   D   llama3-8b NF4-dq decode @512 and @32768 (-p 16 -n 128 -r 3), then @512 with --quant-lm-head
#   F   qwen3-30b-a3b NF4-dq decode @512 (-p 512 -n 128 -r 3)
#   BB  bench --batch 1,32,64 (llama3-8b NF4-dq, -p 512 -n 128)
# each printed as one line with its share of the GPU's floor (H100 or H200 floors of the docs; the
# copy bandwidth is not measured here). SKIP="D F BB" leaves stages out. JSON and Markdown go to $OUT
# (default build-gpu/out), named after the GPU.
source "$(dirname "$0")/gpu-common.sh"
deps=(-DCMAKE_PREFIX_PATH="$root/.device-deps/usr" -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release -DNF4FLASH_SERVE=OFF)
skip=" ${SKIP:-} "
cmake -S . -B build-gpu -G Ninja "${deps[@]}" >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
ninja -C build-gpu -j"${JOBS:-14}" nf4flash >"$out/build-nf4flash.log" 2>&1 ||
  { grep -E "error|FAILED" "$out/build-nf4flash.log" | head -30; exit 1; }
stamp "built nf4flash"

# floors (tok/s) of the GPU: H200 or H100 (docs/performance.md, "Workload and floors")
case "$gpu" in
  *H200*) f512=903; f32k=470; fhead=1050; fmoe=2037; f32s=18800; f64s=28400 ;;
  *) f512=643; f32k=335; fhead=770; fmoe=1450; f32s=13600; f64s=20300 ;;
esac
b=./build-gpu/nf4flash
common=(--device cuda --quant nf4 --double-quant)
if [[ "$skip" != *" D "* ]]; then
  $b bench --preset llama3-8b "${common[@]}" --attn flash -p 16 -n 128 --ctx 512,32768 -r 3 \
    --json "$out/$gpu-decode.json" >/dev/null 2>"$out/decode.err" || { echo "decode bench failed"; tail -3 "$out/decode.err"; }
  $b bench --preset llama3-8b "${common[@]}" --quant-lm-head --attn flash -p 16 -n 128 --ctx 512 -r 3 \
    --json "$out/$gpu-decode-qhead.json" >/dev/null 2>"$out/decode-qhead.err" || { echo "decode bench (--quant-lm-head) failed"; tail -3 "$out/decode-qhead.err"; }
  python3 - "$out/$gpu-decode.json" "$out/$gpu-decode-qhead.json" "$f512" "$f32k" "$fhead" <<'PY'
import json, sys
for path, floors, label in ((sys.argv[1], (float(sys.argv[3]), float(sys.argv[4])), "llama3-8b NF4-dq"),
                            (sys.argv[2], (float(sys.argv[5]),), "llama3-8b NF4-dq --quant-lm-head")):
    try:
        j = json.load(open(path))
    except (OSError, ValueError):
        continue
    for c in j["configs"]:
        if c["status"] != "ok": continue
        for d, f in zip(c["decode"], floors):
            r = d["tok_s"]["median"]
            print(f"{label} decode@{d['ctx']}: {r:.1f} tok/s = {100 * r / f:.1f}% of {f:.0f}")
PY
  stamp "decode benches"
fi
if [[ "$skip" != *" F "* ]]; then
  $b bench --preset qwen3-30b-a3b "${common[@]}" -p 512 -n 128 -r 3 --json "$out/$gpu-qwen3-30b-a3b.json" \
    >/dev/null 2>"$out/qwen3.err" || { echo "qwen3-30b-a3b bench failed"; tail -3 "$out/qwen3.err"; }
  bench_summary "$out/$gpu-qwen3-30b-a3b.json" "qwen3-30b-a3b NF4-dq" "$fmoe"
  stamp "MoE bench"
fi
if [[ "$skip" != *" BB "* ]]; then
  $b bench --preset llama3-8b "${common[@]}" --batch 1,32,64 -p 512 -n 128 --json "$out/$gpu-batch.json" \
    --markdown "$out/$gpu-batch.md" >/dev/null 2>"$out/batch.err" || { echo "bench --batch failed"; tail -3 "$out/batch.err"; }
  sed -n '3,7p' "$out/$gpu-batch.md" 2>/dev/null  # header, rule, batch 1, 32, 64
  echo "batch floors: 32 sequences $f32s tok/s, 64 sequences $f64s tok/s"
  stamp "batch bench"
fi
