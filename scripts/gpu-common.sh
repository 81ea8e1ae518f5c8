# Sourced by the GPU check scripts (gpu-batch-check.sh, gpu-serve-check.sh): strict mode, the repo
# root as working folder, $out (OUT, default build-gpu/out) created, $gpu (the GPU's name with
# dashes, for file names) and stamp MESSAGE (prints the seconds since sourcing).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=${OUT:-$root/build-gpu/out}
mkdir -p "$out"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr ' ' '-')
gpu=${gpu:-gpu}
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
