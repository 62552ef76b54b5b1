#!/usr/bin/env python3
"""Bastion next to llama.cpp's own speculative decoding, on the same GGUF, the
same prompt token ids, the same threads, greedy, in one run.

llama.cpp (the prebuilt PyPI wheel xllamacpp 2026.10.11549 = build b11549, in
process; no build step): AR; DFlash (`draft-dflash`) with the Bastion drafter
exported by `bastion export-gguf` at each --n-max; the draftless `ngram-simple`
and `ngram-mod`. Bastion (`bastion generate`): AR in f32 and q8_0, and every
--methods entry in q8_0 with the full draft vocabulary and with the pruned one
(--draft-vocab). Per prompt the engines run in turn, so a drift of the
machine's speed hits all of them alike; one llama.cpp server is alive at a time
(started per prompt, with an untimed 4-token warm-up; Bastion loads per prompt too).

Decode rate: new tokens / decode seconds, prefill excluded, as each engine
reports it (llama.cpp: `predicted_n / predicted_ms`; Bastion: its summary's
tokens / decode seconds). τ: tokens per verification round, bonus included
(llama.cpp: (n - 1) / (n - 1 - accepted); Bastion: its summary). Outputs are
compared with llama.cpp AR's: whether a mode's output equals it (llama.cpp's
speculative modes must), and the tokens in common before they part (Bastion
computes in f32 or q8_0 activations, llama.cpp multiplies Q4_1 with 8-bit
activations, so greedy outputs may part on near-ties).

  BASTION=target/release/bastion python3 scripts/llamacpp-peers.py --out paper_tables/peers.md

Needs `pip install xllamacpp==2026.10.11549`, the default model
(scripts/fetch-model.sh) and a release build.
"""
import argparse
import json
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llamacpp_engine import BIN, Engine, bastion, common, prompts, tau  # noqa: E402

SUMMARY = re.compile(r"(\d+) tokens in (\d+) rounds, τ ([0-9.]+).*decode ([0-9.]+) s")


class Row:
    """One engine's settings and its per-prompt results."""

    def __init__(self, engine, mode, weights, run):
        self.engine, self.mode, self.weights, self.run = engine, mode, weights, run
        self.rate, self.tau, self.tokens = [], [], []

    def add(self, tokens, rate, tau_):
        self.tokens.append(tokens)
        self.rate.append(rate)
        self.tau.append(tau_)


def llama_row(model, mode, threads, drafter=None, n_max=None):
    label = f"{mode}, n_max {n_max}" if n_max else mode

    def run(ids, new_tokens):
        engine = Engine(model, mode, drafter=drafter, n_max=n_max, threads=threads)
        try:
            # An untimed warm-up on the prompt's first tokens (the system turn): a fresh
            # server's first graphs pay for allocation and for paging the weights in.
            engine.generate(ids[:16], 4)
            tokens, t = engine.generate(ids, new_tokens)
        finally:
            engine.close()
        rate = t["predicted_n"] / (t["predicted_ms"] / 1000)
        return tokens, rate, tau(t) if mode != "ar" else 1.0

    return Row("llama.cpp", label, "Q4_1 (8-bit activations)", run)


