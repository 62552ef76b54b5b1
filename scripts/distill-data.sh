#!/usr/bin/env bash
# The distilled training data travels with the repository, xz-compressed
# (hours of CPU to redo; about 1 MB per 1 M response tokens):
#
#   scripts/distill-data.sh unpack   # results/distill/smollm2-135m.jsonl from its .xz
#   scripts/distill-data.sh pack     # its complete records into the .xz (to commit)
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
  *) echo "usage: $0 pack|unpack" >&2; exit 2 ;;
esac
