#!/usr/bin/env python3
"""A Bastion drafter in llama.cpp: acceptance of the same drafter, exported with
`bastion export-gguf`, drafting in llama.cpp's DFlash mode against drafting in
Bastion, on the same prompt token ids.

For each prompt (the first --prompts of each --sets, chat-templated by
`bastion datasets show --model`): llama.cpp (xllamacpp, b11549) with
`--spec-type draft-dflash`, n_max = block size - 1 (the whole block, as Bastion's
DFlash chain drafts), greedy; Bastion `generate --method dflash` with the GGUF
drafter. τ = tokens per verification round, bonus included, for both. A negative
control exports the drafter with its target layers in reverse order: llama.cpp then
feeds each slice of the drafter's input projection the features of another layer,
and its τ must fall. (Layers off by one, the mistake of writing z-lab's ids without
llama.cpp's + 1, cost only about 1.5 % τ on SmolLM2: neighbouring layers of the
residual stream are too alike for a clear control.)

  BASTION=target/release/bastion python3 scripts/llamacpp-interop.py [--out FILE.md]

Exits non-zero when llama.cpp's τ is not within --tolerance (relative) of
Bastion's, or the negative control is not below it by at least that much.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llamacpp_engine import BIN, Engine, bastion, common, prompts, tau  # noqa: E402


def export(drafter, model, out, reverse=False):
    """The drafter as a dflash GGUF; with `reverse` its target layer ids in
    reverse order (the negative control)."""
    os.makedirs(os.path.dirname(out), exist_ok=True)
    src = drafter
    if reverse:
        src = out + ".src"
        shutil.copytree(drafter, src)
        path = os.path.join(src, "config.json")
        cfg = json.load(open(path))
        ids = cfg["dflash_config"]["target_layer_ids"]
        cfg["dflash_config"]["target_layer_ids"] = ids[::-1]
        json.dump(cfg, open(path, "w"))
    bastion("export-gguf", "--drafter", src, "--target", model, "--out", out, "--dtype", "f32")
    vocab = os.path.join(drafter, "draft_vocab.json")
    if os.path.exists(vocab):
        shutil.copy(vocab, os.path.join(os.path.dirname(out), "draft_vocab.json"))
    return out


def bastion_tau(model, drafter, ids, new_tokens):
    out = bastion("generate", "--model", model, "--drafter", drafter, "--method", "dflash",
                  "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens", str(new_tokens))
    tokens = [int(t) for t in out.stdout.split()]
    tail = out.stderr.split("τ ")[1]
    return float(tail.split(",")[0]), tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--drafter", default="drafters/smollm2-135m-instruct-dflash")
    ap.add_argument("--sets", default="gsm8k,humaneval")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per set")
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--out", help="also write the Markdown report here")
    a = ap.parse_args()
    block = json.load(open(os.path.join(a.drafter, "config.json")))["block_size"]
    tmp = tempfile.mkdtemp(prefix="interop-")
    try:
        right = export(a.drafter, a.model, os.path.join(tmp, "drafter.gguf"))
        wrong = export(a.drafter, a.model, os.path.join(tmp, "reversed", "drafter.gguf"), reverse=True)
        cases = prompts(a.model, a.sets.split(","), a.prompts)
        # One llama.cpp server at a time: an idle second server in the same process
        # competes for the 2 cores.
        engines = {
            "llama.cpp": right,
            "llama.cpp, layers reversed": wrong,
        }
        taus = {k: [] for k in ["bastion", *engines]}
        rows, outputs = [], []
        for name, p in cases:
            b_tau, b_tokens = bastion_tau(a.model, right, p["ids"], a.new_tokens)
            taus["bastion"].append(b_tau)
            rows.append([f"{name} {p['id']}", f"{b_tau:.2f}"])
            outputs.append(b_tokens)
        for label, drafter in engines.items():
            engine = Engine(a.model, "dflash", drafter=drafter, n_max=block - 1, threads=a.threads)
            for (name, p), row, b_tokens in zip(cases, rows, outputs):
                tokens, timings = engine.generate(p["ids"], a.new_tokens)
                t = tau(timings)
                taus[label].append(t)
                row += [f"{t:.2f}", str(common(tokens, b_tokens))]
            engine.close()
        for row in rows:
            print(" | ".join(row), file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    mean = {k: statistics.mean(v) for k, v in taus.items()}
    rel = mean["llama.cpp"] / mean["bastion"] - 1
    drop = 1 - mean["llama.cpp, layers reversed"] / mean["llama.cpp"]
    ok = abs(rel) <= a.tolerance and drop >= a.tolerance
    lines = [
        "# A Bastion drafter drafting in llama.cpp",
        "",
        f"`BASTION={BIN} python3 scripts/llamacpp-interop.py --sets {a.sets} --prompts {a.prompts} "
        f"--new-tokens {a.new_tokens}`: drafter `{a.drafter}` exported with `bastion export-gguf` (f32), "
        f"target `{a.model}`, greedy, {a.new_tokens} new tokens, {a.threads} threads. llama.cpp: xllamacpp "
        f"(b11549), `draft-dflash`, n_max = {block - 1} (the whole block); Bastion: `generate --method dflash` "
        "with the same GGUF drafter, on the same prompt ids (`bastion datasets show --model`). τ: tokens per "
        "verification round, bonus included. The control writes the target layers in reverse order, so each "
        "slice of the drafter's input projection gets another layer's features. Same: the tokens llama.cpp's output "
        "shares with Bastion's before they part (llama.cpp multiplies Q4_1 weights with 8-bit activations, "
        "Bastion in f32, so greedy outputs may part on near-ties).",
        "",
        "| prompt | Bastion τ | llama.cpp τ | same | control τ | same |",
        "|---|---:|---:|---:|---:|---:|",
        *[f"| {' | '.join(r)} |" for r in rows],
        f"| **mean** | **{mean['bastion']:.3f}** | **{mean['llama.cpp']:.3f}** | | "
        f"**{mean['llama.cpp, layers reversed']:.3f}** | |",
        "",
        f"llama.cpp / Bastion τ: {1 + rel:.3f} (within ±{a.tolerance:.0%}: {'yes' if abs(rel) <= a.tolerance else 'no'}); "
        f"the control's τ {drop:.1%} below llama.cpp's (at least {a.tolerance:.0%}: {'yes' if drop >= a.tolerance else 'no'}).",
    ]
    report = "\n".join(lines)
    print(report)
    if a.out:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        open(a.out, "w").write(report + "\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