def bastion_row(model, method, dtype, threads, drafter=None, vocab=None):
    label = method + (f", draft vocab {vocab}" if vocab else "")

    def run(ids, new_tokens):
        args = ["generate", "--model", model, "--dtype", dtype, "--method", method,
                "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens", str(new_tokens)]
        if drafter and method != "ar":
            args += ["--drafter", drafter]
        if vocab:
            args += ["--draft-vocab", str(vocab)]
        out = bastion(*args)
        m = SUMMARY.search(out.stderr)
        if not m:
            sys.exit(f"no summary line in bastion's stderr:\n{out.stderr}")
        n, t, secs = int(m.group(1)), float(m.group(3)), float(m.group(4))
        return [int(x) for x in out.stdout.split()], n / secs, t

    return Row("Bastion", label, dtype, run)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--drafter", default="drafters/smollm2-135m-instruct-dflash")
    ap.add_argument("--sets", default="gsm8k,math500,humaneval,mt-bench")
    ap.add_argument("--prompts", type=int, default=2, help="prompts per set")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-max", default="3,7", help="llama.cpp DFlash draft lengths (at most the drafter's block size - 1)")
    ap.add_argument("--methods", default="dflash,ddtree:4,ddtree:8,ddtree:16,caddtree,bastion,bastion-online,"
                    "caddtree+skip,bastion+skip,bastion-online+skip")
    ap.add_argument("--draft-vocab", type=int, default=1024, help="the pruned draft vocabulary (0: none)")
    ap.add_argument("--out", help="write the Markdown table here (and a .tex beside it)")
    a = ap.parse_args()
    block = json.load(open(os.path.join(a.drafter, "config.json")))["block_size"]
    tmp = tempfile.mkdtemp(prefix="peers-")
    try:
        gguf = os.path.join(tmp, "drafter.gguf")
        bastion("export-gguf", "--drafter", a.drafter, "--target", a.model, "--out", gguf, "--dtype", "f32")
        n_max = [min(int(n), block - 1) for n in a.n_max.split(",")]
        rows = [llama_row(a.model, "ar", a.threads)]
        rows += [llama_row(a.model, "dflash", a.threads, drafter=gguf, n_max=n) for n in n_max]
        rows += [llama_row(a.model, m, a.threads) for m in ("ngram-simple", "ngram-mod")]
        rows += [bastion_row(a.model, "ar", d, a.threads) for d in ("f32", "q8_0")]
        for method in a.methods.split(","):
            rows.append(bastion_row(a.model, method, "q8_0", a.threads, drafter=a.drafter))
            if a.draft_vocab:
                rows.append(bastion_row(a.model, method, "q8_0", a.threads, drafter=a.drafter, vocab=a.draft_vocab))
        cases = prompts(a.model, a.sets.split(","), a.prompts)
        # One untimed warm-up of llama.cpp AR and Bastion AR.
        rows[0].run(cases[0][1]["ids"], 8)
        started = time.time()
        for i, (name, p) in enumerate(cases):
            for row in rows:
                row.add(*row.run(p["ids"], a.new_tokens))
            print(f"{i + 1}/{len(cases)} {name} {p['id']}: "
                  + ", ".join(f"{r.engine} {r.mode} {r.weights} {r.rate[-1]:.1f}" for r in rows[:3]) + " …",
                  file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    minutes = (time.time() - started) / 60
    base = statistics.mean(rows[0].rate)
    ref = rows[0].tokens

    def cells(r):
        rate = statistics.mean(r.rate)
        same = sum(o == x for o, x in zip(r.tokens, ref))
        shared = statistics.mean(common(o, x) for o, x in zip(r.tokens, ref))
        return [r.engine, r.mode, r.weights, f"{rate:.1f}", f"{rate / base:.2f}×",
                f"{statistics.mean(r.tau):.2f}", f"{same}/{len(ref)}", f"{shared:.0f}"]

    table = [cells(r) for r in rows]
    summary = ratios(rows, block - 1)
    cmd = (f"BASTION={BIN} python3 scripts/llamacpp-peers.py --sets {a.sets} --prompts {a.prompts} "
           f"--new-tokens {a.new_tokens} --n-max {a.n_max} --methods {a.methods} --draft-vocab {a.draft_vocab}")
    head = ["engine", "mode", "weights", "tok/s", "vs llama.cpp AR", "τ", "output = llama.cpp AR",
            "tokens shared with llama.cpp AR"]
    md = [
        "# Bastion and llama.cpp's speculative decoding, same GGUF, same prompts, one run",
        "",
        f"`{cmd}`, {time.strftime('%Y-%m-%d', time.gmtime())}, {cpu_model()} ({platform.machine()}), {a.threads} threads, "
        f"{minutes:.0f} min. Target `{a.model}`; drafter `{a.drafter}` (llama.cpp: exported with "
        "`bastion export-gguf`, f32). llama.cpp: xllamacpp 2026.10.11549 (build b11549, AVX2/FMA/F16C). "
        f"The first {a.prompts} prompts of each of {a.sets.replace(',', ', ')}, chat-templated token ids "
        f"(`bastion datasets show --model`), greedy, ≤ {a.new_tokens} new tokens; the engines take turns "
        "per prompt. tok/s: new tokens / decode seconds (prefill excluded), each engine's own count, mean "
        "over prompts; τ: tokens per verification round, bonus included (1 for AR, and for llama.cpp's "
        "n-gram modes when no draft is found). Shared tokens: the mean common prefix with llama.cpp AR's "
        "output (Bastion's f32 and q8_0 activations break near-ties differently from llama.cpp's 8-bit "
        "ones; at T = 0 every Bastion method equals Bastion AR, tested). A `+skip` row's τ counts the "
        "rounds that drafted (a skipped round is one AR step).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] * 3 + ["---:"] * 5) + "|",
        *["| " + " | ".join(c) + " |" for c in table],
        "",
        "Ratios of this run (decode rates, mean over prompts):",
        "",
        *[f"- {line}" for line in summary],
    ]
    report = "\n".join(md)
    print(report)
    if a.out:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        open(a.out, "w").write(report + "\n")
        tex = [
            "% " + cmd,
            "\\begin{tabular}{lllrrrrr}",
            "\\toprule",
            " & ".join(head).replace("τ", "$\\tau$") + " \\\\",
            "\\midrule",
            *[" & ".join(c).replace("×", "$\\times$").replace("_", "\\_") + " \\\\" for c in table],
            "\\bottomrule",
            "\\end{tabular}",
        ]
        open(os.path.splitext(a.out)[0] + ".tex", "w").write("\n".join(tex) + "\n")


def cpu_model():
    """The CPU's model name (`/proc/cpuinfo`), or "unknown CPU"."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def ratios(rows, chain):
    """The comparisons the table is for, as lines: Bastion q8_0 AR vs llama.cpp AR; the DFlash
    chains at the same draft length (same drafter); each engine's best speculative mode; the
    DFlash τ of the two engines (the export check)."""
    def rate(r):
        return statistics.mean(r.rate)

    def name(r):
        return r.mode + ("" if r.engine == "llama.cpp" else f" ({r.weights})")

    def find(engine, mode, weights=None):
        return next((r for r in rows if r.engine == engine and r.mode == mode
                     and (weights is None or r.weights == weights)), None)

    out = []
    l_ar, b_ar = find("llama.cpp", "ar"), find("Bastion", "ar", "q8_0")
    if l_ar and b_ar:
        out.append(f"Bastion q8_0 AR vs llama.cpp AR: {rate(b_ar):.1f} / {rate(l_ar):.1f} tok/s = "
                   f"{rate(b_ar) / rate(l_ar):.2f}×.")
    l_df, b_df = find("llama.cpp", f"dflash, n_max {chain}"), find("Bastion", "dflash", "q8_0")
    if l_df and b_df:
        out.append(f"DFlash chain, {chain} drafted tokens, same drafter: Bastion {rate(b_df):.1f} vs llama.cpp "
                   f"{rate(l_df):.1f} tok/s = {rate(b_df) / rate(l_df):.2f}×; τ {statistics.mean(b_df.tau):.2f} "
                   f"vs {statistics.mean(l_df.tau):.2f} (llama.cpp's "
                   f"{statistics.mean(l_df.tau) / statistics.mean(b_df.tau) - 1:+.1%}).")
    l_spec = [r for r in rows if r.engine == "llama.cpp" and r.mode != "ar"]
    b_spec = [r for r in rows if r.engine == "Bastion" and r.mode != "ar"]
    if l_spec and b_spec:
        lb, bb = max(l_spec, key=rate), max(b_spec, key=rate)
        out.append(f"Best speculative mode: Bastion's {name(bb)} {rate(bb):.1f} vs llama.cpp's {name(lb)} "
                   f"{rate(lb):.1f} tok/s = {rate(bb) / rate(lb):.2f}×.")
        if b_ar and l_ar:
            out.append(f"Against each engine's own AR: Bastion's best {rate(bb) / rate(b_ar):.2f}×, "
                       f"llama.cpp's best {rate(lb) / rate(l_ar):.2f}×.")
    return out


if __name__ == "__main__":
    main()
