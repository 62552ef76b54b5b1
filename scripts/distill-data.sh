#!/usr/bin/env bash
# The distilled training data travels with the repository, xz-compressed
# (hours of CPU to redo; about 1 MB per 1 M response tokens):
#
#   scripts/distill-data.sh unpack   # results/distill/smollm2-135m.jsonl from its .xz
#   scripts/distill-data.sh pack     # its complete records into the .xz (to commit)
#   scripts/distill-data.sh interleave   # records reordered so that every prefix mixes the
#                                        # training domains in the whole file's proportions
#
# Interleaving keeps each domain's own order (so the first N sequences of a domain, which
# train-drafter holds out, stay the same) and spreads every domain evenly over the file: a
# recipe comparison on the first N sequences (`--max-sequences`) then trains on every domain,
# and the target features of those N are a prefix of the whole file's.
#
# `bastion distill` resumes the unpacked file (same command, more prompts);
# `unpack` never replaces a local file that already holds at least as many
# records. FILE=... names another data file.
set -euo pipefail
cd "$(dirname "$0")/.."
FILE=${FILE:-results/distill/smollm2-135m.jsonl}
case "${1:-}" in
  pack)
    # Complete lines only: a distillation still appending may have a torn last one.
    n=$(wc -l <"$FILE")
    head -n "$n" "$FILE" | xz -9 -T1 >"$FILE.xz.tmp"
    mv "$FILE.xz.tmp" "$FILE.xz"
    echo "$FILE.xz: $n records, $(wc -c <"$FILE.xz") bytes" ;;
  unpack)
    packed=$(xz -dc "$FILE.xz" | wc -l)
    if [ -f "$FILE" ] && [ "$(wc -l <"$FILE")" -ge "$packed" ]; then
      echo "$FILE already holds $(wc -l <"$FILE") records (the .xz has $packed): kept"
    else
      xz -dc "$FILE.xz" >"$FILE.tmp"
      mv "$FILE.tmp" "$FILE"
      echo "$FILE: $packed records"
    fi ;;
  interleave)
    python3 - "$FILE" <<'PY'
import json, sys
path = sys.argv[1]
# The training domains by id prefix (bastion_data::train_domain).
domain = {"gsm8k-train": "math", "math-self": "competition", "mbpp-train": "code", "code-self": "code"}
lines = [l for l in open(path) if l.endswith("\n")]
by = {}
for l in lines:
    by.setdefault(domain.get(json.loads(l)["id"].split(":")[0], "chat"), []).append(l)
order = ["math", "competition", "code", "chat"]
# Record i of a domain of n records sits at (i + 0.5) / n of the file.
keyed = [((i + 0.5) / len(ls), order.index(d), l) for d, ls in by.items() for i, l in enumerate(ls)]
keyed.sort(key=lambda k: (k[0], k[1]))
with open(path + ".tmp", "w") as out:
    out.writelines(k[2] for k in keyed)
print(f"{path}: {len(keyed)} records interleaved ({', '.join(f'{d} {len(by.get(d, []))}' for d in order)})")
PY
    mv "$FILE.tmp" "$FILE" ;;
  *) echo "usage: $0 pack|unpack|interleave" >&2; exit 2 ;;
esac
