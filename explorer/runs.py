"""One run of the Live tab: its validated setup, the strategy and full depth streamed in turn, the comparison
after them, and the fill comparison."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from d3.compare import Recorded, compare, record, run_recorded
from d3.config import FILLS, TRACE_OFF, D3Config, FullConfig, GenerationConfig, StrategyConfig, TraceConfig
from d3.engine import Engine
from d3.trace import Comparison, Trace
from explorer.controls import Controls, fitted, parse_controls, schedule_of
from explorer.parse import as_flag, check_prompt_tokens, clean_prompt
from explorer.pool import ModelPool

# With the "Record the logit lens" control on (the default), the D3 run keeps what the lens reads (each layer's output
# at the newest position, `TraceConfig(lens_states=True)`): a copy of [layers, d_model] floats per step, no LM head.
# The Logit lens and Token scrubber views read the lens out in one batched LM-head call when their tab is opened
# (explorer.views.lens.read_session_lens). Reading it while generating cost each step about x1.6 on SmolLM2-135M
# (scripts/lens_cost.py); the page now streams at the engine's speed (scripts/measure_app.py, "page vs engine").

# Every layer's attention is recorded (the Attention overview shows all layers x heads) where memory allows: a trace
# keeps per token [layers, heads, prompt + t] float16 weights, and the prefill computes [layers, heads, prompt, prompt]
# float32 ones for a moment (d3/decoder.py). Over this budget, per trace, only the chosen layer is recorded.
# SmolLM2-135M (30 layers x 9 heads), 256 tokens: a 64-token prompt keeps 30*9*sum(64+t, t<256)*2 B = 26 MB and
# computes 4 MB at prefill; prompts up to 498 tokens record every layer (prefill 30*9*498^2*4 B = 268 MB, kept 86 MB);
# a 1,024-token prompt would keep 159 MB but compute 1.13 GB at prefill: the chosen layer alone then.
ATTENTION_BUDGET_BYTES = 256 * 2**20


def attention_bytes(layers: int, heads: int, prompt_tokens: int, new_tokens: int) -> int:
    """The larger of what a trace keeps of `layers`' attention (float16 rows over prompt + t keys per token) and what
    the prefill computes of it (float32 [heads, prompt, prompt] per layer), in bytes."""
    kept = layers * heads * (new_tokens * prompt_tokens + new_tokens * (new_tokens - 1) // 2) * 2
    prefill = layers * heads * prompt_tokens**2 * 4
    return max(kept, prefill)


def recorded_attention_layers(layers: int, heads: int, prompt_tokens: int, new_tokens: int,
                              chosen: int) -> tuple[int, ...]:
    """Every layer when its attention fits ATTENTION_BUDGET_BYTES, else the chosen layer alone."""
    every = attention_bytes(layers, heads, prompt_tokens, new_tokens) <= ATTENTION_BUDGET_BYTES
    return tuple(range(layers)) if every else (chosen,)


@dataclass(frozen=True)
class RunSetup:
    """Everything one side-by-side run needs, validated."""

    engine: Engine | None  # None until the model is loaded (check_run)
    prompt: str
    chat_template: bool
    strategy: StrategyConfig
    gen: GenerationConfig
    trace: TraceConfig
    prompt_tokens: int
    others: dict[str, StrategyConfig] = field(default_factory=dict)  # schedules drawn next to this one
    model: str = ""
    note: str = ""  # what the page changed of what was asked (a calibrated order re-fitted to the core), said with the run


def check_run(pool: ModelPool, c: Controls) -> RunSetup:
    """Validate every control without loading a known model (engine None); ValueError with a plain message."""
    caps = pool.caps
    prompt = clean_prompt(c.prompt, caps)
    chat = as_flag("chat_template", c.chat_template)
    model = pool.check_name(c.model)
    layers = pool.facts(model).num_layers
    strategy, gen = parse_controls(c, layers, caps)
    trace = TraceConfig(attention_layers=(c.attention_layer_index(layers),),
                        lens_states=as_flag("logit_lens", c.logit_lens))
    refit = fitted(c, layers)[1] if isinstance(strategy, D3Config) else ""  # a partial order is not re-fitted silently
    return RunSetup(None, prompt, chat, strategy, gen, trace, 0, schedule_of(c, strategy, layers, caps).others, model,
                    refit)


def prepare_run(pool: ModelPool, c: Controls | RunSetup) -> RunSetup:
    """The engine (loading the model on first use) and the prompt's token count for a checked run (`check_run`,
    whose parse is not repeated: a click parses the controls once), or for controls not checked yet."""
    setup = c if isinstance(c, RunSetup) else check_run(pool, c)
    engine = pool.engine(setup.model)
    tokens = check_prompt_tokens(engine, setup.prompt, setup.chat_template, pool.caps)
    layers = recorded_attention_layers(engine.num_layers, engine.adapter.num_heads, tokens, setup.gen.max_new_tokens,
                                       setup.trace.attention_layers[0])
    return replace(setup, engine=engine, prompt_tokens=tokens, trace=replace(setup.trace, attention_layers=layers))


# ---------------------------------------------------------------- streaming two runs side by side


@dataclass(frozen=True)
class LiveUpdate:
    """Both runs so far. pane: which run just grew ("d3" or "full"; "" for phase changes).
    phase: streaming, comparing (the error views are being computed), done, or stopped. measuring: while
    comparing, (tokens done, tokens in all) of the teacher-forced D3 run the comparison makes (None: not started)."""

    d3: Trace | None
    full: Trace | None
    pane: str = ""
    phase: str = "streaming"
    comparison: Comparison | None = None
    measuring: tuple[int, int] | None = None

    @property
    def finished(self) -> bool:
        return self.phase in ("done", "stopped")


def _round_robin(streams: dict[str, Iterator[Any]]) -> Iterator[tuple[str, Any]]:
    """One item from each stream in turn until all are exhausted; closes them all on the way out."""
    live = dict(streams)
    try:
        while live:
            for name in list(live):
                try:
                    item = next(live[name])
                except StopIteration:
                    del live[name]
                    continue
                yield name, item
    finally:
        for stream in streams.values():
            stream.close()  # a closed tab or a new run closes us: free both runs' caches now


def _never() -> bool:
    return False


def side_by_side(engine: Engine, prompt: str, strategy: StrategyConfig, gen: GenerationConfig,
                 trace: TraceConfig = TraceConfig(), *, chat_template: bool = True,
                 should_stop: Callable[[], bool] = _never, with_comparison: bool = True) -> Iterator[LiveUpdate]:
    """Stream `strategy` and full depth one token each in turn, then (unless stopped) compare them.

    Each run is recorded (log-probs and cache) so the comparison reuses both instead of running them again;
    the recordings are dropped once the comparison is built."""
    kwargs = dict(chat_template=chat_template, should_stop=should_stop)
    streams = {"d3": record(engine, prompt, strategy, gen, trace, **kwargs),
               "full": record(engine, prompt, FullConfig(), gen, replace(trace, lens_states=False), **kwargs)}
    latest: dict[str, Trace | None] = {"d3": None, "full": None}
    recs: dict[str, Recorded] = {}
    for pane, (current, rec) in _round_robin(streams):
        latest[pane], recs[pane] = current, rec
        yield LiveUpdate(latest["d3"], latest["full"], pane)
    if should_stop() or not with_comparison or len(recs) < 2:
        yield LiveUpdate(latest["d3"], latest["full"], phase="stopped" if should_stop() else "done")
        return
    yield LiveUpdate(latest["d3"], latest["full"], phase="comparing")
    run = functools.partial(compare, engine, prompt, strategy, gen, trace, chat_template=chat_template,
                            full=recs["full"], skip=recs["d3"])
    tokens = len(latest["full"].steps) if latest["full"] is not None else 0
    measuring = _measured(run, tokens, should_stop)
    while True:
        try:
            done = next(measuring)
        except StopIteration as end:
            comparison = end.value  # None when stopped
            break
        yield LiveUpdate(latest["d3"], latest["full"], phase="comparing", measuring=done)
    recs.clear()
    yield LiveUpdate(latest["d3"], latest["full"], phase="stopped" if comparison is None else "done",
                     comparison=comparison)


MEASURING_EVERY_S = 0.5  # while the comparison is measured, its progress goes to the page this often


def _measured(run: Callable[..., Comparison | None], tokens: int, should_stop: Callable[[], bool]
              ) -> Generator[tuple[int, int], None, Comparison | None]:
    """Run the comparison (`run(should_stop=...)`) in a worker thread and say how far it is every MEASURING_EVERY_S
    ((tokens done, tokens) of its teacher-forced run); returns the comparison (None if stopped). The
    comparison calls should_stop before each of its decode steps, which is what is counted; closing this
    generator (a new run, a closed tab) stops the comparison within one step."""
    calls, closed = [0], threading.Event()

    def counted() -> bool:
        calls[0] += 1
        return closed.is_set() or should_stop()

    def done() -> tuple[int, int]:
        return min(max(calls[0] - 1, 0), tokens), tokens  # the first call comes before the teacher-forced run

    with ThreadPoolExecutor(1, thread_name_prefix="d3-compare") as worker:
        future = worker.submit(run, should_stop=counted)
        try:
            while True:
                try:
                    return future.result(timeout=MEASURING_EVERY_S)
                except TimeoutError:
                    yield done()
        finally:
            closed.set()


def fill_comparison(engine: Engine, prompt: str, strategy: StrategyConfig, gen: GenerationConfig, *,
                    chat_template: bool = True, should_stop: Callable[[], bool] = _never,
                    fills: tuple[str, ...] = FILLS) -> Iterator[tuple[str, Comparison]]:
    """The same prompt and schedule under each fill strategy, each against one shared full-depth run."""
    kw: dict[str, Any] = dict(chat_template=chat_template, should_stop=should_stop)
    full = run_recorded(engine, prompt, FullConfig(), gen, TRACE_OFF, **kw)
    for fill in fills:
        if should_stop():
            return
        comparison = compare(engine, prompt, strategy.with_(fill=fill), gen, TRACE_OFF, full=full, **kw)
        if comparison is None:
            return
        yield fill, comparison
