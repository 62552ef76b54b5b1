#!/usr/bin/env bash
# Fuzzes one or more targets of fuzz/ (cargo-fuzz, libFuzzer, nightly) for
# SECONDS each, one after another, with the limits the hardening issue sets:
# no input may take over 10 s (a hang) or allocate over 1 GiB. New inputs go
# to fuzz/corpus/<target>/ (run `cargo +nightly fuzz cmin TARGET` before
# committing it); a crash leaves fuzz/artifacts/<target>/ and fails the run.
# Usage: scripts/fuzz.sh SECONDS TARGET...   (targets: gguf safetensors
# hf_config chat_template dataset_jsonl experiment_toml)
# Install once: cargo install cargo-fuzz
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs="${1:?usage: scripts/fuzz.sh SECONDS TARGET...}"
shift
for t in "$@"; do
  features=()
  [ "$t" = experiment_toml ] && features=(--features experiment)
  echo "== $t: ${secs} s"
  log="target/fuzz-$t.log"
  mkdir -p target
  status=0
  cargo +nightly fuzz run "${features[@]}" -O "$t" -- \
    -max_total_time="$secs" -timeout=10 -rss_limit_mb=1024 -malloc_limit_mb=1024 -print_final_stats=1 \
    >"$log" 2>&1 || status=$?
  grep -E '^(#[0-9]+ +DONE|stat::(number_of_executed_units|peak_rss_mb|new_units_added)|SUMMARY)|panicked|deadly signal|Timeout|out-of-memory' "$log" || true
  [ "$status" -eq 0 ] || { echo "$t: a finding (exit $status): fuzz/artifacts/$t/, log fuzz/$log" >&2; exit 1; }
done
