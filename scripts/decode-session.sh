#!/usr/bin/env bash
# One device call for a decode session (scripts/gpu-check.sh builds and runs the gpu suite, then
# the decode benchmarks and GEMV configurations, bf16 decode per dense GEMV mode, the GEMV
# kernel-bench rows, VRAM at ctx 8192 and the ncu step breakdowns of the NF4 and bf16 models),
# each result packed into $OUT/all.tgz as it lands (only 8 files come back one by one, and a
# timed-out call keeps what was packed). Usage on the GPU machine: NF4FLASH_COMMIT=<hash>
# scripts/decode-session.sh
set -uo pipefail
export OUT NCCL_NVLS_ENABLE=0
rm -rf "${OUT:?}"/*  # the device's $OUT has held earlier sessions' files: pack only this call's
B=build-gpu/nf4flash
pack() { (cd $OUT && tar czf all.tgz --exclude=all.tgz --exclude='*.csv' --exclude='*.sass' * 2>/dev/null); }
export NF4FLASH_COMMIT=${NF4FLASH_COMMIT:-wip} NF4FLASH_GPU_BENCH=0
bash scripts/gpu-check.sh > $OUT/check.txt 2>&1; tail -3 $OUT/check.txt
grep -E "tests passed|tests failed|\(Failed\)|Failed  |\*\*\*" $OUT/gpu-tests.log | head -20; pack
bash scripts/decode-bench.sh $B 512,32768 "default:" 2>&1 | tail -1; pack
bash scripts/decode-bench.sh $B 512 "h8:NF4FLASH_GEMV_SEQ_CFG=h8u4d3" "l8:NF4FLASH_GEMV_SEQ_CFG=l8u4d3" 2>&1 | tail -2; pack
for v in ${DENSE_MODES:-1 0 2}; do  # dense decode GEMV: 1 = multi-weight kernel for q/k/v + gate/up (default), 0 = none, 2 = all
  NF4FLASH_DENSE_MULTI=$v $B bench --preset llama3-8b --device cuda --quant none --attn flash -p 16 -n 128 --ctx 512 -r 3 \
    --json $OUT/decode-bf16-dm$v.json > $OUT/decode-bf16-dm$v.txt 2>&1
  echo "bf16 NF4FLASH_DENSE_MULTI=$v: $(grep -E 'decode tg' $OUT/decode-bf16-dm$v.txt | tail -1)"; done; pack
timeout 100 stdbuf -oL $B kernel-bench --gemv-only --json $OUT/kb.json > $OUT/kb.txt 2>&1
grep -E "(4096x14336|14336x4096) T=1 (seq|seq-[lph]8u4d3|regs) |decode layer|copy" $OUT/kb.txt | sed -E 's/ +/ /g' | cut -c1-100 | head -24; pack
$B bench --preset llama3-8b --device cuda --quant nf4 --double-quant --ctx-size 8192 -p 4096 --ctx 8000 -n 32 -r 1 \
  --json $OUT/vram-p4096.json > $OUT/vram-p4096.txt 2>&1; grep -E "peak VRAM|^\|" $OUT/vram-p4096.txt | tail -3; pack
PROFILE_TIMES=1 timeout 60 bash scripts/profile-decode.sh $B
python3 scripts/ncu-step-table.py $OUT/ncu-times.csv --steps 2 > $OUT/ncu-step.txt 2>&1; head -14 $OUT/ncu-step.txt; pack
mkdir -p $OUT/bf16 && OUT=$OUT/bf16 PROFILE_QUANT=none PROFILE_TIMES=1 timeout 90 bash scripts/profile-decode.sh $B
python3 scripts/ncu-step-table.py $OUT/bf16/ncu-times.csv --steps 2 > $OUT/bf16/ncu-step.txt 2>&1; head -10 $OUT/bf16/ncu-step.txt; pack
ls -la $OUT/all.tgz
