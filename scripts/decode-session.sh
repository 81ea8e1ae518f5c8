#!/usr/bin/env bash
# One device call for a decode session: scripts/gpu-check.sh builds and runs the gpu suite, then
# the GEMV kernel-bench rows (4-bit lean configurations, dense single-weight kernels), decode
# rows and decode attention rows, decode @512/@32768 with the defaults and each DECODE_AB setting
# ("label:ENV=VAL"), @512 per lean configuration in LEAN_CFGS, bf16 decode per dense kernel in
# DENSE_STREAMS and per BF16_AB setting ("label:ENV=VAL,..."; "label:" = defaults), peak VRAM at ctx 8192 with the setup trace (NF4FLASH_VRAM_TRACE), with SASS=1 the
# lean GEMV's SASS, with PROFILE=1 the ncu step tables of the NF4 and bf16 models, with GEMV_NCU=1
# the default GEMV alone under ncu (scripts/gemv-profile.sh, into gemv/) and with ATTN=1 the
# read-order rows and the decode attention ladder (scripts/attn-profile.sh, into attn/; ATTN_NCU=1
# adds its ncu launches, ATTN_KB=0 leaves the rows out), run right after the gpu suite (after the
# focused GEMV rows of KB_FOCUS="RxK ..." per KB_FOCUS_VARIANTS, default "seq grouped ablate"). Each result is packed into
# $OUT/all.tgz as it lands (only 8 files come back one by one, and a timed-out call keeps what was
# packed). Usage on the GPU machine: NF4FLASH_COMMIT=<hash> scripts/decode-session.sh
set -uo pipefail
export OUT NCCL_NVLS_ENABLE=0
rm -rf "${OUT:?}"/*  # the device's $OUT has held earlier sessions' files: pack only this call's
B=build-gpu/nf4flash
pack() { (cd $OUT && tar czf all.tgz --exclude=all.tgz --exclude='*.csv' --exclude='*.sass' * 2>/dev/null); }
export NF4FLASH_COMMIT=${NF4FLASH_COMMIT:-wip} NF4FLASH_GPU_BENCH=0
bash scripts/gpu-check.sh > $OUT/check.txt 2>&1; tail -3 $OUT/check.txt
grep -E "tests passed|tests failed|\(Failed\)|Failed  |\*\*\*" $OUT/gpu-tests.log | head -20; pack
if [ -n "${KB_FOCUS:-}" ]; then  # the 4-bit GEMV alone on these shapes per variant (default: seq, grouped, ablations)
  args=(); for s in $KB_FOCUS; do args+=(--gemv-shape "$s"); done
  for v in ${KB_FOCUS_VARIANTS:-seq grouped ablate}; do args+=(--gemv-variant "$v"); done
  timeout ${KB_FOCUS_TIMEOUT:-120} $B kernel-bench "${args[@]}" --json $OUT/kb-focus.json > $OUT/kb-focus.txt 2>&1
  [ -s $OUT/kb-focus.json ] && python3 scripts/kb-table.py $OUT/kb-focus.json 2>&1 | head -12; pack
fi
if [ "${ATTN:-0}" = 1 ]; then  # read orders + decode attention ladder (+ ncu with ATTN_NCU=1), into $OUT/attn
  mkdir -p $OUT/attn && OUT=$OUT/attn SKIP_BUILD=1 NCU=${ATTN_NCU:-0} KB=${ATTN_KB:-1} timeout ${ATTN_TIMEOUT:-420} \
    bash scripts/attn-profile.sh 2>&1 | tail -80; pack
fi
vram() {  # label, env...
  local l=$1; shift
  env NF4FLASH_VRAM_TRACE=1 "$@" $B bench --preset llama3-8b --device cuda --quant nf4 --double-quant --ctx-size 8192 -p 4096 \
    --ctx 8000 -n 32 -r 1 --json $OUT/vram-$l.json > $OUT/vram-$l.txt 2>&1
  echo "vram $l: $(grep -E '^peak VRAM' $OUT/vram-$l.txt) | $(grep -E 'TTFT' $OUT/vram-$l.txt | tail -1 | cut -c1-70)"
}
if [ "${VRAM:-1}" = 1 ]; then  # VRAM=0 skips the peak-VRAM rows
  vram p4096
  [ "${VRAM_OLD:-0}" = 1 ] && vram p4096-old NF4FLASH_DEQUANT_CHUNK_MB=0 NF4FLASH_CUDA_STACK_BYTES=256
  grep -E "^vram: (context|stack|cublas)" $OUT/vram-p4096.txt; grep -E "^vram: buffer" $OUT/vram-p4096.txt | tail -8; pack
fi
timeout ${KB_TIMEOUT:-210} stdbuf -oL $B kernel-bench --gemv-only --json $OUT/kb.json > $OUT/kb.txt 2>&1
[ -s $OUT/kb.json ] && python3 scripts/kb-table.py $OUT/kb.json 2>&1 | head -24  # read-only, T=1 GEMV per variant
grep -E "nf4-dq (4096x14336|14336x4096) T=1 (seq|seq-[a-z]8u4d3|regs) |decode layer GEMVs nf4-dq T=1 seq(-[a-z]8u4d3)? prefetch 0|decode layer GEMVs bf16|copy|gemv bf16|size sweep|attn decode|attn\+rope|decode layer full" \
  $OUT/kb.txt | sed -E 's/ +/ /g' | cut -c1-90 | head -60; pack
# DECODE_AB: extra "label:ENV=VAL" settings decoded at 512 and 32768 beside the defaults
set -- ${DECODE_AB:-}
bash scripts/decode-bench.sh $B 512,32768 "default:" "$@" 2>&1 | tail -$(( $# + 1 )); pack
if [ "${SASS:-0}" = 1 ]; then  # SASS of the 4-bit decode GEMV kernels (lean) for offline reading
  o=$(find build-gpu -name 'ops_gemv_lean.cu.o' | head -1)
  [ -n "$o" ] && cuobjdump -sass "$o" 2>/dev/null | gzip > $OUT/lean-sass.txt.gz; ls -la $OUT/lean-sass.txt.gz; pack
fi
set -- ${LEAN_CFGS:-}
[ $# -gt 0 ] && bash scripts/decode-bench.sh $B 512 $(for c in "$@"; do echo "$c:NF4FLASH_GEMV_SEQ_CFG=$c"; done) 2>&1 | tail -$#; pack
for v in ${DENSE_STREAMS:-0 4}; do  # dense single-weight decode GEMV: 0 = vec kernel (default), 4/8 = stream kernel (U)
  NF4FLASH_DENSE_STREAM=$v $B bench --preset llama3-8b --device cuda --quant none --attn flash -p 16 -n 128 --ctx 512 -r 3 \
    --json $OUT/decode-bf16-ds$v.json > $OUT/decode-bf16-ds$v.txt 2>&1
  echo "bf16 NF4FLASH_DENSE_STREAM=$v: $(grep -E 'decode tg' $OUT/decode-bf16-ds$v.txt | tail -1)"; done; pack
for s in ${BF16_AB:-}; do  # bf16-weight decode @512 per "label:ENV=VAL,ENV=VAL" setting (empty list: defaults)
  l=${s%%:*}; IFS=',' read -ra kv <<<"${s#*:}"
  env "${kv[@]}" $B bench --preset llama3-8b --device cuda --quant none --attn flash -p 16 -n 128 --ctx 512 -r 3 \
    --json $OUT/decode-bf16-$l.json > $OUT/decode-bf16-$l.txt 2>&1
  echo "bf16 $l (${s#*:}): $(grep -E 'decode tg' $OUT/decode-bf16-$l.txt | tail -1)"; done; pack
if [ "${PROFILE:-0}" = 1 ]; then
  PROFILE_TIMES=1 timeout 60 bash scripts/profile-decode.sh $B
  python3 scripts/ncu-step-table.py $OUT/ncu-times.csv --steps 2 > $OUT/ncu-step.txt 2>&1; head -14 $OUT/ncu-step.txt; pack
  mkdir -p $OUT/bf16 && OUT=$OUT/bf16 PROFILE_QUANT=none PROFILE_TIMES=1 timeout 90 bash scripts/profile-decode.sh $B
  python3 scripts/ncu-step-table.py $OUT/bf16/ncu-times.csv --steps 2 > $OUT/bf16/ncu-step.txt 2>&1; head -10 $OUT/bf16/ncu-step.txt; pack
fi
if [ "${GEMV_NCU:-0}" = 1 ]; then  # the default GEMV alone under ncu (scripts/gemv-profile.sh), into $OUT/gemv
  mkdir -p $OUT/gemv && OUT=$OUT/gemv timeout ${GEMV_NCU_TIMEOUT:-300} bash scripts/gemv-profile.sh 2>&1 | tail -12; pack
fi
ls -la $OUT/all.tgz
