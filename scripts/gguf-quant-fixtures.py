#!/usr/bin/env python3
"""Writes the GGUF quantisation fixtures in tests/fixtures/gguf-quants/.

Golden values come from the `gguf` PyPI package's own de-quantisation
(`gguf.quants.dequantize`), not from Bastion. The package cannot quantise the
K-quant types, so the blocks are seeded random bytes whose f16 scale fields are
set to finite values of a realistic size; every bit pattern of the quant fields
is legal, so random bytes exercise every code path.

  python3 -m venv /tmp/gguf-venv && /tmp/gguf-venv/bin/pip install gguf==0.17.1 numpy
  /tmp/gguf-venv/bin/python scripts/gguf-quant-fixtures.py

Writes
- quants.gguf + quants.json: one [2, 512] tensor per type and its golden
  values, and a [4, 256] Q8_0 tensor quantised by the package from seeded
  normal weights (real Q8_0 blocks: largest |q| per block 127);
- mix.gguf + mix.json: a tiny Llama in the SmolLM2 layout (hidden 256, one
  layer) whose matrices each use a different type, as published K-quant mixes
  do, and per tensor the golden sum and sum of squares (float64).
"""
import json
import pathlib

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests/fixtures/gguf-quants"

# Byte offsets of each type's f16 scale fields inside a block (ggml-common.h).
SCALE_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}


def random_blocks(rng, qtype, rows, cols):
    """Seeded random blocks for a [rows, cols] tensor, shaped [rows, bytes per row]."""
    block, size = GGML_QUANT_SIZES[qtype]
    n = rows * cols // block
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    for off in SCALE_FIELDS[qtype]:
        scale = rng.uniform(1e-3, 2e-2, size=n).astype(np.float16)
        raw[:, off : off + 2] = scale.view(np.uint8).reshape(n, 2)
    return raw.reshape(rows, cols // block * size)


def golden(raw, qtype, rows, cols):
    return dequantize(raw, qtype).astype(np.float32).reshape(rows, cols)


def quants(rng):
    writer = GGUFWriter(str(OUT / "quants.gguf"), "llama")
    values = {}
    for qtype in SCALE_FIELDS:
        raw = random_blocks(rng, qtype, 2, 512)
        writer.add_tensor(qtype.name, raw, raw_shape=raw.shape, raw_dtype=qtype)
        values[qtype.name] = {
            "ggml_type": int(qtype),
            "shape": [2, 512],
            "values": [float(v) for v in golden(raw, qtype, 2, 512).ravel()],
        }
    # Q8_0 as a quantiser writes it (largest |q| per block is 127), from
    # seeded normal weights: Bastion's q8_0 weights must keep these blocks.
    w = np.random.default_rng(8).standard_normal((4, 256)).astype(np.float32) * 0.05
    raw = quantize(w, T.Q8_0)
    writer.add_tensor("Q8_0_quantised", raw, raw_shape=raw.shape, raw_dtype=T.Q8_0)
    values["Q8_0_quantised"] = {
        "ggml_type": int(T.Q8_0),
        "shape": [4, 256],
        "values": [float(v) for v in golden(raw, T.Q8_0, 4, 256).ravel()],
    }
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (OUT / "quants.json").write_text(json.dumps(values) + "\n")


def mix(rng):
    hidden, ffn, heads, kv_heads, vocab = 256, 512, 4, 2, 32
    head_dim = hidden // heads
    writer = GGUFWriter(str(OUT / "mix.gguf"), "llama")
    writer.add_block_count(1)
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(100000.0)
    writer.add_vocab_size(vocab)
    matrices = [
        ("token_embd.weight", T.Q8_0, vocab, hidden),
        ("output.weight", T.Q6_K, vocab, hidden),
        ("blk.0.attn_q.weight", T.Q4_K, heads * head_dim, hidden),
        ("blk.0.attn_k.weight", T.Q5_K, kv_heads * head_dim, hidden),
        ("blk.0.attn_v.weight", T.Q6_K, kv_heads * head_dim, hidden),
        ("blk.0.attn_output.weight", T.Q3_K, hidden, heads * head_dim),
        ("blk.0.ffn_gate.weight", T.Q2_K, ffn, hidden),
        ("blk.0.ffn_up.weight", T.Q5_0, ffn, hidden),
        ("blk.0.ffn_down.weight", T.Q5_1, hidden, ffn),
    ]
    sums = {}
    for name, qtype, rows, cols in matrices:
        raw = random_blocks(rng, qtype, rows, cols)
        writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
        g = golden(raw, qtype, rows, cols).astype(np.float64)
        sums[name] = {"ggml_type": qtype.name, "shape": [rows, cols], "sum": float(g.sum()), "sum_sq": float((g * g).sum())}
    for name in ["blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight"]:
        writer.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (OUT / "mix.json").write_text(json.dumps(sums, indent=1) + "\n")


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20261201)
    quants(rng)
    mix(rng)


if __name__ == "__main__":
    main()
