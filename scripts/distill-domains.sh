#!/usr/bin/env bash
# The default model's drafter-training data for every evaluation domain, in
# the background-friendly order the data needs:
#
#   1. `bastion self-instruct` for the domains with no offline training
#      prompts (competition math, code), unless their files are there;
#      each file's checksum is added to datasets/SHA256SUMS (the loader only
#      reads listed files);
#   2. `bastion distill` over all training prompts (GSM8K train, MBPP
#      non-test, the self-instruct chat / math / code prompts, interleaved
#      one prompt per domain in turn), resuming results/distill/smollm2-135m.jsonl;
#   3. the token count per domain.
#
#   scripts/distill-domains.sh            # the whole thing (hours; rerun to resume)
#   MATH=40 CODE=40 LIMIT=200 scripts/distill-domains.sh   # a smoke run
#
# Resumable: a killed run loses at most the batch in flight; rerun the same
# command. Commit the data with `scripts/distill-data.sh pack`. Needs a
# release build (`cargo build --release -p bastion-cli`) and the default
# model (`scripts/fetch-model.sh`).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BASTION:-target/release/bastion}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
DATA=${DATA:-results/distill/smollm2-135m.jsonl}
MATH=${MATH:-2500}
CODE=${CODE:-3400}
BATCH=${BATCH:-32}
DTYPE=${DTYPE:-f32}

for spec in "math:$MATH" "code:$CODE"; do
  domain=${spec%%:*}
  count=${spec##*:}
  file="train/$domain-self-instruct.jsonl"
  if [ ! -f "datasets/$file" ]; then
    echo "== self-instruct $domain: $count prompts" >&2
    sum=$("$BIN" self-instruct --model "$MODEL" --domain "$domain" --count "$count" --max-attempts $((count * 5)))
    grep -v "  $file\$" datasets/SHA256SUMS >datasets/SHA256SUMS.tmp || true
    echo "$sum" >>datasets/SHA256SUMS.tmp
    mv datasets/SHA256SUMS.tmp datasets/SHA256SUMS
    rebuilt=no
  fi
done
# The binary carries the dataset checksums (compiled in from datasets/SHA256SUMS): a new
# prompt file is only read by a binary built after its line was added.
if [ "${rebuilt:-}" = no ]; then
  echo "== rebuilding $BIN: new checksums" >&2
  cargo build --release -p bastion-cli
fi

if [ -f "$DATA.xz" ]; then
  scripts/distill-data.sh unpack
fi
echo "== distill into $DATA (batch $BATCH, $DTYPE weights)" >&2
"$BIN" distill --model "$MODEL" --out "$DATA" --batch "$BATCH" --dtype "$DTYPE" ${LIMIT:+--limit "$LIMIT"}

python3 - "$DATA" <<'EOF'
import collections, json, sys
domain = {"gsm8k-train": "math", "math-self": "competition", "mbpp-train": "code", "code-self": "code"}
tokens, records = collections.Counter(), collections.Counter()
for line in open(sys.argv[1]):
    r = json.loads(line)
    d = domain.get(r["id"].split(":")[0], "chat")
    tokens[d] += len(r["response_ids"])
    records[d] += 1
total = sum(tokens.values())
print(f"{total} response tokens in {sum(records.values())} records")
for d in ("math", "competition", "code", "chat"):
    print(f"  {d}: {records[d]} records, {tokens[d]} tokens ({100 * tokens[d] / max(total, 1):.1f} %)")
EOF
