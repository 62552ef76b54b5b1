#!/usr/bin/env bash
# The GPU check: what Bastion's verification costs on this
# machine's GPU, for models of SmolLM2-135M's and Qwen3-8B's shape with weights
# drawn in memory (seeded; no model download, nothing written but results).
#
#   scripts/gpu-check.sh            # full: SmolLM2 + Qwen3-8B shapes, N = 1 … 256 (its bench stage sized for
#                                   # a 6-minute call: scripts/gpu-carry.py)
#   scripts/gpu-check.sh --small    # rehearsal on lavapipe: SmolLM2 shape only, N ≤ 64, context 512,
#                                   # one timed run; the sweep stage on one GSM8K prompt, 8 tokens
#
# Made for a GPU machine without Rust or network: it runs a prebuilt release
# binary (BASTION=path, default target/release/bastion, built with
# `cargo build --release -p bastion-cli --features wgpu` on another machine)
# on the wgpu backend (Vulkan: the NVIDIA driver's ICD, or Mesa's lavapipe).
# For each shape it times verification of N = 1 … 256 tokens at contexts 512
# and 2048 with the tree-attention kernel and with the dense mask, f16 weights
# (`bastion bench-target`). When models/ holds the SmolLM2 GGUF and drafters/
# its drafter, it also calibrates the pair on this GPU and runs the default
# sweep (experiments/gpu-check.toml: the four default sets, every method), the
# calibration and the sweep together limited to SWEEP_SECONDS (default 300; the sweep resumes
# when rerun). Then the anchor users run today, PyTorch + transformers on the
# same GPU (scripts/torch-anchor.py: the AR step of both shapes, random bf16
# weights made on the GPU, eager and with a static cache), when python3 has
# them. Everything goes under OUT/<device>/ (default results/gpu/), with a
# summary.md, also when a step fails or is stopped part-way.
#
# The lent machines take at most 64 MiB per call, the working tree included,
# and keep what a call leaves only while warm (30 s): scripts/gpu-carry.py
# packs the binary, the Vulkan loader and the GGUF into calls that fit and
# writes the calls to make (.gpu/PLAN.md), each stage of this script in the
# call that completes what it needs (STAGES).
#
#   STAGES=bench,anchor   # only these stages (default bench,sweep,anchor); a later call's
#                         # summary.md includes an earlier call's files in the same OUT
#
# On an NVIDIA machine without a Vulkan loader, bring Debian's libvulkan1
# and libglvnd0 (the driver's ICD, libGLX_nvidia.so.0, needs libGLdispatch:
# without it the loader finds the ICD but "Could not get vkCreateInstance")
# and point VK_DRIVER_FILES at the driver's nvidia_icd.json.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BASTION:-target/release/bastion}
BACKEND=${BACKEND:-wgpu}
OUT=${OUT:-results/gpu}
DTYPE=${DTYPE:-f16}
SMALL=0
[ "${1:-}" = "--small" ] && SMALL=1
STAGES=${STAGES:-bench,sweep,anchor}
stage() { [[ ",$STAGES," == *",$1,"* ]]; }
# The NVIDIA driver's Vulkan ICD, where the image keeps it (the loader does not look there).
for icd in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json; do
  # VK_DRIVER_FILES for loaders from 1.3.207, VK_ICD_FILENAMES for older ones.
  if [ -z "${VK_DRIVER_FILES:-}${VK_ICD_FILENAMES:-}" ] && [ -f "$icd" ]; then export VK_DRIVER_FILES=$icd VK_ICD_FILENAMES=$icd; fi
done
[ -x "$BIN" ] || { echo "$BIN missing: build it with cargo build --release -p bastion-cli --features wgpu" >&2; exit 1; }

if [ "$SMALL" = 1 ]; then
  # lavapipe runs a SmolLM2-sized verification in seconds: few points, one timed run each.
  SHAPES=(smollm2-135m)
  NODES=1,8,64
  CONTEXTS=512
  WARMUP=1
  REPS=1
  # lavapipe allocates buffers of at most 128 MiB.
  PEAK=(--peak-stream 16777216)
else
  SHAPES=(smollm2-135m qwen3-8b)
  # Up to 256, the sizes the GPU must-shows read; 512 and 1024 (where the H200's cost began
  # to grow) would take device time a 15-minute session lacks.
  NODES=1,2,4,8,16,32,64,128,256
  CONTEXTS=512,2048
  WARMUP=3
  REPS=5
  PEAK=()
