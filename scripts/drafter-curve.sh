#!/usr/bin/env bash
# The learning curve of the drafter recipe that won at equal CPU time
# (results/drafter-levers.md): block size 8, the target's last layers as a warm start,
# and soft targets (top-8 KL mixed with the hard labels), on 2 layers.
#
# One long `bastion train-drafter` run whose cosine schedule spans TOTAL steps. It
# checkpoints every 100 steps and estimates the held-out τ (per domain) every EVAL
# steps; rerunning the same command resumes it from its last checkpoint, so the curve
# grows across sessions (a session's end loses at most 100 steps). The checkpoints and the
# feature cache live in ignored folders: on a VM whose disk does not outlive a session the
# whole run must fit one, hence TOTAL's default of 4,000 steps (features about an hour,
# then about 1.3 s a step on a 2-core VM; a first run with TOTAL=16000 was lost at step
# 1,540 that way, its held-out τ in results/drafter-curve/README.md). Each call then
# redraws the curve: held-out τ against training CPU-hours (the steps' own wall times,
# held-out estimates excluded), as a figure and a table under OUT.
#
#   scripts/drafter-curve.sh                 # train until interrupted (or TOTAL), then plot
#   STOP=2000 scripts/drafter-curve.sh       # stop after step 2000 (a drafter is exported there)
#   PLOT_ONLY=1 scripts/drafter-curve.sh     # redraw the curve from the log so far
#
# Needs the release binary, the model (scripts/fetch-model.sh) and the distilled data
# (scripts/distill-data.sh unpack). The target's features for the first SEQS sequences are
# computed once into results/features/ (about an hour for 2,000 on a 2-core VM; shared
# with scripts/drafter-recipes.sh). Nothing else should run meanwhile: the curve's x axis
# is the steps' wall time.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BASTION:-target/release/bastion}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
DATA=${DATA:-results/distill/smollm2-135m.jsonl}
FEATURES=${FEATURES:-results/features}
SEQS=${SEQS:-2000}
TOTAL=${TOTAL:-4000}
EVAL=${EVAL:-500}
OUT=${OUT:-results/drafter-curve}
RUN=${RUN:-$OUT/run}
RECIPE="--layers 2 --target-layers 2,15,27 --loss-decay 4 --learning-rate 4e-3 --warmup-steps 100 --sampled-vocab-scope step --block-size 8 --warm-start last --soft-targets 8 --soft-weight 0.5"

mkdir -p "$OUT"
stamp="MODEL=$MODEL DATA=$DATA SEQS=$SEQS TOTAL=$TOTAL EVAL=$EVAL $RECIPE"
if [ -z "${PLOT_ONLY:-}" ]; then
  resume=()
  if [ -d "$RUN/checkpoints" ]; then
    if [ "$(cat "$OUT/run.stamp" 2>/dev/null)" != "$stamp" ]; then
      echo "$RUN holds a run of other settings ($OUT/run.stamp); move it away or set RUN" >&2
      exit 1
    fi
    resume=(--resume)
  fi
  echo "$stamp" >"$OUT/run.stamp"
  stop=()
  [ -n "${STOP:-}" ] && stop=(--stop-after "$STOP")
  # shellcheck disable=SC2086 # the recipe is a list of arguments
  "$BIN" train-drafter --model "$MODEL" --data "$DATA" --max-sequences "$SEQS" --out "$RUN" \
    --mask-token 5 --steps "$TOTAL" --sampled-vocab 2048 --held-out 16 --held-out-per-domain 16 \
    --eval-every "$EVAL" --checkpoint-every 100 --seed 0 --feature-cache "$FEATURES" \
    "${resume[@]}" "${stop[@]}" $RECIPE 2>>"$OUT/run.log" || echo "train-drafter stopped: $OUT/run.log" >&2
fi
# The log travels with the results (the weights do not).
cp "$RUN/training_log.jsonl" "$OUT/training_log.jsonl"
"$BIN" learning-curve --log "$OUT/training_log.jsonl" --out "$OUT/curve"
