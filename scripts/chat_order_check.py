"""Which drop order keeps full depth's chat text longer: the page's chat prompts, D3 at the page's α and core.

PYTHONPATH=. OMP_NUM_THREADS=1 nice -n 10 python scripts/chat_order_check.py --model qwen2.5-coder-1.5b
    [--alpha 0.99 [--alpha 0.995 ...]] [--core 3 3] [--tokens 64] [--order agreement]

Runs full depth and D3 with each order (middle_out, and a calibration by name as `D3Config.layer_order` takes it,
newest cached first) on every prompt of assets/prompts.json, batched, greedy, and prints per prompt the token at
which D3's text first differs from full depth's (the tokens compared where it never does), and the totals.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from d3.config import TRACE_OFF, D3Config, FullConfig, GenerationConfig
from d3.engine import Engine
from d3.models import get_model
from d3.trace import token_agreement

PROMPTS = Path(__file__).resolve().parent.parent / "assets" / "prompts.json"


def kept(full: list[int], d3: list[int]) -> int:
    """Tokens D3 writes as full depth does before the first difference (all compared where none)."""
    agreement = token_agreement(full, d3)
    return agreement.compared if agreement.first_divergence is None else agreement.first_divergence


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--alpha", type=float, action="append", help="D3's alpha (repeatable; default 0.99)")
    ap.add_argument("--core", type=int, nargs=2, default=(3, 3))
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--order", action="append", default=[], help="a calibration's name (default: agreement)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    engine = Engine.from_loaded(get_model(args.model))
    prompts = [p["prompt"] for p in json.loads(PROMPTS.read_text(encoding="utf-8"))]
    gen = GenerationConfig(max_new_tokens=args.tokens)
    head, tail = args.core
    full = [list(t.token_ids) for t in engine.generate_batch(prompts, FullConfig(), gen, TRACE_OFF)]
    result: dict[str, dict] = {}
    for alpha in args.alpha or [0.99]:
        base = dict(alpha=alpha, core_head=head, core_tail=tail)
        configs = {"middle_out": D3Config(drop_order="middle_out", **base)}
        for name in args.order or ["agreement"]:
            configs[name] = engine.resolve(D3Config(drop_order="calibrated", layer_order=name, **base))
        for name, cfg in configs.items():
            traces = engine.generate_batch(prompts, cfg, gen, TRACE_OFF)
            per = [kept(f, list(t.token_ids)) for f, t in zip(full, traces)]
            layers = statistics.mean(len(s.layers_run) for t in traces for s in t.steps)
            result[f"{name} @ {alpha}"] = {
                "alpha": alpha, "kept": per, "total": sum(per), "median": statistics.median(per), "mean_layers": layers,
                "order": list(cfg.layer_order) if isinstance(cfg.layer_order, tuple) else cfg.drop_order}
            print(f"{name:>12} at alpha {alpha}: tokens kept before the first difference, per prompt {per}; total "
                  f"{sum(per)} of {sum(len(f) for f in full)}, median {statistics.median(per)}; {layers:.1f} of "
                  f"{engine.num_layers} layers per token", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "core": [head, tail],
                                         "tokens": args.tokens, "full_lengths": [len(f) for f in full],
                                         "orders": result}, indent=1))


if __name__ == "__main__":
    main()
