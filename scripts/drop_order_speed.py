"""Measured speed of the page's default D3 setting per embedded model against full depth, side by side in one run.

Usage: python scripts/drop_order_speed.py [--model smollm2-135m] [--repeats 5] [--tokens 64]
Full depth and D3 (the model's page setting: its measured order and alpha) decode the same prompts untraced, in
turn (which goes first alternates), greedy with a fixed length; the ratio is the median over (prompt, repeat) pairs
of full depth's decode seconds over D3's. The layers D3 ran per token are printed beside it (theory: L / mean).
"""

from __future__ import annotations

import argparse
import statistics
import time

from d3.config import TRACE_OFF, FullConfig, GenerationConfig
from d3.research.data import example_prompts
from d3.engine import Engine
from d3.models import get_model
from explorer.caps import Caps
from explorer.controls import model_defaults, parse_controls


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--prompts", type=int, default=3)
    args = p.parse_args()
    engine = Engine.from_loaded(get_model(args.model))
    page = model_defaults(args.model).with_(model=args.model, max_new_tokens=args.tokens)
    d3, _ = parse_controls(page, engine.num_layers, Caps(max_new_tokens=max(args.tokens, 64)))
    gen = GenerationConfig(max_new_tokens=args.tokens, stop_at_eos=False)
    prompts = [p.prompt for p in example_prompts()[:args.prompts]]
    ratios, layers = [], []
    for r in range(args.repeats):
        for prompt in prompts:
            seconds = {}
            for name, cfg in (("full", FullConfig()), ("d3", d3))[:: 1 if r % 2 == 0 else -1]:
                t0 = time.perf_counter()
                trace = engine.generate(prompt, cfg, gen, TRACE_OFF)
                seconds[name] = time.perf_counter() - t0
                if name == "d3":
                    layers.append(trace.mean_layers)
            ratios.append(seconds["full"] / seconds["d3"])
    mean = statistics.mean(layers)
    print(f"{args.model}: D3 {d3.drop_order} alpha {d3.alpha} ran {mean:.2f} of {engine.num_layers} layers per token "
          f"(theoretical {engine.num_layers / mean:.3f}x); measured {statistics.median(ratios):.3f}x "
          f"(median of {len(ratios)} interleaved pairs, {args.tokens} tokens each)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
