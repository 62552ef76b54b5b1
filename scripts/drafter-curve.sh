#!/usr/bin/env bash
# The learning curve of the drafter recipe that won at equal CPU time
# (results/drafter-levers.md): block size 8, the target's last layers as a warm start,
# and soft targets (top-8 KL mixed with the hard labels), on 2 layers.
#
# One long `bastion train-drafter` run on all the distilled data, under cosine decay with
# warm restarts (cycles of RESTARTS, 2·RESTARTS, 4·RESTARTS, … steps after the warm-up): the
# schedule does not end at a fixed step, so rerunning the same command resumes the run from
# its last checkpoint and every further CPU-hour adds training (TOTAL only caps one call). It
# checkpoints every 100 steps and estimates the held-out τ (per domain) every EVAL steps and
# at every cycle's end (where the weights are best). The checkpoints and the feature cache
# live in ignored folders; a session's end loses at most 100 steps. Each call then redraws
# the curve: held-out τ against training CPU-hours (the process CPU time of the steps,
# held-out estimates and the feature build excluded) and epochs, as a figure and a table
# under OUT. The drafter of the best held-out τ so far is kept in RUN/best (bf16, with
# held_out.json): the one to ship when it beats the shipped drafter.
#
#   scripts/drafter-curve.sh                 # train until interrupted (or TOTAL), then plot
#   STOP=3100 scripts/drafter-curve.sh       # stop after step 3100 (a drafter is exported there)
#   PLOT_ONLY=1 scripts/drafter-curve.sh     # redraw the curve from the log so far
#   SEQS=4000 STOP=1100 scripts/drafter-curve.sh   # train on the first 4,000 sequences
#                                            # (their features only), then rerun with more
#   SEQS=2000 TOTAL=4000 RESTARTS= OUT=results/drafter-curve scripts/drafter-curve.sh
#                                            # the earlier run: 2,000 sequences, one cosine
#   INIT_FROM=drafters/smollm2-135m-instruct-dflash STOP=63100 scripts/drafter-curve.sh
#                                            # a run whose checkpoints are gone (another VM):
#                                            # go on from the shipped drafter's step (31,000)
#                                            # with its weights and a fresh optimiser state;
#                                            # later calls resume this run's checkpoints
#
# Needs the release binary, the model (scripts/fetch-model.sh) and the distilled data
# (scripts/distill-data.sh unpack). The target's features (and top-8) of the SEQS first
# sequences (default: all 17,542) are computed once into results/features/ (f16, 3.5 KB a
# token; resumable, shared with scripts/drafter-recipes.sh, whose runs read a prefix). Nothing
# else should run meanwhile if wall times matter; the CPU-hours are the process's own.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BASTION:-target/release/bastion}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
DATA=${DATA:-results/distill/smollm2-135m.jsonl}
FEATURES=${FEATURES:-results/features}
SEQS=${SEQS:-}
TOTAL=${TOTAL:-1000000}
RESTARTS=${RESTARTS-1000}
EVAL=${EVAL:-500}
OUT=${OUT:-results/drafter-curve/all-data}
RUN=${RUN:-$OUT/run}
RECIPE="--layers 2 --target-layers 2,15,27 --loss-decay 4 --learning-rate 4e-3 --warmup-steps 100 --sampled-vocab-scope step --block-size 8 --warm-start last --soft-targets 8 --soft-weight 0.5"

mkdir -p "$OUT"
# With restarts the schedule depends on neither TOTAL nor SEQS: a later call may train longer,
# and on more of the data (--grow: a run started on the first SEQS sequences, while the
# features of the rest were not built yet, goes on over all of them).
grow=()
if [ -n "$RESTARTS" ]; then
  stamp="MODEL=$MODEL DATA=$DATA RESTARTS=$RESTARTS EVAL=$EVAL $RECIPE"
  grow=(--grow)
else
  stamp="MODEL=$MODEL DATA=$DATA SEQS=$SEQS TOTAL=$TOTAL EVAL=$EVAL $RECIPE"
fi
limits=()
[ -n "$SEQS" ] && limits+=(--max-sequences "$SEQS")
[ -n "$RESTARTS" ] && limits+=(--restarts "$RESTARTS")
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
  # Used only while RUN has no checkpoint to resume.
  init=()
  [ -n "${INIT_FROM:-}" ] && init=(--init-from "$INIT_FROM")
  # shellcheck disable=SC2086 # the recipe is a list of arguments
  "$BIN" train-drafter --model "$MODEL" --data "$DATA" "${limits[@]}" --out "$RUN" \
    --mask-token 5 --steps "$TOTAL" --sampled-vocab 2048 --held-out 16 --held-out-per-domain 16 \
    --eval-every "$EVAL" --checkpoint-every 100 --seed 0 --feature-cache "$FEATURES" \
    --keep-best "$RUN/best" --save-dtype bf16 \
    "${resume[@]}" "${grow[@]}" "${stop[@]}" "${init[@]}" $RECIPE 2>>"$OUT/run.log" || echo "train-drafter stopped: $OUT/run.log" >&2
fi
# The log travels with the results (the weights do not).
cp "$RUN/training_log.jsonl" "$OUT/training_log.jsonl"
"$BIN" learning-curve --log "$OUT/training_log.jsonl" --out "$OUT/curve"
