#!/usr/bin/env bash
# Drafter recipe comparison on a fixed budget: the same
# distilled sequences, the same steps and seed for every variant; one
# `bastion train-drafter` run per variant, its held-out τ every EVAL steps
# (DFlash chain, T = 0, block 16 unless a variant sets --block-size, on the first HELD_OUT sequences, never
# trained on). Prints a Markdown table; with OUT=FILE also writes it.
#
#   scripts/drafter-recipes.sh                      # 2000 sequences, 600 steps, all variants
#   SEQS=40 STEPS=4 EVAL=2 VARIANTS="base layers2" scripts/drafter-recipes.sh   # smoke run
#
# Equal CPU time instead of equal steps: BUDGET=SECONDS gives every variant
# that many seconds of training steps. A PILOT-step run (default 20) of the
# variant measures its seconds per step (the median 10-step interval of the
# pilot's log), and the variant then runs BUDGET / that many steps, its
# schedule (warm-up, cosine decay) spread over them (PILOT_ONLY=1: measure
# every variant's pilot, then stop). With PER_DOMAIN=N the
# first N sequences of each training domain are held out too, and the table
# gives the final held-out τ per domain (math word problems, competition
# math, code, chat). The levers of the drafter-data work:
#
#   BUDGET=1800 PER_DOMAIN=16 VARIANTS="today warm block8 soft today-l3" scripts/drafter-recipes.sh
#
# Needs a release build, the default model and distilled data
# (`bastion distill`). Target features are computed once per set of target
# layers into FEATURES (f16, reused across variants and reruns; a file built
# with the target's top-k for `soft` serves the other variants too). The build
# is the long part on a fresh machine: about 180 target tokens/s on 2 cores
# (f32 target, top-8 kept), so SEQS=2000 (0.53 M tokens, 1.8 GB) takes about
# an hour and SEQS=8000 four. A pilot stops before its last step, so it skips
# the held-out estimate that ends a run (about 3 minutes).
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
BUDGET=${BUDGET:-}
PILOT=${PILOT:-20}
PER_DOMAIN=${PER_DOMAIN:-0}

# The median 10-step interval of a training log, in seconds per step.
seconds_per_step() {
  python3 -c '
import json, statistics, sys
t = [json.loads(l) for l in open(sys.argv[1])]
t = [(r["step"], r["seconds"]) for r in t if "seconds" in r and "loss_ema" in r]
d = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(t, t[1:]) if b[0] > a[0]]
w = [r["step_seconds"]["wall"] for r in map(json.loads, open(sys.argv[1])) if "step_seconds" in r]
print(f"{statistics.median(d):.3f}" if d else (f"{statistics.median(w):.3f}" if w else "–"))' "$1"
}

# name | arguments that differ from the base recipe (the first shipped drafter's: 1 layer, block 16)
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
  # The shipped drafter's recipe and one lever each.
  [today]="--layers 2 --target-layers 2,15,27 --loss-decay 4 --learning-rate 4e-3 --warmup-steps 100 --sampled-vocab-scope step"
  [warm]="--layers 2 --target-layers 2,15,27 --loss-decay 4 --learning-rate 4e-3 --warmup-steps 100 --sampled-vocab-scope step --warm-start last"
  [block8]="--layers 2 --target-layers 2,15,27 --loss-decay 4 --learning-rate 4e-3 --warmup-steps 100 --sampled-vocab-scope step --block-size 8"
  [soft]="--layers 2 --target-layers 2,15,27 --loss-decay 4 --learning-rate 4e-3 --warmup-steps 100 --sampled-vocab-scope step --soft-targets 8 --soft-weight 0.5"
  [today-l3]="--layers 3 --target-layers 2,15,27 --loss-decay 4 --learning-rate 4e-3 --warmup-steps 100 --sampled-vocab-scope step"
  # The curve's recipe (scripts/drafter-curve.sh: the shipped drafter's) and its capacity lever,
  # a third layer (warm-started from the target's last three), at equal CPU time on all the data:
  #   BUDGET=1800 PILOT=40 PER_DOMAIN=16 SEQS=17542 EVAL=100000 VARIANTS="curve curve-l3" \
  #     OUT=results/drafter-capacity.md scripts/drafter-recipes.sh
  # judged by held-out τ and by the draft time it costs a round (`bastion profile`'s T_d).
  [curve]="--layers 2 --target-layers 2,15,27 --loss-decay 4 --learning-rate 4e-3 --warmup-steps 100 --sampled-vocab-scope step --block-size 8 --warm-start last --soft-targets 8 --soft-weight 0.5"
  [curve-l3]="--layers 3 --target-layers 2,15,27 --loss-decay 4 --learning-rate 4e-3 --warmup-steps 100 --sampled-vocab-scope step --block-size 8 --warm-start last --soft-targets 8 --soft-weight 0.5"
)
VARIANTS=${VARIANTS:-"base norm-target layers2 step-vocab anchors8 decay4 layers2-decay4-step lr4e-3 layers3 targets-late l2-d4-step-lr4e-3 l3-d4-step-lr4e-3 layers2-step uniform lr1e-3 targets5"}

