"""The oracle under each drop order: the mean depth per token that any per-token depth rule could reach with that
order (the fewest of its layers that keep full depth's top-1, teacher-forced), on chat prompts and on worked
arithmetic questions.

Usage: python scripts/oracle_by_order.py [--model smollm2-135m] [--out results/oracle_by_order_smollm2.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from d3.config import D3Config
from d3.engine import Engine
from d3.models import get_model
from d3.orders import CHAT_ORDERS, MEASURED
from d3.research.data import example_prompts
from d3.research.oracle import measure
from explorer.scenarios import ASK


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--out", default="results/oracle_by_order_smollm2.json")
    args = p.parse_args()
    engine = Engine.from_loaded(get_model(args.model))
    core = D3Config().core(engine.num_layers)
    orders = {o: {"drop_order": o} for o in ("middle_out", "bottom_up", "top_down")}
    orders["calibrated (measured best)"] = {"drop_order": "calibrated", "layer_order": MEASURED[args.model][core]}
    if args.model in CHAT_ORDERS:
        orders["calibrated (chat prompts)"] = {"drop_order": "calibrated", "layer_order": CHAT_ORDERS[args.model][core]}
    texts = {"chat": [(x.prompt, True) for x in example_prompts()[:args.prompts]],
             "arithmetic": [(ASK["prompt"], False)]}
    out: dict = {"model": args.model, "num_layers": engine.num_layers, "core": list(core), "tokens": args.tokens,
                 "mean_need": {}}
    for name, fields in orders.items():
        cfg = D3Config(**fields)
        for kind, prompts in texts.items():
            needs = [n for prompt, chat in prompts
                     for n in measure(engine, prompt, cfg, args.tokens, chat_template=chat).oracle_depth]
            out["mean_need"].setdefault(name, {})[kind] = round(statistics.mean(needs), 2)
            print(f"{name} / {kind}: mean need {out['mean_need'][name][kind]} of {engine.num_layers}", file=sys.stderr)
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
