"""Measure the page's responsiveness on the embedded model (not a timed test: numbers depend on the machine).

1. Slider let go (or another control changed): server-side time to redraw the decay curve and the planned
   grid (handler + gradio's figure serialisation), target < 200 ms. While a slider moves, the browser redraws
   the curve itself (assets/decay_preview.js; its timing is measured in tests/test_browser_page.py).
2. Generate: time from pressing Generate (submitting the job) to the first streamed token of each pane,
   once the model is loaded, target < 2 s. Measured twice: calling the handler in process, and through
   gradio_client against the running server (queue and network included).
3. Page vs engine: a default page run (D3 and full depth streamed side by side, logit lens on, 64 tokens) against
   the engine's untraced speed (`python -m d3 bench`'s "full" and "d3" runs: TRACE_OFF), interleaved in one
   process, median of the repeats. Per pane: the tokens/s the pane's counter shows over the engine's tokens/s
   for the same strategy, target >= 0.7. Whole page: the engine's seconds for the same tokens of both runs over
   the page's seconds from Generate to the last token of both panes (rendering, tracing and pacing included).

Usage: python scripts/measure_app.py [--model smollm2-135m] [--repeats 5] [--threads N]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gradio as gr  # noqa: E402

from d3.config import TRACE_OFF, FullConfig, default_core  # noqa: E402
from d3.models import KNOWN_MODELS  # noqa: E402
from explorer import live, page, view_handlers  # noqa: E402
from explorer.controls import Controls  # noqa: E402
from explorer.page import free_port  # noqa: E402
from explorer.runs import prepare_run  # noqa: E402
from explorer.session import Session  # noqa: E402

ALPHAS = (0.99, 0.985, 0.97, 0.95, 0.93, 0.9, 0.995, 0.98)
OUT = {name: i for i, name in enumerate(live.GENERATE_OUTPUTS)}
TOKEN = re.compile(r'class="d3-tok[ "]')


def _core(model: str) -> int:
    """The default core depth at each end of a known model (1 for anything else)."""
    return default_core(KNOWN_MODELS[model].facts.num_layers)[0] if model in KNOWN_MODELS else 1


def schedule_args(model: str, alpha: float, max_new_tokens: int) -> dict:
    return vars(Controls(model=model, alpha=alpha, core_head=_core(model), core_tail=_core(model),
                         max_new_tokens=max_new_tokens))


def measure_redraw(pool, model: str, repeats: int, max_new_tokens: int) -> dict[str, float]:
    """Median ms of redraw_schedule alone and with gr.Plot's postprocess (what the server sends)."""
    plot = gr.Plot()
    handler, total = [], []
    view_handlers.redraw_schedule(pool, None, **schedule_args(model, ALPHAS[0], max_new_tokens))  # warm caches once
    for i in range(repeats * len(ALPHAS)):
        t0 = time.perf_counter()
        figs = view_handlers.redraw_schedule(pool, None, **schedule_args(model, ALPHAS[i % len(ALPHAS)], max_new_tokens))
        t1 = time.perf_counter()
        for fig in figs:
            plot.postprocess(fig)
        t2 = time.perf_counter()
        handler.append((t1 - t0) * 1000)
        total.append((t2 - t0) * 1000)
    return {"handler_ms": statistics.median(handler), "with_serialisation_ms": statistics.median(total),
            "max_ms": max(total)}


def run_args(model: str, max_new_tokens: int) -> dict:
    head = _core(model)
    return vars(Controls(prompt="Explain in a few sentences why the sky looks blue during the day.", model=model,
                         core_head=head, core_tail=head, max_new_tokens=max_new_tokens, attention_layer=head))


def first_tokens(outputs, t0: float, offset: int = 0) -> tuple[float, float]:
    """Seconds from t0 to the first update with a D3 token and with a full-depth token."""
    d3 = full = float("nan")
    for out, at in outputs:
        if d3 != d3 and TOKEN.search(str(out[OUT["d3_tokens"] - offset])):
            d3 = at - t0
        if full != full and TOKEN.search(str(out[OUT["full_tokens"] - offset])):
            full = at - t0
        if d3 == d3 and full == full:
            break
    return d3, full


def measure_first_token_handler(pool, model: str, repeats: int) -> list[tuple[float, float]]:
    results = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        stream = live.generate(pool, Session(), **run_args(model, 8))
        timed = ((out, time.perf_counter()) for out in stream)
        results.append(first_tokens(timed, t0))
        stream.close()
    return results


def measure_first_token_client(url: str, model: str, repeats: int) -> list[tuple[float, float]]:
    from gradio_client import Client

    results = []
    for _ in range(repeats):
        client = Client(url, verbose=False)
        args = run_args(model, 8)
        seen: list[tuple[list, float]] = []
        t0 = time.perf_counter()
        job = client.submit(**args, api_name="/generate")
        for out in job:  # each streamed update, as it arrives
            seen.append((out, time.perf_counter()))
            if all(v == v for v in first_tokens(seen, t0, offset=1)):  # both panes have a token (no NaN)
                break
        results.append(first_tokens(seen, t0, offset=1))  # the State output is not in the API
        job.cancel()
    return results


