#!/usr/bin/env bash
# Drafter recipe comparison on a fixed budget (issue #18, item 3): the same
# distilled sequences, the same steps and seed for every variant; one
# `bastion train-drafter` run per variant, its held-out τ every EVAL steps
# (DFlash chain, T = 0, block 16, on the first HELD_OUT sequences, never
# trained on). Prints a Markdown table; with OUT=FILE also writes it.
#
#   scripts/drafter-recipes.sh                      # 2000 sequences, 600 steps, all variants
#   SEQS=40 STEPS=4 EVAL=2 VARIANTS="base layers2" scripts/drafter-recipes.sh   # smoke run
#
# Needs a release build, the default model and distilled data
# (`bastion distill`). Target features are computed once per set of target
# layers into FEATURES (f16, reused across variants and reruns).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BASTION:-target/release/bastion}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
DATA=${DATA:-results/distill/smollm2-135m.jsonl}
SEQS=${SEQS:-2000}
STEPS=${STEPS:-600}
EVAL=${EVAL:-200}
HELD_OUT=${HELD_OUT:-16}
RUNS=${RUNS:-results/drafter-recipes}
FEATURES=${FEATURES:-results/features}

# name | arguments that differ from the base recipe (the shipped drafter's)
declare -A RECIPE=(
  [base]="--layers 1 --target-layers 2,15,27 --loss-decay 7 --learning-rate 2e-3 --warmup-steps 50"
  [norm-target]="--layers 1 --target-layers 2,15,27 --loss-decay 7 --learning-rate 2e-3 --warmup-steps 50 --norm-init target"
  [step-vocab]="--layers 1 --target-layers 2,15,27 --loss-decay 7 --learning-rate 2e-3 --warmup-steps 50 --sampled-vocab-scope step"
  [anchors8]="--layers 1 --target-layers 2,15,27 --loss-decay 7 --learning-rate 2e-3 --warmup-steps 50 --sequences-per-step 8 --anchors 8"
  [layers2-step]="--layers 2 --target-layers 2,15,27 --loss-decay 7 --learning-rate 2e-3 --warmup-steps 50 --sampled-vocab-scope step"
  [layers2-decay4-step]="--layers 2 --target-layers 2,15,27 --loss-decay 4 --learning-rate 2e-3 --warmup-steps 50 --sampled-vocab-scope step"
  [layers2]="--layers 2 --target-layers 2,15,27 --loss-decay 7 --learning-rate 2e-3 --warmup-steps 50"
  [layers3]="--layers 3 --target-layers 2,15,27 --loss-decay 7 --learning-rate 2e-3 --warmup-steps 50"
  [targets5]="--layers 1 --target-layers 1,8,15,22,28 --loss-decay 7 --learning-rate 2e-3 --warmup-steps 50"
  [targets-late]="--layers 1 --target-layers 20,25,29 --loss-decay 7 --learning-rate 2e-3 --warmup-steps 50"
  [decay4]="--layers 1 --target-layers 2,15,27 --loss-decay 4 --learning-rate 2e-3 --warmup-steps 50"
  [uniform]="--layers 1 --target-layers 2,15,27 --loss-decay 0 --learning-rate 2e-3 --warmup-steps 50"
  [lr1e-3]="--layers 1 --target-layers 2,15,27 --loss-decay 7 --learning-rate 1e-3 --warmup-steps 50"
  [lr4e-3]="--layers 1 --target-layers 2,15,27 --loss-decay 7 --learning-rate 4e-3 --warmup-steps 100"
  [l2-d4-step-lr4e-3]="--layers 2 --target-layers 2,15,27 --loss-decay 4 --learning-rate 4e-3 --warmup-steps 100 --sampled-vocab-scope step"
  [l3-d4-step-lr4e-3]="--layers 3 --target-layers 2,15,27 --loss-decay 4 --learning-rate 4e-3 --warmup-steps 100 --sampled-vocab-scope step"
)
VARIANTS=${VARIANTS:-"base norm-target layers2 step-vocab anchors8 decay4 layers2-decay4-step lr4e-3 layers3 targets-late l2-d4-step-lr4e-3 l3-d4-step-lr4e-3 layers2-step uniform lr1e-3 targets5"}

