"""What tracing costs per decode step, measured step by step so that a loaded machine's swings cancel out.

PYTHONPATH=. OMP_NUM_THREADS=1 nice -n 10 python scripts/trace_cost.py [--model qwen2.5-coder-1.5b] [--steps 24]
    [--page] [--profile]

One prompt is prefilled once; then decode steps alternate between tracing off and tracing on (the bench's
`TraceConfig()`: sublayer statistics from hooks, entropy and top-5; with --page also the page's attention of every
layer and the lens's kept layer outputs), each pair in alternating order, on the same growing cache. Prints the
median of the per-pair ratios (on / off) and the median ms of each; --profile adds where a traced step's time goes.
`d3 bench` times whole runs instead, whose ratio swings with the machine's load between runs.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch

from d3.config import FullConfig, TraceConfig
from d3.decoder import decode_one_token, prefill
from d3.engine import Engine
from d3.hooks import StatsRecorder
from d3.models import get_model
from d3.schedule import plan

PROMPT = "Explain in a few sentences why the sky looks blue during the day."


def traced_extras(logits: torch.Tensor, top_k: int) -> None:
    """What `TraceBuilder._read` adds when tracing is on: the entropy and the top-k of the next-token distribution."""
    logprobs = torch.log_softmax(logits, dim=-1)
    (-(logprobs.exp() * logprobs)).nan_to_num(0.0).sum(-1).tolist()
    logprobs.topk(top_k, dim=-1).indices.tolist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--steps", type=int, default=24, help="decode steps (pairs = steps // 2)")
    ap.add_argument("--page", action="store_true", help="trace as the page does: every layer's attention, lens states")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    engine = Engine.from_loaded(get_model(args.model))
    adapter, L = engine.adapter, engine.num_layers
    trace = TraceConfig(attention_layers=tuple(range(L)), lens_states=True) if args.page else TraceConfig()
    ids, mask = engine.encode([PROMPT])
    layer_plan = plan(FullConfig(), L, 1)

    def step(state, token: torch.Tensor, on: bool) -> torch.Tensor:
        recorder = StatsRecorder(L, trace.attention_layers) if on else None
        out = decode_one_token(adapter, state, token, layer_plan, "copy", recorder=recorder,
                               lens_states=on and trace.lens_states)
        if on:
            traced_extras(out.logits, trace.top_k)
        return out.logits.argmax(-1)

    with torch.inference_mode():
        state, out = prefill(adapter, ids, mask)
        token = out.logits.argmax(-1)
        times: dict[bool, list[float]] = {False: [], True: []}
        for pair in range(args.steps // 2):
            for on in ((True, False) if pair % 2 else (False, True)):
                t0 = time.perf_counter()
                token = step(state, token, on)
                times[on].append((time.perf_counter() - t0) * 1000)
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            step(state, token, True)
            prof.disable()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(12)
            print(text.getvalue())
    ratios = [on / off for on, off in zip(times[True], times[False])]
    print(f"{args.model}: {'page' if args.page else 'bench'} tracing, {len(ratios)} pairs of decode steps, one thread: "
          f"off {statistics.median(times[False]):.0f} ms, on {statistics.median(times[True]):.0f} ms, "
          f"on / off {statistics.median(ratios):.3f}x (median of pair ratios; quartiles "
          f"{statistics.quantiles(ratios, n=4)[0]:.3f}-{statistics.quantiles(ratios, n=4)[2]:.3f})")


if __name__ == "__main__":
    main()
