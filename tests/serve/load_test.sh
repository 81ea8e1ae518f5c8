#!/usr/bin/env bash
# ctest entry: a bounded load test of `nf4flash serve` on the CPU (scripts/serve_load.py): CLIENTS
# streaming clients for SECONDS seconds on the llama2 fixture over loopback; no failed request, no
# sequence or KV block held afterwards; the server is stopped by its PID and must exit 0.
# usage: load_test.sh NF4FLASH_BIN MODEL_DIR [CLIENTS] [SECONDS]
set -u
bin=$1 model=$2 clients=${3:-8} seconds=${4:-5}
here="$(cd "$(dirname "$0")" && pwd)"
log=$(mktemp)
trap 'kill -9 $pid 2>/dev/null; rm -f "$log"' EXIT
"$bin" serve --model "$model" --device cpu -t 2 --port 0 --ctx-size 256 --max-batch 8 --no-log 2>"$log" &
pid=$!
port=
for _ in $(seq 1 600); do
  port=$(grep -o 'on http://127.0.0.1:[0-9]*' "$log" | head -1 | sed 's/.*://')
  [ -n "$port" ] && break
  kill -0 $pid 2>/dev/null || { echo "FAIL: the server exited before listening:"; cat "$log"; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { echo "FAIL: the server did not listen within 60 s"; cat "$log"; exit 1; }
python3 "$here/../../scripts/serve_load.py" --url "http://127.0.0.1:$port" --clients "$clients" --duration "$seconds" \
  --prompt-tokens 24 --max-tokens 24 --vocab 32000
rc=$?
kill -TERM $pid
wait $pid
src=$?
[ $src = 0 ] || { echo "FAIL: the server exited $src after SIGTERM"; cat "$log"; exit 1; }
exit $rc