fi

start=$(date +%s)
SWEEP_SECONDS=${SWEEP_SECONDS:-300}
device=""
dir=""
sweep="not reached"

# summary.md from whatever ran: called on every exit, a failed or stopped step included.
summary() {
  [ -n "$dir" ] || return 0
  local secs=$(( $(date +%s) - start ))
  {
    echo "# GPU check: $device"
    echo
    echo "\`scripts/gpu-check.sh$([ "$SMALL" = 1 ] && echo ' --small')\`, $(date -u +%Y-%m-%d), backend $BACKEND, weights $DTYPE, $secs s in all."
    echo "Random-weight models of the shapes in \`experiments/shapes/\` (seed 0); verification latency per tree size N"
    echo "(median of $REPS after $WARMUP warm-ups) at contexts $CONTEXTS, with the tree-attention kernel and with the dense mask."
    case "$BACKEND/$DTYPE" in flex/*) ;; */f16|*/bf16) echo "On $BACKEND, $DTYPE weights are $DTYPE device tensors multiplied in $DTYPE with f32 accumulation where the adapter has the type (each profile's header line says \"stored as f32 tensors\" where it has not)." ;; */q8_0) echo "On $BACKEND, q8_0 weights are f32 device tensors of the de-quantised values." ;; esac
    echo
    for shape in "${SHAPES[@]}"; do
      echo "## $shape"
      echo
      if [ -s "$dir/bench-$shape.txt" ]; then
        echo '```'
        cat "$dir/bench-$shape.txt"
        echo '```'
      else
        echo "not measured: the check stopped before it"
      fi
      echo
    done
    echo "## Default sweep ($([ "$SMALL" = 1 ] && echo 'rehearsal: one GSM8K prompt, 8 tokens' || echo 'four sets, 4 prompts each'))"
    echo
    echo "$sweep"
    echo
    echo "## PyTorch anchor (AR step, transformers, same GPU)"
    echo
    if [ -s "$dir/torch-anchor.md" ]; then cat "$dir/torch-anchor.md"; else echo "not reached"; fi
  } >"$dir/summary.md"
  echo "wrote $dir/summary.md ($secs s)" >&2
}
trap summary EXIT

# The anchor: PyTorch's AR step of the same shapes on the same GPU (skipped, with a line
# saying why, where python3 lacks torch or a GPU; --small rehearses it on the CPU). It runs
# after the first (short) shape's bench and before the long one, so that a call cut at its
# time limit still has it.
anchor() {
  if [ "$SMALL" = 1 ]; then
    python3 scripts/torch-anchor.py --device cpu --dtype float32 --context 64 --new 4 --reps 1 \
      experiments/shapes/smollm2-135m.json >"$dir/torch-anchor.md" 2>"$dir/torch-anchor.log" || echo "torch anchor FAILED (torch-anchor.log)" >>"$dir/torch-anchor.md"
  else
    python3 scripts/torch-anchor.py experiments/shapes/qwen3-8b.json experiments/shapes/smollm2-135m.json \
      >"$dir/torch-anchor.md" 2>"$dir/torch-anchor.log" || echo "torch anchor FAILED (torch-anchor.log)" >>"$dir/torch-anchor.md"
  fi
  cat "$dir/torch-anchor.md" >&2
}

