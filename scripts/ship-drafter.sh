#!/usr/bin/env bash
# Ships a better drafter for the default model everywhere the harness uses it, in one run:
#
#   1. weights: SRC (a `train-drafter --keep-best` folder: config.json, model.safetensors,
#      held_out.json) replace DEST's, refused unless SRC's held-out τ beats DEST's by MIN_GAIN
#      (3 % by default; FORCE=1 ships anyway) on the same held-out records; the run's
#      training_log.jsonl goes along; the draft vocabulary is rewritten from the distilled data;
#   2. tau: chain τ on 32 prompts per set, q8_0 (`bastion tau`), written to DEST/tau.md;
#   3. calibration: `bastion profile` for q8_0 with the 1,024-token draft vocabulary (the default
#      table's setting) and for f32 (the f32 table's);
#   4. check: the `bastion check` baseline re-recorded with the dev build (CI's profile);
#   5. table: `bastion reproduce --update-reference` (the default table and its reference).
#
#   scripts/ship-drafter.sh results/drafter-curve/all-data/run/best
#   STEPS="tau table" scripts/ship-drafter.sh SRC     # only some steps (weights tau calibration check table)
#
# Steps 2–5 time things: run with nothing else on the machine (a running `train-drafter` is
# refused; ALLOW_BUSY=1 overrides). What stays by hand: the card's prose (DEST/README.md: step,
# CPU-hours, curve), the README's table and headline, `scripts/llamacpp-peers.py` for
# results/peers/ and `scripts/llamacpp-interop.py` for the export's τ in llama.cpp; the script
# prints them at the end. About 25 minutes on a 2-core VM (table 10, tau 8, calibration 4).
set -euo pipefail
cd "$(dirname "$0")/.."

SRC=${1:?usage: $0 SRC_DRAFTER_FOLDER (e.g. results/drafter-curve/all-data/run/best)}
DEST=${DEST:-drafters/smollm2-135m-instruct-dflash}
BIN=${BASTION:-target/release/bastion}
DEV_BIN=${DEV_BASTION:-target/debug/bastion}
DATA=${DATA:-results/distill/smollm2-135m.jsonl}
MIN_GAIN=${MIN_GAIN:-0.03}
STEPS=${STEPS:-weights tau calibration check table}
NAME=${NAME:-tau-drafter-$(date -u +%Y%m%d-%H%M)}

want() { [[ " $STEPS " == *" $1 "* ]]; }
say() { echo "== $*" >&2; }

if [ -z "${ALLOW_BUSY:-}" ] && pgrep -f "bastion.* train-drafter" >/dev/null; then
  echo "a train-drafter process is running: its load would distort every timing here;" \
    "pause it (kill -STOP) and set ALLOW_BUSY=1, or wait" >&2
  exit 1
fi
[ -x "$BIN" ] || { echo "no release binary at $BIN (cargo build --release -p bastion-cli)" >&2; exit 1; }

if want weights; then
  for f in config.json model.safetensors held_out.json; do
    [ -f "$SRC/$f" ] || { echo "$SRC/$f: missing (expected a train-drafter --keep-best folder)" >&2; exit 1; }
  done
  # Held-out τ of the candidate against the shipped drafter's, on the same held-out records.
  python3 - "$SRC/held_out.json" "$DEST/held_out.json" "$MIN_GAIN" "${FORCE:-}" <<'EOF'
import json, sys
new_path, old_path, min_gain, force = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
new = json.load(open(new_path))
try:
    old = json.load(open(old_path))
except FileNotFoundError:
    old = None
def field(d, path, key):
    if key not in d:
        sys.exit(f"{path}: field `{key}` missing (expected a train-drafter held_out.json)")
    return d[key]
tau_new = field(new, new_path, "held_out_tau")
if old is None:
    print(f"held-out τ {tau_new:.3f}; nothing shipped yet")
    sys.exit(0)
tau_old = field(old, old_path, "held_out_tau")
held_new = field(new, new_path, "data").split("; ")[-1]
held_old = field(old, old_path, "data").split("; ")[-1]
if held_new != held_old:
    sys.exit(f"{new_path} and {old_path} were estimated on other held-out records ({held_new} vs {held_old}): not comparable")
gain = tau_new / tau_old - 1
by = lambda d: " / ".join(f"{k} {v:.3f}" for k, v in sorted(d.get("held_out_tau_by_domain", {}).items()))
print(f"held-out τ {tau_old:.3f} → {tau_new:.3f} ({gain:+.1%}); by domain: {by(old)} → {by(new)}")
if gain < min_gain and not force:
    sys.exit(f"a gain of {gain:+.1%} is below {min_gain:.0%}: not shipped (FORCE=1 ships anyway)")
EOF
  say "weights: $SRC → $DEST"
  cp "$SRC/config.json" "$SRC/model.safetensors" "$SRC/held_out.json" "$DEST/"
  [ -f "$SRC/../training_log.jsonl" ] && cp "$SRC/../training_log.jsonl" "$DEST/training_log.jsonl"
  "$BIN" draft-vocab --data "$DATA" --drafter "$DEST"
fi

if want tau; then
  say "tau: chain τ, 32 prompts per set, q8_0 ($NAME)"
  "$BIN" tau --dtype q8_0 --drafter "$DEST" --name "$NAME"
  block=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["block_size"])' "$DEST/config.json")
  device=$(python3 -c 'import json, sys; print(json.loads(open(sys.argv[1]).readline())["device"])' "results/$NAME/runs.jsonl")
  {
    echo "# bastion tau with this drafter"
    echo
    echo "\`bastion tau --dtype q8_0 --drafter $DEST --name $NAME\` (32 prompts per set, 128 new" \
      "tokens, the DFlash chain of block $block), $(date -u +%Y-%m-%d), $device, release build," \
      "nothing else running. Written by the run as results/$NAME/$NAME.md."
    echo
    cat "results/$NAME/$NAME.md"
  } >"$DEST/tau.md"
fi

if want calibration; then
  say "calibration: q8_0 with the 1,024-token draft vocabulary, then f32"
  "$BIN" profile --dtype q8_0 --drafter "$DEST" --draft-vocab 1024
  "$BIN" profile --drafter "$DEST"
fi

if want check; then
  say "check: the baseline re-recorded with the dev build"
  cargo build --locked -p bastion-cli
  "$DEV_BIN" check --update
  "$DEV_BIN" check
fi

if want table; then
  say "table: bastion reproduce --update-reference"
  [ -d results/default ] && mv results/default "results/default.before-$(date -u +%Y%m%d-%H%M%S)"
  "$BIN" reproduce --update-reference
fi

cat >&2 <<EOF
== by hand, with the numbers above:
- $DEST/README.md (the card): step, CPU-hours, held-out τ per domain, the curve, tau.md's table;
- README.md: the default table's excerpt and the headline (paper_tables/default.md);
- results/peers/: scripts/llamacpp-peers.py (GSM8K and HumanEval), paper_tables/peers.md;
- the export in llama.cpp: scripts/llamacpp-interop.py --sets gsm8k,math500,humaneval,mt-bench --prompts 3 --new-tokens 96;
- git add $DEST paper_tables results/calibration results/baselines; review git diff; commit.
EOF