# Pilots time steps that read the feature file at random: read it once first, so that
# no pilot (the first above all) times a cold page cache.
if [ -n "$BUDGET" ]; then
  cat "$FEATURES"/*.f16 >/dev/null 2>&1 || true
fi

rows=()
for name in $VARIANTS; do
  args=${RECIPE[$name]:?unknown variant $name}
  out="$RUNS/$name"
  mkdir -p "$RUNS"
  block=(--block-size 16)
  [[ "$args" == *--block-size* ]] && block=()
  held=(--held-out "$HELD_OUT")
  [ "$PER_DOMAIN" -gt 0 ] && held+=(--held-out-per-domain "$PER_DOMAIN")
  steps=$STEPS
  if [ -n "$BUDGET" ]; then
    # Equal CPU time: a pilot run measures this variant's seconds per step (kept, so a
    # rerun takes the same number of steps).
    pilot="$RUNS/$name.pilot"
    if [ ! -s "$pilot.sps" ]; then
      rm -rf "$pilot"
      # --stop-after: the pilot ends before its last step, so it skips the held-out estimate
      # that ends a run (minutes); its steps cost what the variant's will.
      # shellcheck disable=SC2086 # the recipe is a list of arguments
      "$BIN" train-drafter --model "$MODEL" --data "$DATA" --max-sequences "$SEQS" --out "$pilot" \
        --mask-token 5 "${block[@]}" --steps $((PILOT * 100)) --stop-after "$PILOT" --sampled-vocab 2048 "${held[@]}" --eval-every 0 \
        --checkpoint-every 0 --seed 0 --feature-cache "$FEATURES" $args 2>>"$pilot.log" \
        || { echo "pilot of $name failed: $pilot.log" >&2; exit 1; }
      seconds_per_step "$pilot/training_log.jsonl" >"$pilot.sps"
      rm -rf "$pilot"
    fi
    steps=$(python3 -c "import sys; print(max(1, int(float(sys.argv[1]) / float(sys.argv[2]))))" "$BUDGET" "$(cat "$pilot.sps")")
    # PILOT_ONLY=1 measures every variant's pilot first (on a quiet machine), training nothing.
    if [ -n "${PILOT_ONLY:-}" ]; then
      echo "$name: $(cat "$pilot.sps") s / step → $steps steps" >&2
      continue
    fi
  fi
  # A variant finished with these settings by an earlier (interrupted) run is
  # reused: the script resumes across sessions. Its log and stamp are committed
  # (the weights are not), so a fresh clone skips it too.
  stamp="MODEL=$MODEL SEQS=$SEQS STEPS=$steps EVAL=$EVAL HELD_OUT=$HELD_OUT DATA=$DATA $args"
  [ -n "$BUDGET" ] && stamp="$stamp BUDGET=$BUDGET"
  [ "$PER_DOMAIN" -gt 0 ] && stamp="$stamp PER_DOMAIN=$PER_DOMAIN"
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
      --mask-token 5 "${block[@]}" --steps "$steps" \
      --sampled-vocab 2048 "${held[@]}" --eval-every "$EVAL" --checkpoint-every 100 \
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
  per_step=$(seconds_per_step "$out/training_log.jsonl")
  if [ -n "$BUDGET" ]; then
    # The last held-out estimate, overall and per domain.
    domains=$(python3 -c '
import json, sys
h = [r for r in map(json.loads, open(sys.argv[1])) if "held_out_tau" in r][-1]
d = h.get("held_out_tau_by_domain", {})
tau = h["held_out_tau"]
print(" | ".join([f"{tau:.3f}"] + [f"{d[k]:.3f}" if k in d else "–" for k in ("math", "competition", "code", "chat")]))' "$out/training_log.jsonl")
    rows+=("| $name | \`$args\` | $steps | $(cat "$RUNS/$name.pilot.sps") | $per_step | $domains | $secs | ${load:-–} |")
  else
    rows+=("| $name | \`$args\` | $taus | $per_step | $secs | ${load:-–} |")
  fi
  echo "$name: held-out τ $taus (${secs} s)" >&2
done

[ -n "${PILOT_ONLY:-}" ] && exit 0

if [ -n "$BUDGET" ]; then
  table=$(
    echo "# Drafter recipes at equal CPU time"
    echo
    echo "\`BUDGET=$BUDGET PILOT=$PILOT PER_DOMAIN=$PER_DOMAIN SEQS=$SEQS EVAL=$EVAL HELD_OUT=$HELD_OUT VARIANTS=\"$VARIANTS\" scripts/drafter-recipes.sh\`,"
    echo "$(date -u +%Y-%m-%d), $(nproc) threads, release build. Every variant: the first $SEQS distilled sequences of"
    echo "\`$DATA\`, the first $HELD_OUT and the first $PER_DOMAIN of each domain held out; $BUDGET s of training steps"
    echo "(steps = $BUDGET / the s / step of a $PILOT-step pilot run), 16 sequences × 4 anchors per step, block 16 unless"
    echo "the variant says otherwise, sampled softmax (+2048), seed 0. Held-out τ: DFlash chain at T = 0 with the"
    echo "variant's own block size, at the last step; per domain: math word problems (GSM8K train), competition math,"
    echo "code, chat. seconds: the whole run, held-out estimates and, on first use, the target's features included."
    echo "pilot s / step: the pilot's (nothing else running), which sets the steps; run s / step: the run's own"
    echo "median, high where the run shared the CPU (load: the 15-minute load average at its end, above 2 on"
    echo "2 cores); a variant's held-out τ depends only on its steps, not on how long they took."
    echo
    echo "| variant | recipe | steps | pilot s / step | run s / step | held-out τ | math | competition | code | chat | seconds | load |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    printf '%s\n' "${rows[@]}"
  )
else
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
fi
echo "$table"
if [ -n "${OUT:-}" ]; then
  mkdir -p "$(dirname "$OUT")"
  echo "$table" >"$OUT"
fi
