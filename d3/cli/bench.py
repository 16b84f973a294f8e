"""Speed checks against targets (`python -m d3 bench`): our full-depth loop vs `model.generate`, D3's measured vs
theoretical speedup, tracing overhead, and cache-warm model load time.

Every timed variant runs on the same prompts, interleaved in one process (the order rotates every repeat), and
each ratio is the median over (prompt, repeat) pairs, so load from other processes hits both sides alike.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from d3.cli.common import add_field_args, add_model_arg, add_threads_arg, check_output_file, int_in, set_threads
from d3.config import params
from d3.research.sweep.spec import SweepSpec, load_prompts, prompt_count

BENCH_TOKENS = 128  # the bench's own default: long enough that per-token costs dominate the prefill


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("bench", help="speed against targets: our loop vs model.generate, D3, tracing, load",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arg(p)
    p.add_argument("--prompts", type=int_in(1, prompt_count()), default=4,
                   help=f"how many prompts of assets/prompts.json (it holds {prompt_count()})")
    # The registry's ranges (d3.config, SweepSpec): a run of the bench generates what any run may, at least two tokens
    add_field_args(p, SweepSpec, ("max_new_tokens", "repeats"), flags={"max_new_tokens": "--new-tokens"},
                   narrow={"max_new_tokens": replace(params(SweepSpec)["max_new_tokens"], default=BENCH_TOKENS,
                                                     help="tokens each timed run generates")})
    add_threads_arg(p)
    p.add_argument("--skip-load", action="store_true", help="skip the subprocess load-time check")
    p.add_argument("--profile", choices=("auto", "always", "never"), default="auto",
                   help="profile variants whose target was missed (auto), all of them, or none")
    p.add_argument("--json", default=None, help="also write the results as JSON here")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace, engine: Any = None) -> int:
    """Run the bench; `engine` lets tests inject a tiny model (the load-time check then needs --skip-load)."""
    if args.json:
        check_output_file(args.json, "--json")
    set_threads(args.threads)
    # Loaded here, not at the top: the parser is built for every command, and the bench needs torch.
    from d3.engine import Engine
    from d3.models import get_model
    from d3.research.bench import d3_two_thirds, interleaved, load_time, profile_load, profile_misses, results, table

    if engine is None:
        engine = Engine.from_loaded(get_model(args.model, device="cpu"))
    prompts = load_prompts(args.prompts)
    d3 = d3_two_thirds(engine.num_layers, args.max_new_tokens)
    times, first = interleaved(engine, prompts, args.max_new_tokens, args.repeats, d3,
                               progress=lambda m: print(m, file=sys.stderr, flush=True))
    load = None if args.skip_load else load_time(args.model)
    res = results(engine, times, first, d3, load)
    res["times"] = times
    print(table(res))
    if args.profile != "never":
        forced = {k: False for k in ("full_vs_hf", "d3_efficiency", "trace_overhead")} if args.profile == "always" else {}
        profiles = profile_misses(engine, {**res, "ok": {**res["ok"], **forced}}, prompts[0], d3, args.max_new_tokens)
        if load is not None and (args.profile == "always" or not res["ok"]["load_s"]):
            profiles["load_s"] = profile_load(args.model)
        for name, text in profiles.items():
            print(f"\n--- profile for {name} ---\n{text}")
        res["profiles"] = profiles
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))
    return 0
