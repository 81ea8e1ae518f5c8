#!/usr/bin/env bash
# GPU check of `nf4flash serve` against the batched engine, from the repo root on the GPU machine
# (after scripts/gpu-batch-check.sh's build stage with SERVE=ON): on the reference preset
# (llama3-8b, NF4 double quant, the llama3 fixture tokenizer), in one run:
#   1. bench --batch 32 -p 512 -n 128 (the engine alone);
#   2. serve --ignore-eos --max-batch 32 and 32 streaming HTTP clients, one request each (prompt 512
#      token ids, 128 tokens): the steady-state decode rate the clients see (scripts/serve_load.py);
#   3. a 10-turn chat (~1,000-token history) against fresh ~100-token prompts (scripts/serve_turns.py).
# JSON and logs to $OUT (default build-gpu/out).
source "$(dirname "$0")/gpu-common.sh"
bin=./build-gpu/nf4flash
tok=build-gpu/fixtures/tokenizers/llama3

$bin bench --preset llama3-8b --device cuda --quant nf4 --double-quant --batch 32 -p 512 -n 128 \
  --json "$out/$gpu-serve-ref-batch32.json" 2>/dev/null | sed -n '3,5p'
stamp "bench --batch 32"

serve() {  # serve ARGS...: starts the server on a free port, sets $pid and $port
  $bin serve --preset llama3-8b --tokenizer "$tok" --device cuda --quant nf4 --double-quant --port 0 --no-log "$@" \
    2>"$out/serve.log" &
  pid=$!
  port=
  for _ in $(seq 1 1200); do
    port=$(grep -o 'on http://127.0.0.1:[0-9]*' "$out/serve.log" | head -1 | sed 's/.*://')
    [ -n "$port" ] && return 0
    kill -0 $pid 2>/dev/null || { echo "serve exited:"; tail -5 "$out/serve.log"; return 1; }
    sleep 0.1
  done
  echo "serve did not listen in 120 s"; return 1
}

if serve --ignore-eos --max-batch 32 --ctx-size 1024 --step-tokens 2048; then
  stamp "serve up"
  python3 scripts/serve_load.py --url "http://127.0.0.1:$port" --clients 32 --requests 1 --prompt-tokens 512 \
    --max-tokens 128 --vocab 128000 --json "$out/$gpu-serve-http32.json"
  python3 scripts/serve_load.py --url "http://127.0.0.1:$port" --clients 32 --requests 2 --prompt-tokens 512 \
    --max-tokens 128 --vocab 128000 --json "$out/$gpu-serve-http32-r2.json"
  kill -TERM $pid; wait $pid; echo "serve exit $?"
  stamp "http load"
fi
if serve --max-batch 8 --ctx-size 4096; then
  python3 scripts/serve_turns.py --url "http://127.0.0.1:$port" --turns 10 --json "$out/$gpu-serve-turns.json"
  kill -TERM $pid; wait $pid; echo "serve exit $?"
  stamp "multi-turn"
fi
