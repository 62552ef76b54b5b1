#!/usr/bin/env python3
"""Bastion's autoregressive decoding next to llama.cpp's on the same GGUF.

Run through scripts/compare-llamacpp.sh, which installs llama-cpp-python.
Both engines get the same prompt token ids (the first GSM8K questions in the
SmolLM2 chat format, tokenised by llama.cpp), the same thread count and greedy
decoding; each stops at its end-of-sequence token or after --new-tokens.
Per prompt the engines alternate (llama.cpp, then Bastion in each dtype), so a
drift of the machine's speed hits all of them alike.

Decode rate = forward passes / decoding seconds, prefill excluded, for both
(one forward per token after the first, which the prefill yields): Bastion's
from its own `generate` summary (rounds, decode seconds), llama.cpp's timed
here around one `eval` per token (logits of the last position only) and the
host argmax.
"""
import argparse
import json
import platform
import re
import statistics
import subprocess
import sys
import time

import numpy as np
from llama_cpp import Llama, __version__ as llama_cpp_version

# SmolLM2-Instruct's chat format (ChatML with its default system message).
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chat(question):
    return (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
        f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    )


def last_logits(llm):
    """The logits of the last evaluated position (llama.cpp computes only
    that row; llama-cpp-python keeps it in the context, not in `scores`)."""
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))


def llama_decode(llm, prompt, new_tokens):
    """Greedy tokens and decoding seconds (prefill excluded)."""
    llm.reset()
    llm.eval(prompt)
    tok = int(np.argmax(last_logits(llm)))
    out = [tok]
    eos = llm.token_eos()
    start = time.perf_counter()
    while len(out) < new_tokens and tok != eos:
        llm.eval([tok])
        tok = int(np.argmax(last_logits(llm)))
        out.append(tok)
    secs = time.perf_counter() - start
    # The first token comes from the prefill's logits: len(out) - 1 decode steps.
    return out, secs, max(len(out) - 1, 1)


SUMMARY = re.compile(r"(\d+) tokens in (\d+) rounds.*decode ([0-9.]+) s")


def bastion_decode(args, dtype, prompt):
    cmd = [
        args.bastion, "generate", "--model", args.model, "--dtype", dtype,
        "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", str(args.new_tokens),
    ]
    env = {"RAYON_NUM_THREADS": str(args.threads), "PATH": "/usr/bin:/bin"}
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if run.returncode != 0:
        sys.exit(f"bastion failed ({' '.join(cmd[:6])} …):\n{run.stderr}")
    m = SUMMARY.search(run.stderr)
    if not m:
        sys.exit(f"no summary line in bastion's stderr:\n{run.stderr}")
    tokens = [int(t) for t in run.stdout.split()]
    # Forward passes per decoding second, as for llama.cpp: at AR one round
    # is one forward pass (the first token comes from the prefill).
    rounds, decode_s = int(m.group(2)), float(m.group(3))
    return tokens, rounds / decode_s


def agree(a, b):
    """Length of the common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bastion", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dataset", default="datasets/gsm8k.jsonl")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtypes", default="f32 bf16 f16")
    ap.add_argument("--command", default="scripts/compare-llamacpp.sh")
    args = ap.parse_args()
    dtypes = args.dtypes.split()

    llm = Llama(
        model_path=args.model, n_ctx=1024, n_batch=512, n_threads=args.threads,
        n_threads_batch=args.threads, verbose=False,
    )
    questions = []
    with open(args.dataset) as f:
        for line in f:
            questions.append(json.loads(line)["question"])
            if len(questions) == args.prompts:
                break

    llama_rate, llama_tokens = [], []
    rates = {d: [] for d in dtypes}
    tokens = {d: [] for d in dtypes}
    # One untimed warm-up of each engine on the first prompt.
    warm = llm.tokenize(chat(questions[0]).encode(), add_bos=False, special=True)
    llama_decode(llm, warm, 8)
    for q in questions:
        prompt = llm.tokenize(chat(q).encode(), add_bos=False, special=True)
        out, secs, steps = llama_decode(llm, prompt, args.new_tokens)
        llama_rate.append(steps / secs)
        llama_tokens.append(out)
        for d in dtypes:
            out, rate = bastion_decode(args, d, prompt)
            rates[d].append(rate)
            tokens[d].append(out)
        print(f"prompt {len(llama_rate)}: {len(prompt)} tokens; llama.cpp {llama_rate[-1]:.1f} tok/s; "
              + "; ".join(f"bastion {d} {rates[d][-1]:.1f} tok/s" for d in dtypes), file=sys.stderr)

    ref = tokens.get("f32")
    mean_llama = statistics.mean(llama_rate)
    lines = [
        "# Bastion AR against llama.cpp, same GGUF, same threads",
        "",
        f"`PROMPTS={args.prompts} NEW_TOKENS={args.new_tokens} THREADS={args.threads} DTYPES=\"{args.dtypes}\" {args.command}`, "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}, {platform.processor() or platform.machine()}, "
        f"llama-cpp-python {llama_cpp_version} (GGML_NATIVE=OFF, AVX2/FMA/F16C), model `{args.model}`.",
        f"The first {args.prompts} GSM8K questions in SmolLM2's chat format, greedy, ≤ {args.new_tokens} new tokens; "
        "decode rate = forward passes (one per token after the first) / decoding seconds, prefill excluded, the same count for both engines; mean over prompts; the engines alternate per prompt.",
        "",
        "| engine | weights | decode tok/s (per prompt) | mean | vs llama.cpp | greedy tokens equal to Bastion f32 (common prefix / length) |",
        "|---|---|---|---:|---:|---|",
    ]

    def agreement(outs):
        if ref is None:
            return "—"
        return ", ".join(f"{agree(o, r)}/{len(r)}" for o, r in zip(outs, ref))

    lines.append(
        f"| llama.cpp | file's Q4_1 blocks (Q8 activations) | {', '.join(f'{r:.1f}' for r in llama_rate)} | "
        f"{mean_llama:.1f} | 1.00× | {agreement(llama_tokens)} |"
    )
    for d in dtypes:
        mean = statistics.mean(rates[d])
        lines.append(
            f"| Bastion (flex) | {d} | {', '.join(f'{r:.1f}' for r in rates[d])} | {mean:.1f} | "
            f"{mean / mean_llama:.2f}× | {agreement(tokens[d])} |"
        )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
