# Sourced by the GPU check scripts (gpu-batch-check.sh, gpu-serve-check.sh, gpu-moe-check.sh,
# gpu-decode-forms.sh, gpu-targets.sh): strict mode, the repo root as working folder, $out (OUT,
# default build-gpu/out) created, $gpu (the GPU's name with dashes, for file names), stamp MESSAGE
# (prints the seconds since sourcing) and bench_summary (below). With PACK=1 the files a script
# leaves in $out (logs, JSON, Markdown, CSV) go on exit into one archive, $out/SCRIPT-outputs.tar.gz
# (SCRIPT: the script's name; -2, -3, ... where one exists), and are removed: one file to copy back
# from the GPU machine. use_prebuilt (below): binaries built elsewhere (PREBUILT=1), for the scripts
# that call it (gpu-batch-check.sh, gpu-skinny-forms.sh).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=${OUT:-$root/build-gpu/out}
mkdir -p "$out"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr ' ' '-')
gpu=${gpu:-gpu}
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
pack_out() {
  local name files k=1
  name="$(basename "$0" .sh)-outputs.tar.gz"
  while [ -e "$out/$name" ]; do k=$((k + 1)); name="$(basename "$0" .sh)-outputs-$k.tar.gz"; done
  mapfile -t files < <(cd "$out" && find . -type f ! -name '*-outputs*.tar.gz' | sort)
  [ "${#files[@]}" -gt 0 ] || return 0
  (cd "$out" && tar -czf "$name" "${files[@]}" && rm -f "${files[@]}") || echo "PACK: could not archive $out"
}
if [ "${PACK:-0}" = 1 ]; then trap pack_out EXIT; fi
# use_prebuilt: with PREBUILT=1, unpack .prebuilt/bin.tar.xz (scripts/prebuild-sm90.sh) into build-gpu/
# and build-NAME/ (and the gpu tests' fixtures where that build reads them) and set prebuilt=1, which
# the calling script reads to skip its build; without it, prebuilt=0.
prebuilt=0
use_prebuilt() {
  [ "${PREBUILT:-0}" = 1 ] || return 0
  tar -xJf "$root/.prebuilt/bin.tar.xz" -C "$root" ||
    { echo "PREBUILT=1: cannot unpack .prebuilt/bin.tar.xz (scripts/prebuild-sm90.sh makes it)"; exit 1; }
  if [ -f build-gpu/FIXTURES_DIR ]; then
    local fx a
    fx=$(cat build-gpu/FIXTURES_DIR)
    mkdir -p "$fx" && for a in tests/fixtures/*.tar.xz; do tar -xJf "$a" -C "$fx"; done
  fi
  prebuilt=1
}
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
