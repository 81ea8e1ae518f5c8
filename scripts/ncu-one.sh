# Sourced by gemv-profile.sh and attn-profile.sh. ncu_one REP REGEX SKIP CMD...: profile the
# (SKIP+1)-th launch whose kernel name matches REGEX in CMD under ncu (--clock-control none; the
# detail sections and the per-instruction source counters), then write REP.txt (details page),
# REP-sass.csv.gz (source page, SASS) and REP.log (CMD's output), and drop the report. On failure:
# the log's tail and status 1.
ncu_one() {
  local rep=$1 regex=$2 skip=$3
  shift 3
  timeout 240 ncu --clock-control none -k "regex:$regex" --launch-skip "$skip" -c 1 \
    --section SpeedOfLight --section WarpStateStats --section Occupancy --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section InstructionStats --section SchedulerStats --section LaunchStats \
    --section SourceCounters -o "$rep" -f "$@" >"$rep.log" 2>&1 || { tail -5 "$rep.log"; return 1; }
  ncu -i "$rep.ncu-rep" --page details --print-details all >"$rep.txt" 2>&1
  ncu -i "$rep.ncu-rep" --page source --print-source sass --csv 2>&1 | gzip >"$rep-sass.csv.gz"
  rm -f "$rep.ncu-rep"
}
