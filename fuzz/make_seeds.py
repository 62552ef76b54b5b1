#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/seed-*)
from files in the repository: the GGUF and safetensors fixtures, every
config.json, the datasets' first records, the experiment files, and chat
templates (SmolLM2's, read from models/ when the GGUF is there, and a few
written for this project). Run from the repository root; libFuzzer grows and
`cargo fuzz cmin` minimises the corpora from these."""
import json
import pathlib
import struct

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"


def put(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / f"seed-{name}").write_bytes(data if isinstance(data, bytes) else data.encode())


def gguf_chat_template(path):
    """tokenizer.chat_template of a GGUF file (metadata only)."""
    b = path.read_bytes()
    pos = 4 + 4
    n_tensors, n_kv = struct.unpack_from("<QQ", b, pos)
    pos += 16

    def string():
        nonlocal pos
        (n,) = struct.unpack_from("<Q", b, pos)
        s = b[pos + 8 : pos + 8 + n]
        pos += 8 + n
        return s.decode()

    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip(ty):
        nonlocal pos
        if ty == 8:
            return string()
        if ty == 9:
            (inner,) = struct.unpack_from("<I", b, pos)
            (n,) = struct.unpack_from("<Q", b, pos + 4)
            pos += 12
            for _ in range(n):
                skip(inner)
            return None
        pos += sizes[ty]
        return None

    for _ in range(n_kv):
        key = string()
        (ty,) = struct.unpack_from("<I", b, pos)
        pos += 4
        v = skip(ty)
        if key == "tokenizer.chat_template":
            return v
    return None


def safetensors(tensors):
    """A safetensors file of (name, dtype, shape, raw bytes)."""
    header, data = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def main():
    # GGUF: the quantisation fixtures (every supported block type, a SmolLM2-shaped mix).
    for f in sorted((ROOT / "tests/fixtures/gguf-quants").glob("*.gguf")):
        put("gguf", f.stem, f.read_bytes())
    # safetensors: small files of each dtype, and shard indexes.
    put("safetensors", "f32", safetensors([("a.weight", "F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4))]))
    put("safetensors", "bf16-f16", safetensors([("b", "BF16", [3], b"\x80\x3f" * 3), ("h", "F16", [1, 2], b"\x00\x3c" * 2)]))
    put("safetensors", "i64", safetensors([("ids", "I64", [2], struct.pack("<2q", 7, 9))]))
    put("safetensors", "index", json.dumps({"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    # config.json: every one in the repository.
    for i, f in enumerate(sorted(list(ROOT.glob("tests/fixtures/*/config.json")) + list(ROOT.glob("drafters/*/config.json")) + list(ROOT.glob("experiments/shapes/*.json")))):
        put("hf_config", f"{i}-{f.parent.name}", f.read_bytes())
    # Datasets: the first byte picks the set (DatasetName::ALL order), then three records.
    sets = ["gsm8k", "math500", "aime25", "humaneval", "mbpp", "mt-bench", "alpaca"]
    for i, s in enumerate(sets):
        lines = (ROOT / "datasets" / f"{s}.jsonl").read_text().splitlines()[:3]
        put("dataset_jsonl", s, bytes([i]) + "\n".join(lines).encode())
    # Experiment files.
    for f in sorted((ROOT / "experiments").glob("*.toml")):
        put("experiment_toml", f.stem, f.read_bytes())
    # Chat templates.
    gguf = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if gguf.exists():
        put("chat_template", "smollm2", gguf_chat_template(gguf))
    put("chat_template", "plain", "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    put("chat_template", "namespace", "{{ bos_token }}{% set ns = namespace(sys='') %}{% for m in messages %}{% if m.role == 'system' %}{% set ns.sys = m.content %}{% continue %}{% endif %}{% if loop.first and ns.sys %}[SYS]{{ ns.sys }}[/SYS]{% endif %}{{ m.role.upper() }}: {{ m.content.strip() }}{% if m.role == 'assistant' %}{{ eos_token }}{% endif %}\n{% endfor %}")
    put("chat_template", "raise", "{% for m in messages %}{% if m.role not in ['user', 'assistant', 'system'] %}{{ raise_exception('bad role ' ~ m.role) }}{% endif %}{% if m.content.startswith('<') %}{{ m.content.split('>')[-1] }}{% else %}{{ m.content }}{% endif %}{% endfor %}{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}")


if __name__ == "__main__":
    main()
