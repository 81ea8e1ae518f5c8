#!/usr/bin/env bash
# One device call for a decode session (scripts/gpu-check.sh builds and runs the gpu suite, then
# the decode benchmarks, bf16 decode, the GEMV kernel-bench rows, VRAM at ctx 8192 and the ncu step
# breakdown), each result packed into $OUT/all.tgz as it lands (only 8 files come back one by one,
# and a timed-out call keeps what was packed). Usage on the GPU machine: NF4FLASH_COMMIT=<hash>
# scripts/decode-session.sh
set -uo pipefail
export OUT NCCL_NVLS_ENABLE=0
B=build-gpu/nf4flash
pack() { (cd $OUT && tar czf all.tgz --exclude=all.tgz --exclude='*.csv' --exclude='*.sass' * 2>/dev/null); }
export NF4FLASH_COMMIT=${NF4FLASH_COMMIT:-wip} NF4FLASH_GPU_BENCH=0
bash scripts/gpu-check.sh > $OUT/check.txt 2>&1; tail -3 $OUT/check.txt
grep -E "tests passed|tests failed|\(Failed\)|Failed  |\*\*\*" $OUT/gpu-tests.log | head -20; pack
bash scripts/decode-bench.sh $B 512,32768 "default:" 2>&1 | tail -1; pack
bash scripts/decode-bench.sh $B 512 "nofuse:NF4FLASH_FUSE_NORM=0" "fusedmerge:NF4FLASH_ATTN_COMBINE=fused" 2>&1 | tail -2; pack
$B bench --preset llama3-8b --device cuda --quant none --attn flash -p 16 -n 128 --ctx 512 -r 3 \
  --json $OUT/decode-bf16.json > $OUT/decode-bf16.txt 2>&1; grep -E "^\|" $OUT/decode-bf16.txt | tail -2; pack
timeout 100 stdbuf -oL $B kernel-bench --gemv-only --json $OUT/kb.json > $OUT/kb.txt 2>&1
grep -E "(4096x14336|14336x4096) T=1 (seq|regs)|decode layer|copy" $OUT/kb.txt | sed -E 's/ +/ /g' | cut -c1-100 | head -24; pack
$B bench --preset llama3-8b --device cuda --quant nf4 --double-quant --ctx-size 8192 -p 4096 --ctx 8000 -n 32 -r 1 \
  --json $OUT/vram-p4096.json > $OUT/vram-p4096.txt 2>&1; grep -E "peak VRAM|^\|" $OUT/vram-p4096.txt | tail -3; pack
PROFILE_TIMES=1 timeout 60 bash scripts/profile-decode.sh $B
python3 scripts/ncu-step-table.py $OUT/ncu-times.csv --steps 2 > $OUT/ncu-step.txt 2>&1; head -14 $OUT/ncu-step.txt; pack
ls -la $OUT/all.tgz
