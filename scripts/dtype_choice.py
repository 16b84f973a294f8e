"""Which dtype to keep a model in: tokens/s, resident memory and agreement with float32, each dtype in its own
process (so two copies are never held at once), the same greedy prompts through the engine at full depth.

Usage: nice -n 10 python scripts/dtype_choice.py MODEL [--dtypes float32,bfloat16] [--tokens 32] [--threads 2]
MODEL is a known model name or a converted directory. Prints one JSON line per dtype, then the comparison."""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROMPTS = ("What is 23 times 7? Answer step by step.", "Why is the sky blue?",
           "Write a Python function that returns the n-th Fibonacci number.")


def measure(model: str, dtype: str, tokens: int, threads: int) -> dict:
    import torch

    from d3.config import TRACE_OFF, FullConfig, GenerationConfig
    from d3.engine import Engine
    from d3.models import load_model

    torch.set_num_threads(threads)
    started = time.perf_counter()
    engine = Engine.from_loaded(load_model(model, dtype=dtype))
    load_s = time.perf_counter() - started
    rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    gen = GenerationConfig(max_new_tokens=tokens, stop_at_eos=False)
    engine.generate(PROMPTS[0], FullConfig(), GenerationConfig(max_new_tokens=2))  # warm-up
    texts, ids, rates = [], [], []
    for prompt in PROMPTS:
        trace = engine.generate(prompt, FullConfig(), gen, TRACE_OFF)
        texts.append(trace.text)
        ids.append([s.token_id for s in trace.steps])
        rates.append(trace.tokens_per_s)
    return {"dtype": dtype, "load_s": round(load_s, 1), "max_rss_gib_after_load": round(rss_loaded, 2),
            "max_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
            "tokens_per_s": [round(r, 2) for r in rates], "ids": ids, "texts": texts, "threads": threads}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.model, args.one, args.tokens, args.threads)))
        return
    results = {}
    for dtype in args.dtypes.split(","):
        out = subprocess.run([sys.executable, __file__, args.model, "--one", dtype, "--tokens", str(args.tokens),
                              "--threads", str(args.threads)], capture_output=True, text=True, check=True)
        results[dtype] = json.loads(out.stdout.strip().splitlines()[-1])
        print(json.dumps({k: v for k, v in results[dtype].items() if k not in ("ids", "texts")}), flush=True)
    reference = results.get("float32")
    for dtype, res in results.items():
        if reference is None or dtype == "float32":
            continue
        agree = [sum(a == b for a, b in zip(r, o)) / len(r) for r, o in zip(reference["ids"], res["ids"])]
        first = [next((i for i, (a, b) in enumerate(zip(r, o)) if a != b), None) for r, o in zip(reference["ids"], res["ids"])]
        speed = [o / r for r, o in zip(reference["tokens_per_s"], res["tokens_per_s"])]
        print(json.dumps({"dtype": dtype, "agreement_with_float32": [round(a, 3) for a in agree],
                          "first_divergence": first, "speed_vs_float32": [round(s, 2) for s in speed]}))
        for ref_text, text in zip(reference["texts"], res["texts"]):
            print(json.dumps({"float32": ref_text, dtype: text}))


if __name__ == "__main__":
    main()
