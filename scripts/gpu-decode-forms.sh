#!/usr/bin/env bash
# The 4-bit decode GEMV's code-decode forms on the GPU machine, from the repo root:
#   1. builds build-gpu (the kernel benchmark and, unless TESTS=0, the gpu tests)
#   2. the 4-bit GEMV gpu tests (GTEST_FILTER, default CudaOps.Linear*:CudaFused.*; TESTS=0 skips
#      building and running them)
#   3. nf4flash-kernel-bench --decode-forms ROUNDS times (default 2): each form's time on 4096x14336,
#      14336x4096, 5120x2048 and 2048x4096 at T=1, nf4-dq, and whether its output equals the
#      backend's bit for bit
#   4. with NCU=1 (default, where ncu is on PATH): every form's launches under ncu, one line a
#      form and shape: time, warp instructions, issue-slot use, the stall reasons above 0.1 cycles an
#      issued instruction, and the executed SASS opcodes that differ between the forms (LDS, SHFL,
#      PRMT, LOP3, SHF, HMMA) per 4 tiles (one warp's batch)
# Logs and JSON go to $OUT (default build-gpu/out); one summary line per measurement on stdout.
source "$(dirname "$0")/gpu-common.sh"
deps=(-DCMAKE_PREFIX_PATH="$root/.device-deps/usr" -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release -DNF4FLASH_SERVE=OFF)
cmake -S . -B build-gpu -G Ninja "${deps[@]}" >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
tests=${TESTS:-1}
targets=(nf4flash-kernel-bench)
[ "$tests" = 1 ] && targets+=(nf4flash_gpu_tests)
ninja -C build-gpu -j"${JOBS:-14}" "${targets[@]}" >"$out/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$out/build.log" | head -30; exit 1; }
stamp "built"

if [ "$tests" = 1 ]; then
  ./build-gpu/tests/nf4flash_gpu_tests --gtest_filter="${GTEST_FILTER:-CudaOps.Linear*:CudaFused.*}" >"$out/forms-tests.log" 2>&1
  stamp "tests rc=$?: $(grep -E '^\[  (PASSED|FAILED)  \]' "$out/forms-tests.log" | tr '\n' ' ')"
fi

kb=./build-gpu/bench/kernels/nf4flash-kernel-bench
for r in $(seq 1 "${ROUNDS:-2}"); do
  $kb --decode-forms --json "$out/$gpu-decode-forms-$r.json" >"$out/decode-forms-$r.txt" 2>&1 ||
    { echo "decode forms round $r failed:"; tail -5 "$out/decode-forms-$r.txt"; }
  grep -E "copy|form:" "$out/decode-forms-$r.txt" | sed "s/^/round $r: /"
done

if [ "${NCU:-1}" = 1 ] && command -v ncu >/dev/null; then
  common=(--clock-control none --print-kernel-base demangled -k regex:gemv_q4_decode_kernel --csv)
  timeout 150 ncu "${common[@]}" --metrics "launch__shared_mem_per_block_dynamic,gpu__time_duration.sum,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    $kb --decode-forms --reps 1 --trials 1 >"$out/ncu-forms.csv" 2>"$out/ncu-forms.err" || echo "ncu (metrics) failed: see ncu-forms.err"
  timeout 150 ncu "${common[@]}" --metrics launch__shared_mem_per_block_dynamic,sass__inst_executed_per_opcode --print-metric-instances values \
    $kb --decode-forms --reps 1 --trials 1 >"$out/ncu-forms-opcodes.csv" 2>"$out/ncu-forms-opcodes.err" || echo "ncu (opcodes) failed: see ncu-forms-opcodes.err"
  stamp "ncu done"
  python3 - "$out/ncu-forms.csv" "$out/ncu-forms-opcodes.csv" <<'PY'
import csv, re, sys
from collections import defaultdict

def rows(path):
    try:
        lines = [l for l in open(path) if l.startswith('"')]
    except OSError:
        return []
    return list(csv.DictReader(lines))

def keyed(path):  # rows by launch, keyed by form (template arguments) and shape (grid, shared memory)
    launches = defaultdict(list)
    for r in rows(path):
        launches[r["ID"]].append(r)
    for rs in launches.values():
        m = re.search(r"gemv_q4_decode_kernel<([^>]*)>", rs[0]["Kernel Name"])
        smem = next((r["Metric Value"] for r in rs if r["Metric Name"] == "launch__shared_mem_per_block_dynamic"), "?")
        k = (m.group(1) if m else rs[0]["Kernel Name"][:60]), f"{rs[0]['Grid Size']} smem {smem}"
        for r in rs:
            yield k, r

vals = defaultdict(lambda: defaultdict(list))
for k, r in keyed(sys.argv[1]):
    try:
        vals[k][r["Metric Name"]].append(float(r["Metric Value"].replace(",", "")))
    except ValueError:
        pass
ops = defaultdict(lambda: defaultdict(list))
for k, r in keyed(sys.argv[2]):
    if r["Metric Name"] != "sass__inst_executed_per_opcode":
        continue
    # instance values: OPCODE: count pairs (one launch)
    d = {op: float(n.replace(",", "")) for op, n in
         re.findall(r"([A-Z][A-Z0-9_.]*)\s*[:=]\s*([0-9][0-9,.]*)", r["Metric Value"])}
    for op, n in d.items():
        ops[k][op].append(n)

avg = lambda v: sum(v) / len(v) if v else float("nan")
for k in sorted(vals):
    m = vals[k]
    us = avg(m.get("gpu__time_duration.sum", [])) / 1000.0
    inst = avg(m.get("smsp__inst_executed.sum", []))
    issue = avg(m.get("smsp__issue_active.avg.pct_of_peak_sustained_active", []))
    stalls = sorted(((avg(v), re.sub(r"smsp__average_warps_issue_stalled_|_per_issue_active\.ratio", "", n))
                     for n, v in m.items() if "issue_stalled" in n), reverse=True)
    st = ", ".join(f"{n} {v:.2f}" for v, n in stalls if v > 0.1)
    line = f"ncu form <{k[0]}> grid {k[1]}: {us:.2f} us, {inst:.3e} warp inst, issue {issue:.1f}%; stalls {st}"
    o = ops.get(k)
    hm = avg(o.get("HMMA", [])) if o else 0
    if o and hm > 0:  # per 4 tiles = 16 HMMA
        per = lambda op: sum(avg(v) for n, v in o.items() if n == op or n.startswith(op + ".")) * 16 / hm
        line += "; per 4 tiles: " + " ".join(f"{op} {per(op):.0f}" for op in ("LDS", "SHFL", "PRMT", "LOP3", "SHF", "HMMA"))
    print(line)
PY
fi
stamp "done"
