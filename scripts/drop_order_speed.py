"""Measured speed of the page's default D3 setting per embedded model against full depth, side by side in one run.

Usage: python scripts/drop_order_speed.py [--model smollm2-135m] [--repeats 5] [--tokens 64] [--threads 1]
Full depth and D3 (the model's page setting: its measured order and alpha) decode the same prompts untraced, in
turn (which goes first alternates), greedy with a fixed length, with the same torch thread count; the ratio is the
median over (prompt, repeat) pairs of full depth's seconds per generated token over D3's, with a distribution-free
95% interval (order statistics, d3.research.stats.median_interval), beside the theoretical bounds at the depth D3
ran (the LM head as fixed cost, and none); a ratio above them beyond its interval is flagged (speed_flag).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from d3.config import TRACE_OFF, FullConfig, GenerationConfig
from d3.engine import Engine
from d3.models import get_model
from d3.research.data import example_prompts
from d3.research.stats import median_interval, speed_flag
from d3.schedule import theoretical_speedup
from explorer.caps import Caps
from explorer.controls import model_defaults, parse_controls


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads, the same for both sides")
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
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
    median, low, high, coverage = median_interval(ratios)
    fixed = theoretical_speedup([mean], engine.num_layers, engine.fixed_cost_layers)
    plain = theoretical_speedup([mean], engine.num_layers)
    flag = speed_flag(low, fixed, plain)
    print(f"{args.model}: D3 {d3.drop_order} alpha {d3.alpha} ran {mean:.2f} of {engine.num_layers} layers per token; "
          f"measured {median:.3f}x [{low:.3f}, {high:.3f}] ({100 * coverage:.1f}% interval, median of {len(ratios)} "
          f"interleaved pairs, {args.tokens} tokens each, {args.threads} thread(s) both sides); theory {fixed:.3f}x with "
          f"the LM head as fixed cost, {plain:.3f}x with none" + (f"; FLAG: {flag} beyond its interval" if flag else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
