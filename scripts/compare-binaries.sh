#!/usr/bin/env bash
# Two release binaries (an old and a new build of Bastion) measured in one
# run: `bastion tau` with the same settings, the binaries alternating
# (old, new, then new, old, …) so that drift of a shared machine falls on
# both. For each setting it prints AR's TPOT and the method's speedup over
# AR for each binary (medians over ROUNDS runs) and new / old ratios, and the
# method's draft and verification time per round.
#
#   scripts/compare-binaries.sh OLD_BINARY NEW_BINARY > results/…/compare.md
#   ROUNDS=3 SAMPLES=4 scripts/compare-binaries.sh old new
#
# Settings (SETTINGS, `;`-separated `dtype method`): by default q8_0
# ddtree:2 and f32 ddtree:4 on GSM8K; EXTRA adds `bastion tau` options
# to every run (e.g. EXTRA="--draft-vocab 1024", the default table's
# setting). Needs the default model
# (scripts/fetch-model.sh) and its drafter. Run with nothing else on the
# machine.
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=${1:?usage: $0 OLD_BINARY NEW_BINARY}
NEW=${2:?usage: $0 OLD_BINARY NEW_BINARY}
ROUNDS=${ROUNDS:-3}
SAMPLES=${SAMPLES:-4}
SETS=${SETS:-gsm8k}
SETTINGS=${SETTINGS:-q8_0 ddtree:2;f32 ddtree:4}
EXTRA=${EXTRA:-}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
DRAFTER=${DRAFTER:-drafters/smollm2-135m-instruct-dflash}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

IFS=';' read -ra settings <<<"$SETTINGS"
for r in $(seq 1 "$ROUNDS"); do
  order=(old new)
  [ $((r % 2)) = 0 ] && order=(new old)
  for s in "${settings[@]}"; do
    read -r dtype method <<<"$s"
    for which in "${order[@]}"; do
      bin=$OLD
      [ "$which" = new ] && bin=$NEW
      dir="$tmp/$which/${dtype}-${method//:/-}/$r"
      echo "== round $r, $which, $dtype $method" >&2
      # shellcheck disable=SC2086 # EXTRA holds several options
      "$bin" tau --model "$MODEL" --drafter "$DRAFTER" --dtype "$dtype" --method "$method" \
        --sets "$SETS" --samples "$SAMPLES" --results "$dir" --name run $EXTRA >/dev/null
    done
  done
done

python3 - "$tmp" "$OLD" "$NEW" "$ROUNDS" "$SAMPLES" "$SETS" "$EXTRA" <<'EOF'
import json, statistics, sys
from pathlib import Path
tmp, old, new, rounds, samples, sets, extra = sys.argv[1:]
extra = f" {extra}" if extra else ""
print(f"Old `{old}`, new `{new}`: `bastion tau --sets {sets} --samples {samples}{extra}`, {rounds} rounds, binaries alternating.")
print("TPOT: decode seconds per new token, mean over the samples; speedup: AR's mean TPOT / the method's; medians over the rounds.")
print()
print("Paired: the median over rounds of new / old within a round (the two binaries ran back to back, so")
print("drift between rounds cancels); min–max over the rounds in brackets.")
print()
print("| dtype | method | AR TPOT old ms | AR TPOT new ms | new/old | paired AR new/old | speedup old | speedup new | new/old | paired speedup new/old |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
settings = sorted({p.name for p in (Path(tmp) / "old").iterdir()})
runs = []
for setting in settings:
    res, per = {}, {}
    for which in ("old", "new"):
        ar, sp = [], []
        for run in sorted((Path(tmp) / which / setting).iterdir()):
            recs = [json.loads(l) for l in open(run / "run" / "samples.jsonl")]
            by, rounds = {}, []
            for rec in recs:
                by.setdefault(rec["method"], []).append(rec["tpot_s"])
                if rec["method"] != "ar":
                    rounds += rec.get("rounds", [])
            a = statistics.mean(by.pop("ar"))
            (m, t), = by.items()
            ar.append(a)
            sp.append(a / statistics.mean(t))
            # The method's mean draft and verification time per round (all its rounds).
            draft = statistics.mean(r["draft_s"] for r in rounds) if rounds else float("nan")
            verify = statistics.mean(r["verify_s"] for r in rounds) if rounds else float("nan")
            runs.append((setting, which, run.name, a, statistics.mean(t), draft, verify))
        res[which] = (statistics.median(ar), statistics.median(sp))
        per[which] = (ar, sp)
    dtype, method = setting.split("-", 1)
    (ao, so), (an, sn) = res["old"], res["new"]
    def paired(i):
        r = [n / o for n, o in zip(per["new"][i], per["old"][i])]
        return f"{statistics.median(r):.3f} [{min(r):.3f}–{max(r):.3f}]"
    print(f"| {dtype} | {method.replace('-', ':', 1)} | {ao*1e3:.2f} | {an*1e3:.2f} | {an/ao:.3f} | {paired(0)} | {so:.3f}× | {sn:.3f}× | {sn/so:.3f} | {paired(1)} |")
print()
print("The method's round: draft and verification ms per round (mean over its rounds), medians over the rounds.")
print()
print("| dtype | method | draft old ms | draft new ms | new/old | verify old ms | verify new ms | new/old |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for setting in settings:
    dtype, method = setting.split("-", 1)
    med = lambda which, i: statistics.median(x[i] for x in runs if x[0] == setting and x[1] == which)
    do, dn, vo, vn = med("old", 5), med("new", 5), med("old", 6), med("new", 6)
    print(f"| {dtype} | {method.replace('-', ':', 1)} | {do*1e3:.3f} | {dn*1e3:.3f} | {dn/do:.3f} | {vo*1e3:.2f} | {vn*1e3:.2f} | {vn/vo:.3f} |")
print()
print("Each run:")
print()
print("| setting | round | binary | AR TPOT ms | method TPOT ms | draft ms / round | verify ms / round |")
print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
for setting, which, r, a, m, d, v in sorted(runs, key=lambda x: (x[0], int(x[2]), x[1])):
    print(f"| {setting} | {r} | {which} | {a*1e3:.2f} | {m*1e3:.2f} | {d*1e3:.3f} | {v*1e3:.2f} |")
EOF
