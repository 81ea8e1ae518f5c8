#!/usr/bin/env bash
# Tokenizer encode throughput, single thread, nf4flash vs Hugging Face tokenizers (the Rust library
# through @anush008/tokenizers) on the same English and Korean text in the same run, for llama3 and
# llama2. The texts (~2 MB each) are built here from sentences in this script (no download).
# Writes bench/results/tokenizer-<date>.json and prints a table.
# usage: scripts/bench-tokenizer.sh [BUILD_DIR (default build)] [SECONDS per measurement (default 5)]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
SECS=${2:-5}
BIN=$BUILD/nf4flash
FIX=$BUILD/fixtures/tokenizers
[ -x "$BIN" ] || { echo "error: $BIN not built" >&2; exit 1; }
[ -d tests/differential/node_modules/@anush008/tokenizers ] ||
  { echo "error: run 'npm ci' in tests/differential first (scripts/install-deps.sh does)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 - "$work" <<'PY'
import random, sys
out = sys.argv[1]
random.seed(4)
en = [
    "The FlashAttention kernel tiles Q, K and V into SRAM blocks and never materializes the full attention matrix.",
    "Quantization to 4 bits keeps the weights resident on the GPU, so decode speed is bound by memory bandwidth.",
    "I'm sure you'll see they've done it, haven't they? We'd like it.",
    "In 1969, 600 million people watched the landing; by 2024 the video had 3.5 billion views.",
    "def f(x):\n    return x ** 2  # square\n",
    "She opened the window, looked at the rain, and decided that the walk could wait until tomorrow.",
    "Prices rose 3.2% in March, the third consecutive monthly increase, according to the statistics office.",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "Tokenizers split text into pieces; a good one is both exact and fast.",
    "The committee will meet on Tuesday at 10:30 to review the budget for the next fiscal year.",
]
ko = [
    "로컬 LLM이 느릴 때 가장 먼저 점검할 것은 메모리 대역폭과 배치 크기입니다.",
    "4비트 양자화는 주로 메모리 사용량을 줄이고, 디코딩 속도를 높여 줍니다.",
    "오늘은 날씨가 맑아서 한강 공원에 산책을 다녀왔습니다.",
    "토크나이저는 텍스트를 작은 조각으로 나누는 프로그램이며, 정확하고 빨라야 합니다.",
    "서울에서 부산까지 기차로 약 두 시간 반이 걸립니다.",
    "이 문서는 2024년 3월에 작성되었으며, 12개의 장으로 구성되어 있습니다.",
    "회의는 화요일 오전 10시 30분에 시작하니 늦지 않도록 해 주세요.",
    "그는 창문을 열고 비를 바라보다가 산책은 내일로 미루기로 했다.",
    "인공지능 모델의 성능은 데이터의 품질에 크게 좌우됩니다.",
    "저녁에는 가족과 함께 김치찌개와 불고기를 먹었습니다.",
]
for name, sents in (("en", en), ("ko", ko)):
    parts, size = [], 0
    while size < 2_000_000:
        s = random.choice(sents) + ("\n" if random.random() < 0.2 else " ")
        parts.append(s)
        size += len(s.encode("utf-8"))
    open(f"{out}/{name}.txt", "w", encoding="utf-8").write("".join(parts))
PY

cpu=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
results=()
printf "%-8s %-8s %14s %14s %8s\n" tokenizer text "nf4flash MB/s" "HF MB/s" speedup
for tok in llama3 llama2; do
  for lang in en ko; do
    f=$work/$lang.txt
    ours=$("$BIN" tokenize --tokenizer "$FIX/$tok/tokenizer.json" --text-file "$f" --bench-seconds "$SECS" --threads 1)
    hf=$(node tests/differential/bench-hf.js "$FIX/$tok/tokenizer.json" "$f" "$SECS")
    line=$(python3 - "$tok" "$lang" "$ours" "$hf" <<'PY'
import json, sys
tok, lang, ours, hf = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
speed = ours["mb_per_cpu_s"] / hf["mb_per_cpu_s"]
print(json.dumps({"tokenizer": tok, "text": lang, "nf4flash": ours, "hf_tokenizers": hf,
                  "speedup_cpu": round(speed, 2)}))
print(f"{tok:<8} {lang:<8} {ours['mb_per_cpu_s']:14.2f} {hf['mb_per_cpu_s']:14.2f} {speed:7.1f}x", file=sys.stderr)
PY
)
    results+=("$line")
  done
done
mkdir -p bench/results
outfile=bench/results/tokenizer-$(date -u +%Y-%m-%d).json
printf '%s\n' "${results[@]}" | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
meta = {"what": "single-thread encode throughput, MB of UTF-8 input per CPU second (mb_per_cpu_s) and per wall second (mb_per_s)",
        "cpu": sys.argv[1], "nproc": int(sys.argv[2]), "commit": sys.argv[3], "command": sys.argv[4],
        "hf_tokenizers": "@anush008/tokenizers 0.6.0 (Rust tokenizers 0.22.2)", "results": rows}
json.dump(meta, open(sys.argv[5], "w"), indent=2, ensure_ascii=False)
' "$cpu" "$(nproc)" "$commit" "scripts/bench-tokenizer.sh $BUILD $SECS" "$outfile"
echo "wrote $outfile (CPU: $cpu)"
