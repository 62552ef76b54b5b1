#!/usr/bin/env bash
# Distillation throughput at several batch sizes, measured in one run on the
# same training prompts: `bastion distill --batch B` for each B, wall time
# (prefills included), and a check that every batch size wrote the same
# records as batch 1. Prints a Markdown table; with OUT=FILE also writes it.
#
#   scripts/distill-throughput.sh                 # 64 prompts, 256 new tokens, B = 1 4 8 16 32
#   PROMPTS=16 BATCHES="1 8" scripts/distill-throughput.sh
#
# Needs a release build (cargo build --release -p bastion-cli) and the default
# model (scripts/fetch-model.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BASTION:-target/release/bastion}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
PROMPTS=${PROMPTS:-64}
MAX_NEW=${MAX_NEW:-256}
BATCHES=${BATCHES:-"1 4 8 16 32"}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

rows=()
base=""
ref=""
for b in $BATCHES; do
  "$BIN" distill --model "$MODEL" --out "$tmp/b$b.jsonl" --limit "$PROMPTS" --max-new-tokens "$MAX_NEW" \
    --batch "$b" 2>"$tmp/b$b.log"
  # "wrote N records (T response tokens) in S s: R tokens/s at batch B; ..."
  line=$(grep '^wrote ' "$tmp/b$b.log")
  tokens=$(sed -E 's/.*\(([0-9]+) response tokens\).*/\1/' <<<"$line")
  secs=$(sed -E 's/.* in ([0-9.]+) s:.*/\1/' <<<"$line")
  rate=$(sed -E 's/.*: ([0-9.]+) tokens\/s.*/\1/' <<<"$line")
  digest=$(sort "$tmp/b$b.jsonl" | sha256sum | cut -d' ' -f1)
  if [ -z "$ref" ]; then ref=$digest; base=$rate; fi
  same=$([ "$digest" = "$ref" ] && echo yes || echo NO)
  ratio=$(awk -v r="$rate" -v b="$base" 'BEGIN { printf "%.2f", r / b }')
  rows+=("| $b | $tokens | $secs | $rate | ${ratio}× | $same |")
  echo "batch $b: $rate tokens/s (${ratio}× batch ${BATCHES%% *}), records equal: $same" >&2
done

table=$(
  echo "# Distillation throughput by batch size"
  echo
  echo "\`PROMPTS=$PROMPTS MAX_NEW=$MAX_NEW BATCHES=\"$BATCHES\" scripts/distill-throughput.sh\`, $(date -u +%Y-%m-%d),"
  echo "$(nproc) threads, release build, target \`$(basename "$MODEL")\` (f32 weights on flex). Wall time per"
  echo "run, prefills included; the same $PROMPTS training prompts at every batch size."
  echo
  echo "| batch | response tokens | seconds | tokens/s | vs first | records equal to the first |"
  echo "|---:|---:|---:|---:|---:|:---:|"
  printf '%s\n' "${rows[@]}"
)
echo "$table"
if [ -n "${OUT:-}" ]; then
  mkdir -p "$(dirname "$OUT")"
  echo "$table" >"$OUT"
fi
grep -q '| NO |' <<<"$table" && { echo "records differ between batch sizes" >&2; exit 1; }
exit 0
