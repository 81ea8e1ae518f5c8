#!/usr/bin/env bash
# Decode speed of the llama3-8b preset (NF4 double quant, bf16, flash, graphs on, batch 1) under
# several decode-GEMV settings, one `nf4flash bench` per setting, each setting given as
# "label:ENV=VAL,ENV=VAL" (empty env list: defaults). JSON per setting and a table go to $OUT
# (default build-gpu/out); the pseudo-setting DQ=0 benches single-quant NF4 (f32 absmax) instead.
# Usage: scripts/decode-bench.sh [BIN] [CTX_LIST] [SETTING...]
#   scripts/decode-bench.sh build-gpu/nf4flash 512,32768 default: pf0:NF4FLASH_L2_PREFETCH_MB=0
set -uo pipefail
bin=${1:-build-gpu/nf4flash}
ctx=${2:-512,32768}
shift 2 || true
settings=("$@")
[ ${#settings[@]} -eq 0 ] && settings=("default:" "pf0:NF4FLASH_L2_PREFETCH_MB=0" "streamk:NF4FLASH_GEMV_Q4=streamk")
out=${OUT:-build-gpu/out}
mkdir -p "$out"
for s in "${settings[@]}"; do
  label=${s%%:*}
  envs=${s#*:}
  (
    IFS=',' read -ra kv <<<"$envs"
    dq=--double-quant
    for e in "${kv[@]}"; do
      if [ "$e" = DQ=0 ]; then dq=; elif [ -n "$e" ]; then export "$e"; fi
    done
    "$bin" bench --preset llama3-8b --device cuda --quant nf4 $dq --attn flash -p 16 -n 128 \
      --ctx "$ctx" -r 3 --json "$out/decode-$label.json" >"$out/decode-$label.txt" 2>&1
  ) || echo "decode bench $label failed (see $out/decode-$label.txt)"
done
echo "== decode tok/s (median of 3) =="
for s in "${settings[@]}"; do
  label=${s%%:*}
  python3 - "$out/decode-$label.json" "$label" "${s#*:}" <<'PY' 2>/dev/null || echo "$label: no result"
import json, sys
d = json.load(open(sys.argv[1]))
row = "  ".join(f"ctx {x['ctx']}: {x['tok_s']['median']:.1f}" for c in d["configs"] for x in c.get("decode", []))
print(f"{sys.argv[2]:<12} {row}   [{sys.argv[3] or 'defaults'}]")
PY
done