rows=()
for name in $VARIANTS; do
  args=${RECIPE[$name]:?unknown variant $name}
  out="$RUNS/$name"
  mkdir -p "$RUNS"
  # A variant finished with these settings by an earlier (interrupted) run is
  # reused: the script resumes across sessions. Its log and stamp are committed
  # (the weights are not), so a fresh clone skips it too.
  stamp="MODEL=$MODEL SEQS=$SEQS STEPS=$STEPS EVAL=$EVAL HELD_OUT=$HELD_OUT DATA=$DATA $args"
  if [ -f "$out/training_log.jsonl" ] && [ -f "$out.done" ] && [ "$(head -1 "$out.done")" = "$stamp" ]; then
    secs=$(sed -n 2p "$out.done")
    load=$(sed -n 3p "$out.done")
    echo "$name: reusing the finished run in $out" >&2
  else
    rm -f "$out.done"
    start=$(date +%s)
    # A variant interrupted with these settings continues from its last checkpoint
    # (every 100 steps); the seconds column then counts only the last session's part.
    resume=()
    if [ -d "$out/checkpoints" ] && [ -f "$out.stamp" ] && [ "$(cat "$out.stamp")" = "$stamp" ]; then
      resume=(--resume)
    else
      rm -rf "$out" "$out.log"
    fi
    echo "$stamp" >"$out.stamp"
    # shellcheck disable=SC2086 # the recipe is a list of arguments
    "$BIN" train-drafter --model "$MODEL" --data "$DATA" --max-sequences "$SEQS" --out "$out" \
      --mask-token 5 --block-size 16 --steps "$STEPS" \
      --sampled-vocab 2048 --held-out "$HELD_OUT" --eval-every "$EVAL" --checkpoint-every 100 \
      --seed 0 --feature-cache "$FEATURES" "${resume[@]}" $args 2>>"$out.log" || { echo "variant $name failed: $out.log" >&2; exit 1; }
    secs=$(( $(date +%s) - start ))
    # The machine's 15-minute load average at the end: above the thread count, the
    # variant shared the CPU (its s / step then reads high).
    load=$(cut -d' ' -f3 /proc/loadavg 2>/dev/null || true)
    printf '%s\n%s\n%s\n' "$stamp" "$secs" "$load" >"$out.done"
  fi
  taus=$(grep -o '"held_out_tau":[0-9.]*' "$out/training_log.jsonl" | cut -d: -f2 | awk '{ printf "%s%.3f", (NR > 1 ? " / " : ""), $1 }')
  # Seconds per step: the median over the log's 10-step intervals (robust to held-out
  # estimates and checkpoints, which the seconds column includes).
  per_step=$(python3 -c '
import json, statistics, sys
t = [json.loads(l) for l in open(sys.argv[1])]
t = [(r["step"], r["seconds"]) for r in t if "seconds" in r and "loss_ema" in r]
d = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(t, t[1:]) if b[0] > a[0]]
print(f"{statistics.median(d):.2f}" if d else "–")' "$out/training_log.jsonl")
  rows+=("| $name | \`$args\` | $taus | $per_step | $secs | ${load:-–} |")
  echo "$name: held-out τ $taus (${secs} s)" >&2
done

table=$(
  echo "# Drafter recipes on a fixed budget"
  echo
  echo "\`SEQS=$SEQS STEPS=$STEPS EVAL=$EVAL HELD_OUT=$HELD_OUT VARIANTS=\"$VARIANTS\" scripts/drafter-recipes.sh\`,"
  echo "$(date -u +%Y-%m-%d), $(nproc) threads,"
  echo "release build. Every variant: the first $SEQS distilled sequences of \`$DATA\` (the first $HELD_OUT held out),"
  echo "$STEPS steps of 16 sequences × 4 anchors (train-drafter's defaults, unless the variant says otherwise), block 16,"
  echo "sampled softmax (+2048), seed 0. Held-out τ (DFlash chain, T = 0) every $EVAL steps. s / step: the median"
  echo "10-step interval of the training log; seconds: the whole run, with held-out estimates and, on first use, the"
  echo "target's features (variants may come from different sessions: compare s / step, not seconds). load: the"
  echo "15-minute load average when the variant ended (recorded since 2026-12-02 10:45; – before): above $(nproc), the"
  echo "variant shared the CPU with other work and its s / step reads high."
  echo
  echo "| variant | differs in | held-out τ at $EVAL, $((2 * EVAL)), … steps | s / step | seconds | load |"
  echo "|---|---|---|---:|---:|---:|"
  printf '%s\n' "${rows[@]}"
)
echo "$table"
if [ -n "${OUT:-}" ]; then
  mkdir -p "$(dirname "$OUT")"
  echo "$table" >"$OUT"
fi
