#!/usr/bin/env bash
# The skinny GEMM's forms on the GPU machine: build the kernel benchmark, time the 4-bit rows
# (--gemv-only) of each form in FORMS, two rounds alternated, then with NCU=1 (default) each form's
# launches in this tree under ncu (time, instructions, issue use, stall reasons per issue), one line
# per kernel template and DRAM bytes read (the shape).
#   FORMS  space-separated LABEL:VAR=VALUE[,VAR=VALUE...] (default: the mma.sync and the wgmma form,
#          NF4FLASH_Q4_SKINNY_KERNEL=mma / wgmma)
#   ROWS   the token counts printed, an extended regex (default 16|32); per count also a "layer" line:
#          the sum of a Llama-3-8B layer's four 4-bit launches (q/k/v, o, gate+up+SiLU, down+residual)
#   SYNC   1 (default): also this tree's stage-synchronization forms (--skinny-forms: block barrier
#          or mbarrier ring a stage, both timed twice, outputs compared bit for bit); 0: not
#   TREES  space-separated LABEL=DIR: other source trees' kernel benchmarks (build-LABEL, without
#          their tests), each timed before this tree's in every form and round (labels
#          LABEL-FORM-ROUND); BASE=DIR is TREES="base=DIR"
source "$(dirname "$0")/gpu-common.sh"
deps=(-DCMAKE_PREFIX_PATH="$root/.device-deps/usr" -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release -DNF4FLASH_SERVE=OFF)
build_kb() {  # source dir, build dir, cmake options...
  cmake -S "$1" -B "$2" -G Ninja "${deps[@]}" "${@:3}" >"$out/configure-$2.log" 2>&1 || { tail -20 "$out/configure-$2.log"; return 1; }
  ninja -C "$2" -j"${JOBS:-16}" nf4flash-kernel-bench >"$out/build-$2.log" 2>&1 || { grep -E "error|FAILED" "$out/build-$2.log" | head -30; return 1; }
}
use_prebuilt
others=${TREES:-}
[ -n "${BASE:-}" ] && others="base=$BASE $others"
pids=()
trees=""
if [ "$prebuilt" = 0 ]; then  # PREBUILT=1: the unpacked binaries (build-gpu, build-LABEL)
  build_kb . build-gpu &
  pids+=($!)
fi
for td in $others; do
  if [ "$prebuilt" = 0 ]; then
    build_kb "${td#*=}" "build-${td%%=*}" -DNF4FLASH_TESTS=OFF &
    pids+=($!)
  fi
  trees="$trees ${td%%=*}"
done
trees="$trees gpu"
for p in "${pids[@]}"; do wait "$p" || exit 1; done
stamp built
forms=${FORMS:-"mma:NF4FLASH_Q4_SKINNY_KERNEL=mma wgmma:NF4FLASH_Q4_SKINNY_KERNEL=wgmma"}
run_form() {  # tree, label, env...
  local t=$1 label=$2; shift 2
  env "$@" ./build-$t/bench/kernels/nf4flash-kernel-bench --gemv-only --json "$out/kb-$label.json" >"$out/kb-$label.txt" 2>&1 ||
    { echo "$label failed"; tail -3 "$out/kb-$label.txt"; }
  grep -E "nf4-dq (14336x4096|4096x14336|gate\+up\+silu 2x14336x4096) T=(${ROWS:-16|32}) " "$out/kb-$label.txt" | sed "s/^/$label: /"
  # a Llama-3-8B layer's four 4-bit launches: q/k/v, o, gate+up+SiLU, down+residual
  awk -v label="$label" -v rows="^T=(${ROWS:-16|32})$" '
    /nf4-dq (qkv 6144x4096|4096x4096|gate\+up\+silu 2x14336x4096|down\+residual 4096x14336) T=/ {
      for (i = 1; i <= NF; ++i) if ($i ~ /^T=/) { t = $i; us = $(i + 1) }
      n = /qkv/ ? "qkv" : /gate/ ? "gate+up" : /down/ ? "down" : "o"
      if (t ~ rows) { sum[t] += us; part[t] = part[t] sprintf(" %s %.2f", n, us) }
    }
    END { for (t in sum) printf "%s: layer %s %.2f us (%s)\n", label, t, sum[t], substr(part[t], 2) }' "$out/kb-$label.txt"
}
for r in 1 2; do
  for f in $forms; do
    for t in $trees; do
      label=${f%%:*}-$r
      [ "$t" != gpu ] && label=$t-$label
      IFS=, read -r -a envs <<<"${f#*:}"
      run_form "$t" "$label" "${envs[@]}"
    done
  done
done
stamp timed
if [ "${SYNC:-1}" = 1 ]; then  # this tree's stage-synchronization forms (kernel benchmark --skinny-forms)
  ./build-gpu/bench/kernels/nf4flash-kernel-bench --skinny-forms --json "$out/$gpu-skinny-sync.json" >"$out/skinny-sync.txt" 2>&1 ||
    { echo "skinny forms failed"; tail -3 "$out/skinny-sync.txt"; }
  grep -E "^skinny nf4-dq|differ|skipped" "$out/skinny-sync.txt"
  stamp "stage synchronization forms"
fi
if [ "${NCU:-1}" = 1 ] && command -v ncu >/dev/null; then
  for f in $forms; do
    IFS=, read -r -a envs <<<"${f#*:}"
    f=${f%%:*}
    env "${envs[@]}" timeout 200 ncu --clock-control none --print-kernel-base demangled -k regex:gemm_q4_skinny_kernel --csv \
      --metrics "dram__bytes_read.sum,gpu__time_duration.sum,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
      ./build-gpu/bench/kernels/nf4flash-kernel-bench --gemv-only --reps 1 --trials 1 >"$out/ncu-$f.csv" 2>"$out/ncu-$f.err" || echo "ncu $f failed"
    python3 - "$out/ncu-$f.csv" "$f" <<'PY'
import csv, re, sys
from collections import defaultdict
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
launch = defaultdict(dict)
names = {}
for r in csv.DictReader(lines):
    try: launch[r["ID"]][r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
    except ValueError: pass
    names[r["ID"]] = r["Kernel Name"]
by = defaultdict(lambda: defaultdict(list))
for i, m in launch.items():  # keyed by template arguments and DRAM megabytes read (the shape)
    t = re.search(r"gemm_q4_skinny_kernel<([^>]*)>", names[i])
    k = f"<{t.group(1) if t else '?'}> ~{10 * round(m.get('dram__bytes_read.sum', 0) / 1e7)} MB"
    for n, v in m.items(): by[k][n].append(v)
avg = lambda v: sum(v) / len(v) if v else float("nan")
for k, m in sorted(by.items()):
    st = sorted(((avg(v), re.sub(r"smsp__average_warps_issue_stalled_|_per_issue_active\.ratio", "", n)) for n, v in m.items() if "issue_stalled" in n), reverse=True)
    print(f"ncu {sys.argv[2]} {k}: {avg(m['gpu__time_duration.sum'])/1000:.2f} us (mean of {len(m['gpu__time_duration.sum'])}), "
          f"{avg(m['smsp__inst_executed.sum']):.3e} inst, issue {avg(m['smsp__issue_active.avg.pct_of_peak_sustained_active']):.1f}%; "
          + ", ".join(f"{n} {v:.2f}" for v, n in st if v > 0.08))
PY
  done
  stamp ncu
fi
