"""llama.cpp in process, through the prebuilt PyPI wheel `xllamacpp` (llama.cpp's
server behind a Python API; no build step): greedy generation from token ids,
autoregressive or with one of llama.cpp's speculative modes.

Used by scripts/llamacpp-interop.py (a Bastion drafter exported with
`bastion export-gguf`, drafting in llama.cpp) and the peer comparison.
Install: pip install xllamacpp==2026.10.11549 (llama.cpp build b11549).
"""
import contextlib
import json
import os
import subprocess
import sys

import xllamacpp as xl

SPEC_TYPES = {
    "ar": None,
    "dflash": "COMMON_SPECULATIVE_TYPE_DRAFT_DFLASH",
    "ngram-simple": "COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE",
    "ngram-mod": "COMMON_SPECULATIVE_TYPE_NGRAM_MOD",
}


@contextlib.contextmanager
def _quiet():
    """llama.cpp logs every request to stderr; keep it for errors only."""
    if os.environ.get("LLAMACPP_VERBOSE"):
        yield
        return
    saved = os.dup(2)
    with open(os.devnull, "wb") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


class Engine:
    """One llama.cpp server for `model` (a GGUF): `mode` is a key of SPEC_TYPES;
    `drafter` (a dflash GGUF) and `n_max` (draft tokens per round) for dflash.

    Keep one server alive at a time (`close()` the last one first): llama.cpp's
    worker threads busy-wait between graphs, and an idle second server in the same
    process starves the one generating on a 2-core machine (CI's interop step,
    two servers at once, did not end within CI's time limit)."""

    def __init__(self, model, mode="ar", drafter=None, n_max=None, threads=2, n_ctx=2048):
        if mode not in SPEC_TYPES:
            raise ValueError(f"unknown llama.cpp mode {mode!r}: expected one of {', '.join(SPEC_TYPES)}")
        if mode == "dflash" and not drafter:
            raise ValueError("llama.cpp's dflash mode needs a drafter GGUF (bastion export-gguf)")
        p = xl.CommonParams()
        p.model.path = str(model)
        p.n_ctx = n_ctx
        p.n_parallel = 1
        for cpu in (p.cpuparams, p.cpuparams_batch, p.speculative.draft.cpuparams,
                    p.speculative.draft.cpuparams_batch):
            cpu.n_threads = threads
        p.warmup = False
        p.sampling.temp = 0.0
        if SPEC_TYPES[mode]:
            p.speculative.types = [getattr(xl.common_speculative_type, SPEC_TYPES[mode])]
            if n_max is not None:
                p.speculative.draft.n_max = n_max
            if drafter:
                p.speculative.draft.mparams.path = str(drafter)
        self.mode, self.n_max = mode, n_max
        with _quiet():
            self.server = xl.Server(p)

    def close(self):
        """Stop the server and free its model (its threads end with it)."""
        self.server = None

    def generate(self, ids, new_tokens):
        """Greedy continuation of the prompt `ids`: (tokens, timings). timings:
        llama.cpp's own (`predicted_n`, `predicted_ms`, `predicted_per_second`, and
        for speculative modes `draft_n`, `draft_n_accepted`)."""
        req = {
            "prompt": [int(i) for i in ids],
            "n_predict": int(new_tokens),
            "temperature": 0.0,
            "top_k": 1,
            "cache_prompt": False,
            "ignore_eos": False,
            # The OpenAI-style reply carries token ids only with the log-probabilities (of the
            # chosen token; the draft and acceptance are the same with or without them).
            "logprobs": 1,
        }
        with _quiet():
            out = self.server.handle_completions(req)
        if "error" in out:
            raise RuntimeError(f"llama.cpp: {out['error']}")
        content = (out["choices"][0].get("logprobs") or {}).get("content") or []
        return [int(t["id"]) for t in content], out["timings"]


def tau(timings):
    """Tokens per verification round, bonus token included (Bastion's τ): every
    round of a speculative mode commits its accepted draft tokens and one token
    of the target; the first token comes from the prompt's forward."""
    accepted = timings.get("draft_n_accepted", 0)
    rounds = timings["predicted_n"] - 1 - accepted
    return (rounds + accepted) / rounds if rounds > 0 else float("nan")


# The Bastion side of the comparisons: its CLI, run as a subprocess.
BIN = os.environ.get("BASTION", "target/release/bastion")


def bastion(*args):
    """Runs `bastion ARGS`; exits with its stderr when it fails."""
    out = subprocess.run([BIN, *args], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"bastion {' '.join(args[:8])} … failed:\n{out.stderr}")
    return out


def prompts(model, sets, n):
    """The first `n` prompts of each set as (set, record with the chat-templated
    `ids` a sweep gives the target), from `bastion datasets show --model`."""
    found = []
    for name in sets:
        out = bastion("datasets", "show", name, "--max-samples", str(n), "--model", model)
        found += [(name, json.loads(line)) for line in out.stdout.splitlines()]
    return found


def common(a, b):
    """Tokens two outputs share before they part."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