# The device's name comes from the first benchmark's header line; without the bench stage,
# from the one device folder an earlier call left in OUT, else from a one-point bench.
device_of() { sed -n '1s/.*| device \([^|]*\) |.*/\1/p' "$1" | tr 'A-Z' 'a-z' | tr -cs 'a-z0-9' '-' | sed 's/^-//; s/-$//'; }
if ! stage bench; then
  earlier=("$OUT"/*/)
  if [ "${#earlier[@]}" = 1 ] && [ -d "${earlier[0]}" ]; then
    dir=${earlier[0]%/}
    device=$(basename "$dir")
  else
    probe=$(mktemp)
    "$BIN" bench-target --model "experiments/shapes/smollm2-135m.json" --random-weights 0 --backend "$BACKEND" \
      --dtype "$DTYPE" --context 64 --nodes 1 --warmup 0 --reps 1 "${PEAK[@]}" >"$probe" || true
    device=$(device_of "$probe")
    rm -f "$probe"
    dir="$OUT/${device:-unknown-device}"
  fi
  mkdir -p "$dir"
  SHAPES_RUN=()
else
  SHAPES_RUN=("${SHAPES[@]}")
fi
# Each shape's tables go straight to their file once the device is known (the first shape's
# through a temporary file), so a bench cut short keeps the lines it printed.
for shape in "${SHAPES_RUN[@]}"; do
  echo "== $shape: verify latency, $DTYPE, contexts $CONTEXTS, N = $NODES, kernel and dense" >&2
  bench=("$BIN" bench-target --model "experiments/shapes/$shape.json" --random-weights 0 --backend "$BACKEND"
    --dtype "$DTYPE" --context "$CONTEXTS" --nodes "$NODES" --warmup "$WARMUP" --reps "$REPS" --attention kernel,dense "${PEAK[@]}")
  if [ -z "$dir" ]; then
    tmp_bench=$(mktemp)
    "${bench[@]}" >"$tmp_bench"
    device=$(device_of "$tmp_bench")
    dir="$OUT/${device:-unknown-device}"
    mkdir -p "$dir"
    mv "$tmp_bench" "$dir/bench-$shape.txt"
    cat "$dir/bench-$shape.txt" >&2
    if stage anchor; then anchor; fi
  else
    "${bench[@]}" | tee "$dir/bench-$shape.txt" >&2
  fi
done
if [ "${#SHAPES_RUN[@]}" = 0 ] && stage anchor; then anchor; fi

GGUF=models/SmolLM2-135M-Instruct.Q4_1.gguf
DRAFTER=drafters/smollm2-135m-instruct-dflash
EXPERIMENT=experiments/gpu-check.toml
PROFILE=(--contexts 256,1024 --tokens 1,2,4,8,16,32,64,128 --repeats 3)
if [ "$SMALL" = 1 ]; then
  # The same stages at rehearsal size: a calibration of few points, one GSM8K prompt, 8 tokens.
  EXPERIMENT=experiments/gpu-check-small.toml
  PROFILE=(--contexts 64 --tokens 1,2,4,8 --repeats 1 --warmup 1 "${PEAK[@]}")
fi
if ! stage sweep; then
  sweep="not run in this call (STAGES=$STAGES)"
  [ -s "$dir/sweep-summary.md" ] && sweep=$(cat "$dir/sweep-summary.md")
elif [ "$BACKEND/$DTYPE" != wgpu/f16 ]; then
  sweep="skipped: experiments/gpu-check.toml runs wgpu with f16 weights (this check ran $BACKEND, $DTYPE)"
elif [ ! -f "$GGUF" ] || [ ! -d "$DRAFTER" ]; then
  sweep="skipped: $GGUF or $DRAFTER is missing"
else
  echo "== SmolLM2 + drafter: calibration and $EXPERIMENT" >&2
  # A failure here still leaves the summary of what did run.
  deadline=$(( $(date +%s) + SWEEP_SECONDS ))
  left() { echo $(( deadline - $(date +%s) > 1 ? deadline - $(date +%s) : 1 )); }
  rc=0
  timeout "$(left)" "$BIN" profile --model "$GGUF" --drafter "$DRAFTER" --backend wgpu --dtype f16 \
    "${PROFILE[@]}" >"$dir/profile.txt" 2>&1 &&
    timeout "$(left)" "$BIN" run "$EXPERIMENT" --results "$dir/runs" --tables "$dir/tables" --count-launches >"$dir/sweep.txt" 2>&1 ||
    rc=$?
  case $rc in
    0) sweep="\`$EXPERIMENT\`: tables in \`tables/\`, records in \`runs/\`, calibration in \`profile.txt\`; $(grep -h 'GPU kernels:' "$dir/sweep.txt" || echo 'no kernel count')"
       for t in "$dir"/tables/*.md; do [ -f "$t" ] && sweep="$sweep"$'\n\n'"$(cat "$t")"; done ;;
    124) sweep="stopped after $SWEEP_SECONDS s (SWEEP_SECONDS): records so far in \`runs/\`, see profile.txt and sweep.txt; rerun to resume" ;;
    *) sweep="FAILED (exit $rc): see profile.txt and sweep.txt" ;;
  esac
  cp results/calibration/"$device"__*__wgpu__f16.json "$dir/" 2>/dev/null || true
  printf '%s\n' "$sweep" >"$dir/sweep-summary.md"
fi
