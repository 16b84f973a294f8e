"""What recording the logit lens costs per generated token (the page records it for both of its runs).

PYTHONPATH=. OMP_NUM_THREADS=1 python scripts/lens_cost.py [--tokens 32] [--repeats 3] [--model tiny|smollm2-135m]
Prints the median decode-step time (ms) of D3 and of full depth with and without TraceConfig(logit_lens=True),
runs interleaved so that they see the same machine load."""

from __future__ import annotations

import argparse
import statistics
import time

from d3.config import D3Config, FullConfig, GenerationConfig, TraceConfig
from d3.engine import Engine

PROMPT = "Explain in a few sentences why the sky is blue."


def engine_for(name: str) -> Engine:
    if name == "tiny":
        from d3.testing import tiny_llama, tiny_tokenizer

        return Engine(tiny_llama(30), tiny_tokenizer(), name="tiny")
    from d3.models import get_model

    return Engine.from_loaded(get_model(name))


def step_ms(engine: Engine, strategy, lens: bool, tokens: int) -> tuple[float, float]:
    """(median decode-step ms over steps 1.., wall seconds of the whole run)."""
    trace_cfg = TraceConfig(logit_lens=lens, attention_layers=(engine.num_layers // 2,))
    t0 = time.perf_counter()
    trace = None
    for trace in engine.stream(PROMPT, strategy, GenerationConfig(max_new_tokens=tokens), trace_cfg):
        pass
    wall = time.perf_counter() - t0
    return statistics.median(s.wall_ms for s in trace.steps[1:]), wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    engine = engine_for(args.model)
    runs = {"d3": D3Config(), "full": FullConfig()}
    step_ms(engine, runs["d3"], True, 4)  # warm up
    got: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    for _ in range(args.repeats):
        for name, cfg in runs.items():
            for lens in (False, True):
                got.setdefault((name, lens), []).append(step_ms(engine, cfg, lens, args.tokens))
    print(f"model {args.model}: {engine.num_layers} layers, {args.tokens} tokens, {args.repeats} repeats")
    for name in runs:
        off = statistics.median(m for m, _ in got[(name, False)])
        on = statistics.median(m for m, _ in got[(name, True)])
        print(f"{name:5s} step without lens {off:7.2f} ms, with lens {on:7.2f} ms: +{on - off:6.2f} ms per token "
              f"(x{on / off:.2f})")


if __name__ == "__main__":
    main()