def _engine_tps(engine, setup, strategy) -> float:
    t0 = time.perf_counter()
    trace = engine.generate(setup.prompt, strategy, setup.gen, TRACE_OFF, chat_template=setup.chat_template)
    return len(trace.steps) / (time.perf_counter() - t0)


def _page_run(pool, args: dict) -> tuple[float, float, Session]:
    """Seconds from Generate to the last token of both panes, and to the end of the run (the comparison after the
    tokens included: agreement, KL and full depth's probability of each D3 token), and the session."""
    session = Session()
    t0 = time.perf_counter()
    streamed = float("nan")
    for _ in live.generate(pool, session, **args):
        done = session.d3 is not None and session.full is not None
        if streamed != streamed and done and session.d3.finish_reason and session.full.finish_reason:
            streamed = time.perf_counter() - t0
    return streamed, time.perf_counter() - t0, session


def measure_page_speed(pool, model: str, repeats: int, tokens: int = 64) -> dict[str, float]:
    """Medians over interleaved repeats of each pair's ratio (engine and page run one after the other, so load
    hits both alike): each pane's tokens/s over the untraced engine's for its strategy, and the engine's seconds
    for the same tokens of both runs over the page's (to the last token, and to the end of the comparison)."""
    args = run_args(model, tokens)
    setup = prepare_run(pool, Controls(**args))
    engine = setup.engine
    rows: dict[str, list[float]] = {k: [] for k in ("engine_d3", "engine_full", "pane_d3", "pane_full", "d3", "full",
                                                   "page", "page_compared")}
    for _ in range(repeats):
        eng_d3, eng_full = _engine_tps(engine, setup, setup.strategy), _engine_tps(engine, setup, FullConfig())
        streamed, total, session = _page_run(pool, args)
        d3, full = session.d3, session.full
        engine_seconds = len(d3.steps) / eng_d3 + len(full.steps) / eng_full
        for key, value in (("engine_d3", eng_d3), ("engine_full", eng_full), ("pane_d3", d3.tokens_per_s),
                           ("pane_full", full.tokens_per_s), ("d3", d3.tokens_per_s / eng_d3),
                           ("full", full.tokens_per_s / eng_full), ("page", engine_seconds / streamed),
                           ("page_compared", engine_seconds / total)):
            rows[key].append(value)
    return {k: statistics.median(v) for k, v in rows.items()}


def summarise(name: str, pairs: list[tuple[float, float]]) -> None:
    d3 = [p[0] for p in pairs]
    full = [p[1] for p in pairs]
    print(f"{name}: first D3 token median {statistics.median(d3):.3f} s (max {max(d3):.3f}), "
          f"first full-depth token median {statistics.median(full):.3f} s (max {max(full):.3f})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    demo = page.build_demo(public=False)
    page.tune_process()  # as page.launch does: torch threads from D3_TORCH_THREADS, gc.freeze()
    pool = demo.pool
    print(f"torch threads: {torch.get_num_threads()}; model: {args.model}")
    for steps in (64, 256):
        r = measure_redraw(pool, args.model, args.repeats, steps)
        print(f"schedule redraw on release ({steps} planned tokens): handler {r['handler_ms']:.1f} ms, with serialisation "
              f"{r['with_serialisation_ms']:.1f} ms (median), worst {r['max_ms']:.1f} ms  [target < 200 ms]")
    t0 = time.perf_counter()
    pool.engine(args.model)
    print(f"model load (once per process): {time.perf_counter() - t0:.1f} s")
    measure_first_token_handler(pool, args.model, 1)  # warm-up run
    runs = max(1, args.repeats // 2)
    speed = measure_page_speed(pool, args.model, runs)
    print(f"page vs engine (64 tokens, lens on, median of {runs} interleaved pairs): D3 pane {speed['pane_d3']:.1f} "
          f"tokens/s vs engine {speed['engine_d3']:.1f} untraced ({speed['d3']:.2f}x); full-depth pane "
          f"{speed['pane_full']:.1f} vs engine {speed['engine_full']:.1f} ({speed['full']:.2f}x); whole page run "
          f"{speed['page']:.2f}x of the engine's time for the same tokens, {speed['page_compared']:.2f}x with the "
          "comparison after them  [target >= 0.7x per pane]")
    summarise("generate -> first token, handler in process [target < 2 s]",
              measure_first_token_handler(pool, args.model, args.repeats))
    port = free_port()
    page.launch(demo, prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
    try:
        summarise("generate -> first token, through gradio_client [target < 2 s]",
                  measure_first_token_client(f"http://127.0.0.1:{port}/", args.model, args.repeats))
    finally:
        demo.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
