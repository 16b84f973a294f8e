"""Copy within the attention type against copy from any layer, on Gemma 3 270M under a non-nested (strided) D3 schedule.

    python scripts/gemma_copy_fill.py [--prompts 3] [--new-tokens 40] [--depth 0.6667] [--out results/gemma3_copy_fill.json]

Only a non-nested schedule lets later tokens read filled entries, so only there can the fill matter. Prints, per fill,
the mean KL against full depth (teacher-forced and free-running), greedy agreement, the relative error of the filled
KV entries, and the perplexity of the project's reference text read under the schedule.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from d3.compare import compare, perplexity, run_recorded  # noqa: E402
from d3.config import TRACE_OFF, D3Config, FullConfig, GenerationConfig  # noqa: E402
from d3.engine import Engine  # noqa: E402
from d3.models import get_model  # noqa: E402
from d3.research.data import ppl_text  # noqa: E402
from d3.research.sweep.spec import load_prompts  # noqa: E402
from d3.schedule import alpha_for_mean_depth  # noqa: E402

FILLS = ("copy", "copy_any_type", "propagate", "none")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=40)
    parser.add_argument("--depth", type=float, default=2 / 3, help="target mean depth, a fraction of the layers")
    parser.add_argument("--ppl-tokens", type=int, default=128)
    parser.add_argument("--out", default="results/gemma3_copy_fill.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    engine = Engine.from_loaded(get_model("gemma3-270m"))
    gen = GenerationConfig(max_new_tokens=args.new_tokens, stop_at_eos=False)
    alpha = alpha_for_mean_depth(args.depth, engine.num_layers, args.new_tokens)
    prompts = load_prompts(args.prompts)
    fulls = [run_recorded(engine, p, FullConfig(), gen, TRACE_OFF, chat_template=False) for p in prompts]
    text = ppl_text()
    ppl_full = perplexity(engine, text, FullConfig(), max_tokens=args.ppl_tokens)
    rows = []
    for fill in FILLS:
        cfg = D3Config(alpha=alpha, drop_order="strided", fill=fill)
        comps = [compare(engine, p, cfg, gen, TRACE_OFF, chat_template=False, full=f) for p, f in zip(prompts, fulls)]
        rows.append({
            "fill": fill, "alpha": alpha,
            "mean_layers": float(np.mean([c.skip.mean_layers for c in comps])),
            "kl_teacher": float(np.mean([np.nanmean(c.kl_teacher) for c in comps])),
            "kl_free": float(np.mean([np.nanmean(c.kl_free) for c in comps])),
            "agreement": float(np.mean([c.agree.mean() for c in comps])),
            "filled_kv_error": float(np.nanmean([c.filled_kv_error() for c in comps])),
            "ppl_ratio": perplexity(engine, text, cfg, max_tokens=args.ppl_tokens) / ppl_full,
        })
        print(json.dumps(rows[-1]), flush=True)
    Path(args.out).write_text(json.dumps({"model": "gemma3-270m", "prompts": len(prompts), "new_tokens": args.new_tokens,
                                          "drop_order": "strided", "ppl_full": ppl_full, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
