#!/usr/bin/env bash
# Bastion's autoregressive decode rate next to llama.cpp's:
# the same GGUF, the same prompt token ids, the same thread count, greedy, in
# one run (the engines alternate per prompt). Prints a Markdown table; with
# OUT=FILE also writes it.
#
#   scripts/compare-llamacpp.sh
#   PROMPTS=4 NEW_TOKENS=128 THREADS=2 DTYPES="f32 bf16" OUT=results/kernels/x.md scripts/compare-llamacpp.sh
#
# Installs llama-cpp-python from PyPI into VENV on first use (a source build,
# ~10 min on 2 cores) with GGML_NATIVE=OFF: these VMs advertise AVX-512, which
# faults, so the build targets AVX2/FMA/F16C explicitly. Needs a release build
# of Bastion and the default model (scripts/fetch-model.sh). Stop other work
# first: the numbers are rates.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BASTION:-target/release/bastion}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
PROMPTS=${PROMPTS:-4}
NEW_TOKENS=${NEW_TOKENS:-128}
THREADS=${THREADS:-2}
DTYPES=${DTYPES:-"f32 bf16 f16"}
VENV=${VENV:-/var/tmp/bastion-llamacpp-venv}
LLAMA_CPP_PYTHON=${LLAMA_CPP_PYTHON:-0.3.16}

[ -x "$BIN" ] || { echo "$BIN missing: cargo build --release -p bastion-cli" >&2; exit 1; }
[ -f "$MODEL" ] || { echo "$MODEL missing: scripts/fetch-model.sh" >&2; exit 1; }
if ! "$VENV/bin/python" -c "import llama_cpp, numpy" 2>/dev/null; then
  echo "installing llama-cpp-python $LLAMA_CPP_PYTHON into $VENV (source build)" >&2
  python3 -m venv "$VENV"
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_OPENMP=ON" \
    "$VENV/bin/pip" install --quiet "llama-cpp-python==$LLAMA_CPP_PYTHON" numpy
fi

table=$(OMP_NUM_THREADS=$THREADS "$VENV/bin/python" scripts/compare-llamacpp.py --bastion "$BIN" --model "$MODEL" \
  --prompts "$PROMPTS" --new-tokens "$NEW_TOKENS" --threads "$THREADS" --dtypes "$DTYPES")
echo "$table"
if [ -n "${OUT:-}" ]; then
  mkdir -p "$(dirname "$OUT")"
  echo "$table" >"$OUT"
fi
