#!/usr/bin/env python3
"""The anchor users run today: the AR step of a Hugging Face transformers model
on the same GPU as Bastion's check, for the shapes Bastion measures.

For each config in experiments/shapes/ given on the command line, builds the
model from its config with random weights made on the device (bf16 by
default, seeded; no download, no host copy of the weights), prefills a
context of CONTEXT random tokens and times greedy generation with
`model.generate` in two settings: eager with the default dynamic cache, and
with a static cache (`cache_implementation="static"`, no torch.compile). The
AR step (TPOT) is the time of generating NEW + 1 tokens minus that of
generating 1 (the prefill and the first token), over NEW, median of REPS.
Prints one Markdown table; scripts/gpu-check.sh calls it and puts the table
in its summary.

    python3 scripts/torch-anchor.py experiments/shapes/qwen3-8b.json experiments/shapes/smollm2-135m.json
    python3 scripts/torch-anchor.py --device cpu --dtype float32 --new 4 --reps 1 experiments/shapes/smollm2-135m.json

Needs torch and transformers (the GPU machines have PyTorch 2.11 and
transformers 5.17). Exits 0 with a line saying why when they are missing.
"""

import argparse
import json
import statistics
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("configs", nargs="+", help="Hugging Face config.json files (experiments/shapes/)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--context", type=int, default=512, help="prompt tokens before the timed steps")
    ap.add_argument("--new", type=int, default=64, help="tokens generated per timed run")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    try:
        import torch
        import transformers
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError as e:
        print(f"torch anchor skipped: {e}")
        return 0
    dtype = getattr(torch, args.dtype)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("torch anchor skipped: no CUDA device")
        return 0

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"PyTorch {torch.__version__}, transformers {transformers.__version__}, {name}, {args.dtype}, "
          f"context {args.context}, {args.new} new tokens, median of {args.reps}")
    print()
    print("| shape | parameters | weights GB | setting | AR step ms | tokens/s |")
    print("|---|---:|---:|---|---:|---:|")
    for path in args.configs:
        with open(path) as f:
            raw = json.load(f)
        cfg = AutoConfig.for_model(raw["model_type"], **{k: v for k, v in raw.items() if k != "model_type"})
        torch.manual_seed(args.seed)
        with torch.device(device):
            # `dtype` is transformers 5's name for it (`torch_dtype` before); checked below either way.
            try:
                model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
            except TypeError:
                model = AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype)
        model.eval()
        got = next(model.parameters()).dtype
        if got != dtype:
            model = model.to(dtype)
        assert next(model.parameters()).dtype == dtype, f"built in {got}, not {dtype}"
        params = sum(p.numel() for p in model.parameters())
        gb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9
        ids = torch.randint(0, cfg.vocab_size, (1, args.context), device=device)
        shape = path.rsplit("/", 1)[-1].removesuffix(".json")
        for setting, extra in [("eager, dynamic cache", {}), ("static cache", {"cache_implementation": "static"})]:
            def run(n: int) -> float:
                sync()
                t = time.perf_counter()
                with torch.inference_mode():
                    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                   do_sample=False, pad_token_id=0, **extra)
                sync()
                return time.perf_counter() - t
            try:
                run(args.new + 1)  # warm-up (allocations, static cache)
                steps = [(run(args.new + 1) - run(1)) / args.new for _ in range(args.reps)]
                step = statistics.median(steps)
                print(f"| {shape} | {params / 1e6:.0f} M | {gb:.2f} | {setting} | {step * 1e3:.2f} | {1 / step:.1f} |")
            except Exception as e:  # a setting this version lacks: say so, keep the other
                print(f"| {shape} | {params / 1e6:.0f} M | {gb:.2f} | {setting} | failed: {type(e).__name__}: "
                      f"{str(e).splitlines()[0][:80]} | – |")
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
