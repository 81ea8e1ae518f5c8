# Sourced by the GPU check scripts (gpu-batch-check.sh, gpu-serve-check.sh, gpu-moe-check.sh):
# strict mode, the repo root as working folder, $out (OUT, default build-gpu/out) created, $gpu
# (the GPU's name with dashes, for file names), stamp MESSAGE (prints the seconds since sourcing)
# and bench_summary (below).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=${OUT:-$root/build-gpu/out}
mkdir -p "$out"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr ' ' '-')
gpu=${gpu:-gpu}
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
# bench_summary JSON LABEL [FLOOR]: one line per ok config of a single-sequence bench JSON, its first
# prompt's median TTFT and first context's median decode rate (with FLOOR tok/s: the share of it)
bench_summary() {
  python3 - "$1" "$2" "${3:-0}" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
floor = float(sys.argv[3])
for c in j["configs"]:
    if c["status"] != "ok": continue
    p = c["prefill"][0]["ttft_ms"]["median"]; d = c["decode"][0]["tok_s"]["median"]
    share = f" ({100 * d / floor:.1f}% of floor)" if floor > 0 else ""
    print(f"{sys.argv[2]}: TTFT@{c['prefill'][0]['prompt']} {p:.2f} ms, decode@{c['decode'][0]['ctx']} {d:.1f} tok/s{share}")
PY
}
