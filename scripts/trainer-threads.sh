#!/usr/bin/env bash
# Drafter-training step time and CPU use by thread count: the earlier shipped recipe
# (2 layers, block 16, step-scoped sampled softmax; thread scaling does not depend on it) on the first SEQS distilled
# sequences, STEPS steps per run, runs alternated ROUNDS times. Prints wall
# time, CPU use (/usr/bin/time) and the median seconds per step of the
# training log, and whether the runs' weights are identical. OLD=path adds a
# run of another binary (e.g. the build before a change) at 2 threads.
#
#   scripts/trainer-threads.sh                                 # 300 sequences, 60 steps, 2 rounds
#   OLD=/tmp/bastion-before scripts/trainer-threads.sh
#
# Needs a release build, the default model and distilled data; nothing else
# may run meanwhile. The target features are cached in FEATURES first.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BASTION:-target/release/bastion}
SEQS=${SEQS:-300}
STEPS=${STEPS:-60}
ROUNDS=${ROUNDS:-2}
FEATURES=${FEATURES:-/tmp/trainer-threads-features}
OUT=${OUT:-/tmp/trainer-threads}
run() { # binary threads steps out
  rm -rf "$4"
  /usr/bin/time -f "%e s wall, %U s user, %S s sys, %P CPU" "$1" train-drafter \
    --model models/SmolLM2-135M-Instruct.Q4_1.gguf --data results/distill/smollm2-135m.jsonl --max-sequences "$SEQS" \
    --out "$4" --mask-token 5 --block-size 16 --layers 2 --target-layers 2,15,27 --steps "$3" \
    --learning-rate 4e-3 --warmup-steps 100 --loss-decay 4 --sampled-vocab 2048 --sampled-vocab-scope step \
    --held-out 16 --eval-every 0 --checkpoint-every 0 --seed 0 --feature-cache "$FEATURES" --threads "$2" 2>&1 | tail -1
  python3 -c "
import json, statistics, sys
rs = [json.loads(l) for l in open(sys.argv[1]) if 'step_seconds' in l]
print('   median s/step', round(statistics.median(r['step_seconds']['wall'] for r in rs), 3))" "$4/training_log.jsonl"
}
run "$BIN" 2 1 "$OUT-warm" >/dev/null # builds the feature cache
for _ in $(seq "$ROUNDS"); do
  if [ -n "${OLD:-}" ]; then echo "old binary, 2 threads: $(run "$OLD" 2 "$STEPS" "$OUT-old")"; fi
  echo "2 threads: $(run "$BIN" 2 "$STEPS" "$OUT-2")"
  echo "1 thread: $(run "$BIN" 1 "$STEPS" "$OUT-1")"
done
cmp "$OUT-2/model.safetensors" "$OUT-1/model.safetensors" && echo "weights identical at 1 and 2 threads"
if [ -n "${OLD:-}" ]; then
  cmp "$OUT-old/model.safetensors" "$OUT-2/model.safetensors" && echo "weights identical to the old binary's"
fi
