#!/usr/bin/env bash
# The cost of verifying N tokens against an AR step, for two release binaries
# (an old and a new build of Bastion) measured in one run: `bastion
# bench-target` with the same settings, the binaries alternating (old, new,
# then new, old, …) so that drift of a shared machine falls on both. Prints,
# per binary, the median over ROUNDS runs of verify(N) (ms) and of
# verify(N) / verify(1) (verify(1) is exactly an AR decode step), and the
# paired new / old ratio of verify(N).
#
#   scripts/verify-cost.sh OLD_BINARY NEW_BINARY > results/kernels/verify-cost-….md
#   ROUNDS=4 DTYPE=q8_0 NODES=1,2,3,4,5,8,9,16 CONTEXT=256 scripts/verify-cost.sh old new
#
# Needs the default model (scripts/fetch-model.sh). Run with nothing else on
# the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=${1:?usage: $0 OLD_BINARY NEW_BINARY}
NEW=${2:?usage: $0 OLD_BINARY NEW_BINARY}
ROUNDS=${ROUNDS:-4}
DTYPE=${DTYPE:-q8_0}
NODES=${NODES:-1,2,3,4,5,8,9,16}
CONTEXT=${CONTEXT:-256}
REPS=${REPS:-9}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
case ",$NODES," in *,1,*) ;; *) echo "NODES must include 1 (the AR step the ratios divide by)" >&2; exit 2 ;; esac
case "$CONTEXT" in *[!0-9]*) echo "CONTEXT is one context length (tokens), not a list" >&2; exit 2 ;; esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for r in $(seq 1 "$ROUNDS"); do
  order=(old new)
  [ $((r % 2)) = 0 ] && order=(new old)
  for which in "${order[@]}"; do
    bin=$OLD
    [ "$which" = new ] && bin=$NEW
    echo "== round $r, $which" >&2
    "$bin" bench-target --model "$MODEL" --dtype "$DTYPE" --nodes "$NODES" --context "$CONTEXT" \
      --reps "$REPS" >"$tmp/$which-$r.txt"
  done
done

python3 - "$tmp" "$OLD" "$NEW" "$ROUNDS" "$DTYPE" "$NODES" "$CONTEXT" "$REPS" <<'PY'
import re, statistics, sys
from pathlib import Path
tmp, old, new, rounds, dtype, nodes, context, reps = sys.argv[1:]
rounds = int(rounds)
def parse(path):
    out = {}
    for line in open(path):
        m = re.match(r"\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s", line)
        if m:
            out[int(m.group(1))] = float(m.group(2))
    return out
runs = {w: [parse(Path(tmp) / f"{w}-{r}.txt") for r in range(1, rounds + 1)] for w in ("old", "new")}
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown CPU")
print(f"Old `{old}`, new `{new}`: `bastion bench-target --dtype {dtype} --nodes {nodes} --context {context} --reps {reps}`,")
print(f"{rounds} rounds, binaries alternating; {cpu}. Medians over the rounds; paired: the median over rounds")
print("of new / old within a round (min–max in brackets). verify(1) is an AR decode step.")
print()
print("| N | old verify ms | old / AR | new verify ms | new / AR | paired new / old |")
print("| ---: | ---: | ---: | ---: | ---: | ---: |")
for n in sorted(runs["old"][0]):
    cols = []
    for w in ("old", "new"):
        t = [r[n] for r in runs[w]]
        rel = [r[n] / r[1] for r in runs[w]]
        cols += [f"{statistics.median(t):.2f}", f"{statistics.median(rel):.3f}"]
    p = [b[n] / a[n] for a, b in zip(runs["old"], runs["new"])]
    print(f"| {n} | {' | '.join(cols)} | {statistics.median(p):.3f} [{min(p):.3f}–{max(p):.3f}] |")
print()
print("Each run (verify ms):")
print()
ns = sorted(runs["old"][0])
print("| round | binary | " + " | ".join(f"N={n}" for n in ns) + " |")
print("| ---: | --- | " + " | ".join("---:" for _ in ns) + " |")
for r in range(rounds):
    for w in ("old", "new"):
        print(f"| {r + 1} | {w} | " + " | ".join(f"{runs[w][r][n]:.2f}" for n in ns) + " |")
PY
