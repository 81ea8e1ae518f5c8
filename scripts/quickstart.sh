#!/usr/bin/env bash
# Installs what nf4flash needs (Debian/Ubuntu), builds it (for this machine's GPU when it has one),
# and runs the main job on a built-in default: text generation with the bundled 32k-vocab Llama
# fixture (random weights, the real Llama-2 tokenizer), quantized to NF4 on load.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-}
cmake --build build -j "$(nproc)"
./build/nf4flash run --model build/fixtures/models/llama2-tok-hd64 --quant nf4 --double-quant \
  --prompt "The fastest way to run a language model locally is" --max-new-tokens 32 --ignore-eos
