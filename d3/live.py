"""Live session logic behind the app: caps, control parsing, the shared models, side-by-side streaming. No gradio."""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import statistics
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Mapping

import pandas as pd

from d3.compare import Recorded, compare, record, run_recorded
from d3.config import (
    DROP_ORDERS,
    FILLS,
    MAX_NEW_TOKENS_CAP,
    MAX_PROMPT_TOKENS_CAP,
    TRACE_OFF,
    D3Config,
    EarlyExitConfig,
    FullConfig,
    GenerationConfig,
    SkipDecodeConfig,
    StrategyConfig,
    TraceConfig,
    UnifiedConfig,
    default_core,
)
from d3.data import example_prompts  # noqa: F401  (re-exported for the page)
from d3.engine import Engine, check_prompt
from d3.trace import Comparison, Trace

log = logging.getLogger(__name__)

# Strategies a person can put against full depth, with the names the page shows.
STRATEGY_LABELS: dict[str, str] = {
    "d3": "D3 (depth decay)",
    "skipdecode": "SkipDecode",
    "unified": "Unified Layer Skipping",
    "early_exit": "Confidence early exit (CALM-style)",
}
DECODINGS = ("greedy", "sample")


# ---------------------------------------------------------------- caps and deployment



def _shown(value: object) -> str:
    """A refused value as shown back in an error: its repr, cut to 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"

def _env_int(env: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    """An integer from the environment, clamped to [lo, hi]; a malformed value falls back to the default."""
    raw = env.get(name, "")
    try:
        value = int(raw) if raw.strip() else default
    except ValueError:
        log.warning("%s=%r is not an integer; using %d", name, raw, default)
        value = default
    return max(lo, min(hi, value))


@dataclass(frozen=True)
class Caps:
    """Server-side bounds, enforced in the handlers whatever the page or an API call sends."""

    max_new_tokens: int = 256
    max_prompt_chars: int = 8000
    max_prompt_tokens: int = 1024
    queue_size: int = 16
    concurrency: int = 2
    figure_every: int = 8  # heavy figures are redrawn every this many tokens while streaming
    session_ttl_s: int = 3600

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "Caps":
        """D3_MAX_NEW_TOKENS, D3_MAX_PROMPT_CHARS, D3_MAX_PROMPT_TOKENS, D3_QUEUE_SIZE, D3_CONCURRENCY,
        D3_FIGURE_EVERY, D3_SESSION_TTL; defaults suit a CPU Space."""
        d = cls()
        return cls(
            max_new_tokens=_env_int(env, "D3_MAX_NEW_TOKENS", d.max_new_tokens, 1, MAX_NEW_TOKENS_CAP),
            max_prompt_chars=_env_int(env, "D3_MAX_PROMPT_CHARS", d.max_prompt_chars, 16, 200_000),
            max_prompt_tokens=_env_int(env, "D3_MAX_PROMPT_TOKENS", d.max_prompt_tokens, 8, MAX_PROMPT_TOKENS_CAP),
            queue_size=_env_int(env, "D3_QUEUE_SIZE", d.queue_size, 1, 1000),
            concurrency=_env_int(env, "D3_CONCURRENCY", d.concurrency, 1, 64),
            figure_every=_env_int(env, "D3_FIGURE_EVERY", d.figure_every, 1, 1000),
            session_ttl_s=_env_int(env, "D3_SESSION_TTL", d.session_ttl_s, 60, 7 * 24 * 3600),
        )

    def describe(self) -> str:
        return (f"prompts up to {self.max_prompt_chars:,} characters and {self.max_prompt_tokens:,} tokens; "
                f"at most {self.max_new_tokens} new tokens per run; {self.concurrency} generations at a time, "
                f"{self.queue_size} more waiting")


def is_public(env: Mapping[str, str] = os.environ) -> bool:
    """A public deployment: D3_PUBLIC=1, or running on Hugging Face Spaces (SPACE_ID is set)."""
    return env.get("D3_PUBLIC", "").strip().lower() in ("1", "true", "yes") or bool(env.get("SPACE_ID"))


# ---------------------------------------------------------------- models shared by every session


@dataclass(frozen=True)
class ModelFacts:
    """What the page needs to size its controls before a model is loaded."""

    num_layers: int
    num_heads: int
    chat_template: bool


# Facts of the known models, so slider ranges and the planned schedule need no model load.
KNOWN_FACTS: dict[str, ModelFacts] = {
    "smollm2-135m": ModelFacts(num_layers=30, num_heads=9, chat_template=True),
    "gemma3-270m": ModelFacts(num_layers=18, num_heads=4, chat_template=False),
}
DEFAULT_MODEL = "smollm2-135m"


def _default_factory(caps: Caps, public: bool) -> Callable[[str], Engine]:
    def build(name: str) -> Engine:
        from d3.models import get_model  # imported on first use: loading is the slow part of the app

        loaded = get_model(name, allow_paths=not public)
        engine = Engine(loaded.model, loaded.tokenizer, name=loaded.name, max_prompt_tokens=caps.max_prompt_tokens)
        gc.freeze()  # the model lives as long as the process: keep its objects out of every full GC pass
        return engine

    return build


class ModelPool:
    """Engines by model name: each built once, on first use, and shared read-only by every session.

    The engine's own lock serialises forward steps, so concurrent streams interleave safely.
    """

    def __init__(self, factory: Callable[[str], Engine] | None = None, *, caps: Caps | None = None,
                 public: bool = False, names: tuple[str, ...] = tuple(KNOWN_FACTS),
                 facts: Mapping[str, ModelFacts] | None = None) -> None:
        self.caps = caps or Caps()
        self.public = public
        self.names = names
        self._factory = factory or _default_factory(self.caps, public)
        # Injected factories (tests) get no table: their facts come from the engine itself.
        self._facts = dict(KNOWN_FACTS if factory is None and facts is None else facts or {})
        self._engines: dict[str, Engine] = {}
        self._lock = threading.Lock()

    def check_name(self, name: Any) -> str:
        """A model name this deployment may load; ValueError otherwise (public: known models only)."""
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"model={_shown(name)} is not allowed: choose one of {', '.join(self.names)}")
        name = name.strip()
        if name in self.names:
            return name
        if self.public:
            raise ValueError(f"model={_shown(name)} is not allowed here: this deployment only runs {', '.join(self.names)}")
        if len(name) > 300 or not name.isprintable():
            raise ValueError("model names are at most 300 printable characters")
        return name

    def engine(self, name: str) -> Engine:
        """The engine for `name`, loading the model the first time (thread-safe, once per name)."""
        name = self.check_name(name)
        with self._lock:
            if name not in self._engines:
                self._engines[name] = self._factory(name)
            return self._engines[name]

    def is_loaded(self, name: str) -> bool:
        return name in self._engines

    def facts(self, name: str) -> ModelFacts:
        """Layer and head counts of `name`: from the loaded engine, else the known table, else by loading it."""
        name = self.check_name(name)
        if name not in self._engines and name in self._facts:
            return self._facts[name]
        engine = self.engine(name)
        return ModelFacts(engine.num_layers, engine.adapter.num_heads, engine.has_chat_template)


# ---------------------------------------------------------------- parsing what a person (or API call) sends


def as_number(name: str, value: Any, lo: float, hi: float, *, integer: bool = False, lo_open: bool = False) -> float:
    """`value` (number or numeric text) as a float or int in [lo, hi] ((lo, hi] if `lo_open`); ValueError naming
    the field and the allowed range otherwise."""
    kind = "an integer" if integer else "a number"
    interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
    allowed = f"{name} must be {kind} in {interval}"
    number = _to_float(name, value, allowed)
    if integer and number != math.floor(number):
        raise ValueError(f"{name}={_shown(value)} is not allowed: {allowed}")
    if number < lo or number > hi or (lo_open and number == lo):
        raise ValueError(f"{name}={_shown(value)} is out of range: {allowed}")
    return int(number) if integer else number


def _to_float(name: str, value: Any, allowed: str) -> float:
    if isinstance(value, bool) or value is None or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"{name} is missing or not a number: {allowed}")
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name}={str(value)[:40]!r} is not a number: {allowed}") from None
    if not math.isfinite(number):
        raise ValueError(f"{name}={_shown(value)} is not a finite number: {allowed}")
    return number


def as_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name}={str(value)[:40]!r} is not allowed: {name} must be one of {', '.join(choices)}")
    return value


def as_flag(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if value in (0, 1, "true", "false", "True", "False"):
        return str(value).lower() in ("1", "true")
    raise ValueError(f"{name}={str(value)[:40]!r} is not allowed: {name} must be true or false")


def clean_prompt(prompt: Any, caps: Caps) -> str:
    """The prompt without control characters; ValueError if it is empty or longer than the cap."""
    if isinstance(prompt, str) and len(prompt) > caps.max_prompt_chars:
        raise ValueError(f"prompt is {len(prompt):,} characters long; the limit is {caps.max_prompt_chars:,} "
                         "characters: shorten it")
    return check_prompt(prompt)


def check_prompt_tokens(engine: Engine, prompt: str, chat_template: bool, caps: Caps) -> int:
    """Number of prompt tokens (with the chat template); ValueError above the cap."""
    ids, _ = engine.encode([prompt], chat_template)  # [1, prompt_len]
    count = int(ids.shape[1])
    limit = min(caps.max_prompt_tokens, engine.max_prompt_tokens)
    if count > limit:
        raise ValueError(f"prompt is {count} tokens long; the limit is {limit} tokens: shorten it")
    return count


def default_attention_layer(num_layers: int) -> int:
    """The first flex layer: the default drop order (middle out) keeps it longest, so D3's attention there
    can be set against full depth for most tokens."""
    return min(default_core(num_layers)[0], num_layers - 1)


def _optional_layers(name: str, value: Any, num_layers: int) -> int | None:
    """0 (or empty) means auto for SkipDecode's bounds."""
    if value in (None, "", 0, 0.0, "0"):
        return None
    return int(as_number(name, value, 1, num_layers, integer=True))


def parse_strategy(raw: Mapping[str, Any], num_layers: int, caps: Caps) -> StrategyConfig:
    """The strategy config the controls describe; ValueError with a plain message for anything out of range."""
    name = as_choice("strategy", raw.get("strategy", "d3"), tuple(STRATEGY_LABELS))
    fill = as_choice("fill", raw.get("fill", "copy"), FILLS)
    if name == "d3":
        head, tail = default_core(num_layers)
        cfg: StrategyConfig = D3Config(
            alpha=as_number("alpha", raw.get("alpha", 0.99), 0, 1, lo_open=True),
            core_head=int(as_number("core_head", raw.get("core_head", head), 0, num_layers, integer=True)),
            core_tail=int(as_number("core_tail", raw.get("core_tail", tail), 0, num_layers, integer=True)),
            start=int(as_number("start", raw.get("start", 0), 0, caps.max_new_tokens, integer=True)),
            drop_order=as_choice("drop_order", raw.get("drop_order", "middle_out"), DROP_ORDERS), fill=fill)
    elif name == "skipdecode":
        cfg = SkipDecodeConfig(max_layers=_optional_layers("skipdecode_max", raw.get("skipdecode_max"), num_layers),
                               min_layers=_optional_layers("skipdecode_min", raw.get("skipdecode_min"), num_layers),
                               horizon=int(as_number("max_new_tokens", raw.get("max_new_tokens", 64), 1,
                                                     caps.max_new_tokens, integer=True)), fill=fill)
    elif name == "unified":
        cfg = UnifiedConfig(ratio=as_number("unified_ratio", raw.get("unified_ratio", 1.5), 1, 64), fill=fill)
    else:
        cfg = EarlyExitConfig(threshold=as_number("threshold", raw.get("threshold", 0.9), 0, 1, lo_open=True),
                              min_layers=min(4, num_layers), fill=fill)
    cfg.check_layers(num_layers)
    return cfg


def parse_generation(raw: Mapping[str, Any], caps: Caps) -> GenerationConfig:
    sampling = as_choice("decoding", raw.get("decoding", "greedy"), DECODINGS) == "sample"
    return GenerationConfig(
        max_new_tokens=int(as_number("max_new_tokens", raw.get("max_new_tokens", 64), 1, caps.max_new_tokens,
                                     integer=True)),
        temperature=as_number("temperature", raw.get("temperature", 0.8), 0, 5, lo_open=True) if sampling else 0.0,
        seed=int(as_number("seed", raw.get("seed", 0), 0, 2**31 - 1, integer=True)),
    )


def parse_controls(raw: Mapping[str, Any], num_layers: int, caps: Caps) -> tuple[StrategyConfig, GenerationConfig]:
    """(strategy, generation) configs from raw control values; ValueError naming the field and its range."""
    return parse_strategy(raw, num_layers, caps), parse_generation(raw, caps)


@dataclass(frozen=True)
class Schedule:
    """What the decay curve and the planned grid draw: no model needed."""

    strategy: StrategyConfig
    num_layers: int
    steps: int
    others: dict[str, StrategyConfig]  # other strategies' schedules, drawn on the same axes


def parse_schedule(raw: Mapping[str, Any], num_layers: int, caps: Caps) -> Schedule:
    """The planned schedule of the controls; ValueError like `parse_controls`."""
    strategy = parse_strategy(raw, num_layers, caps)
    steps = int(as_number("max_new_tokens", raw.get("max_new_tokens", 64), 1, caps.max_new_tokens, integer=True))
    d3 = strategy if isinstance(strategy, D3Config) else parse_strategy({**raw, "strategy": "d3"}, num_layers, caps)
    return Schedule(strategy, num_layers, steps, other_schedules(strategy, d3, num_layers, steps))


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
    model: str = DEFAULT_MODEL


def check_run(pool: ModelPool, raw: Mapping[str, Any]) -> RunSetup:
    """Validate every control without loading a known model (engine None); ValueError with a plain message."""
    caps = pool.caps
    prompt = clean_prompt(raw.get("prompt"), caps)
    chat = as_flag("chat_template", raw.get("chat_template", True))
    model = pool.check_name(raw.get("model", DEFAULT_MODEL))
    facts = pool.facts(model)
    strategy, gen = parse_controls(raw, facts.num_layers, caps)
    layer = int(as_number("attention_layer", raw.get("attention_layer", default_attention_layer(facts.num_layers)), 0,
                          facts.num_layers - 1, integer=True))
    others = parse_schedule(raw, facts.num_layers, caps).others
    return RunSetup(None, prompt, chat, strategy, gen, TraceConfig(attention_layers=(layer,)), 0, others, model)


def prepare_run(pool: ModelPool, raw: Mapping[str, Any]) -> RunSetup:
    """`check_run`, then the engine (loading the model on first use) and the prompt's token count."""
    setup = check_run(pool, raw)
    engine = pool.engine(setup.model)
    return replace(setup, engine=engine, prompt_tokens=check_prompt_tokens(engine, setup.prompt, setup.chat_template,
                                                                            pool.caps))


# ---------------------------------------------------------------- streaming two runs side by side


@dataclass(frozen=True)
class LiveUpdate:
    """Both runs so far. pane: which run just grew ("d3" or "full"; "" for phase changes).
    phase: streaming, comparing (the error views are being computed), done, or stopped."""

    d3: Trace | None
    full: Trace | None
    pane: str = ""
    phase: str = "streaming"
    comparison: Comparison | None = None

    @property
    def finished(self) -> bool:
        return self.phase in ("done", "stopped")


class _StopAware:
    """An engine view whose streams honour `should_stop`. Workaround: `d3.compare.compare` takes no
    should_stop, so without this its teacher-forced run could not be interrupted."""

    def __init__(self, engine: Engine, should_stop: Callable[[], bool]) -> None:
        self._engine = engine
        self._should_stop = should_stop

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Trace]:
        kwargs.setdefault("should_stop", self._should_stop)
        return self._engine.stream(*args, **kwargs)


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
               "full": record(engine, prompt, FullConfig(), gen, trace, **kwargs)}
    latest: dict[str, Trace | None] = {"d3": None, "full": None}
    recs: dict[str, Recorded] = {}
    for pane, (current, rec) in _round_robin(streams):
        latest[pane], recs[pane] = current, rec
        yield LiveUpdate(latest["d3"], latest["full"], pane)
    if should_stop() or not with_comparison or len(recs) < 2:
        yield LiveUpdate(latest["d3"], latest["full"], phase="stopped" if should_stop() else "done")
        return
    yield LiveUpdate(latest["d3"], latest["full"], phase="comparing")
    comparison = compare(_StopAware(engine, should_stop), prompt, strategy, gen, trace, chat_template=chat_template,
                         full=recs["full"], skip=recs["d3"])  # type: ignore[arg-type]
    recs.clear()
    stopped = should_stop()
    yield LiveUpdate(latest["d3"], latest["full"], phase="stopped" if stopped else "done",
                     comparison=None if stopped else comparison)


def fill_comparison(engine: Engine, prompt: str, strategy: StrategyConfig, gen: GenerationConfig, *,
                    chat_template: bool = True, should_stop: Callable[[], bool] = _never,
                    fills: tuple[str, ...] = FILLS) -> Iterator[tuple[str, Comparison]]:
    """The same prompt and schedule under each fill strategy, each against one shared full-depth run."""
    stoppable = _StopAware(engine, should_stop)
    kw = dict(chat_template=chat_template)
    full = run_recorded(stoppable, prompt, FullConfig(), gen, TRACE_OFF, **kw)  # type: ignore[arg-type]
    for fill in fills:
        if should_stop():
            return
        comparison = compare(stoppable, prompt, strategy.with_(fill=fill), gen, TRACE_OFF, full=full,  # type: ignore[arg-type]
                             **kw)
        if should_stop():
            return
        yield fill, comparison


def measured_speedup(skip: Trace | None, full: Trace | None) -> float | None:
    """Median decode-step time at full depth over the skipping run's, on the positions both reached.

    The first step (the prompt's prefill, full depth in both) is left out; the two runs interleave token
    by token in one process, so they see the same machine load."""
    if skip is None or full is None:
        return None
    n = min(len(skip.steps), len(full.steps))
    if n < 3:
        return None
    skip_ms = statistics.median(s.wall_ms for s in skip.steps[1:n])
    full_ms = statistics.median(s.wall_ms for s in full.steps[1:n])
    return full_ms / skip_ms if skip_ms > 0 else None


# ---------------------------------------------------------------- one person's session


@dataclass
class RunRecord:
    """A finished run, for the session's history table."""

    label: str
    summary: dict[str, Any]
    measured: float | None


@dataclass
class Session:
    """One person's runs: traces, comparison, fill comparison, history, and the stop flag. Lives in gr.State,
    so no two people ever share one. Only the newest run of a session may stream: starting a run stops
    the one before it within one decoding step."""

    d3: Trace | None = None
    full: Trace | None = None
    comparison: Comparison | None = None
    fills: dict[str, Comparison] = field(default_factory=dict)
    history: list[RunRecord] = field(default_factory=list)
    run_id: int = 0
    stop_at: float = -math.inf  # when Stop was last pressed (time.monotonic())
    triggered_at: float | None = None  # when the page last asked for a run that has not begun yet
    _since: dict[int, float] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def trigger(self) -> None:
        """A new run was asked for (before it waits in the queue): stop the running one now. A Stop
        pressed from here on also stops the new run, even while it still waits in the queue."""
        with self._lock:
            self.stop_at = self.triggered_at = time.monotonic()

    def begin(self) -> int:
        """Start a run; any earlier run of this session stops within one decoding step."""
        with self._lock:
            self.run_id += 1
            self._since = {self.run_id: self.triggered_at if self.triggered_at is not None else time.monotonic()}
            self.triggered_at = None
            return self.run_id

    def request_stop(self) -> None:
        self.stop_at = time.monotonic()

    def is_current(self, run_id: int) -> bool:
        return run_id == self.run_id

    def stopper(self, run_id: int) -> Callable[[], bool]:
        """should_stop for run `run_id`: Stop was pressed after it was asked for, or a newer run has begun."""
        since = self._since.get(run_id, math.inf)
        return lambda: run_id != self.run_id or self.stop_at > since

    def clear(self) -> None:
        """Forget the previous run's results when a new run starts (the history stays)."""
        self.d3 = self.full = self.comparison = None
        self.fills = {}

    def show(self, update: LiveUpdate) -> None:
        """Keep the traces of the run in progress: the views redraw from them."""
        self.d3, self.full, self.comparison = update.d3, update.full, update.comparison

    def finish(self, update: LiveUpdate, label: str) -> None:
        """Keep the finished run and add it to the history."""
        self.show(update)
        if update.d3 is not None and update.full is not None and update.d3.steps:
            summary = update.comparison.summary() if update.comparison else _stream_summary(update.d3, update.full)
            self.history.append(RunRecord(label, summary, measured_speedup(update.d3, update.full)))
            del self.history[:-50]  # bounded, like everything a session keeps

    def history_frame(self) -> pd.DataFrame:
        rows = [{"run": i + 1, "strategy": r.label, "tokens": r.summary["tokens"],
                 "mean layers": round(r.summary["mean_layers"], 2),
                 "theoretical ×": round(r.summary["theoretical_speedup"], 2),
                 "measured ×": None if r.measured is None else round(r.measured, 2),
                 "agreement": round(r.summary["agreement"], 3), "first divergence": r.summary["first_divergence"],
                 "KL teacher": _round(r.summary.get("kl_teacher_mean")), "KL free": _round(r.summary.get("kl_free_mean"))}
                for i, r in enumerate(self.history)]
        return pd.DataFrame(rows, columns=HISTORY_COLUMNS)


HISTORY_COLUMNS = ["run", "strategy", "tokens", "mean layers", "theoretical ×", "measured ×", "agreement",
                   "first divergence", "KL teacher", "KL free"]


def _round(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 4)


def _stream_summary(skip: Trace, full: Trace) -> dict[str, Any]:
    """A history row for a run stopped before its comparison: agreement from the tokens alone."""
    n = min(len(skip.steps), len(full.steps))
    differ = [i for i in range(n) if skip.steps[i].token_id != full.steps[i].token_id]
    return {"tokens": len(skip.steps), "mean_layers": skip.mean_layers,
            "theoretical_speedup": skip.theoretical_speedup(), "agreement": (n - len(differ)) / n if n else 1.0,
            "first_divergence": differ[0] if differ else None, "kl_teacher_mean": None, "kl_free_mean": None}


# ---------------------------------------------------------------- preset scenarios


@dataclass(frozen=True)
class Scenario:
    """Controls to set, then run; `runs` > 1 runs a second set of controls after the first (for contrasts)."""

    title: str
    text: str
    runs: tuple[dict[str, Any], ...]
    fills: bool = False  # also run the fill-strategy comparison


def _d3_defaults(num_layers: int) -> dict[str, Any]:
    head, tail = default_core(num_layers)
    return dict(strategy="d3", alpha=0.99, core_head=head, core_tail=tail, start=0, drop_order="middle_out",
                fill="copy", decoding="greedy")


SCENARIOS: dict[str, Scenario] = {
    "full_vs_d3": Scenario(
        "Full depth vs D3",
        "The default D3 schedule (α = 0.99, core layers at both ends) against the full model. Watch the D3 "
        "tokens get lighter as fewer layers run, and whether the text stays the same.",
        ({},)),
    "core": Scenario(
        "Why the core layers matter",
        "Two runs with the same α = 0.97: first with the default core, then with core depth 0, so D3 may also "
        "skip the first and last layers. Compare the two rows of the run history: without a core, agreement "
        "with full depth drops sooner, because the first and last layers change the hidden state the most "
        "(see Information flow).",
        ({"alpha": 0.97}, {"alpha": 0.97, "core_head": 0, "core_tail": 0})),
    "fill": Scenario(
        "What filling does",
        "Drop order 'strided' keeps evenly spaced flex layers, so a layer skipped by one token can run again "
        "for a later token and read that token's missing key/value entry. Filling decides what it reads. "
        "This runs fill 'none' (the hole is masked out) in the panes, then compares copy, propagate and none "
        "on the same prompt (Fill strategies tab). With the default nested drop orders no later token ever "
        "reads a hole, so the fill would make no difference.",
        ({"alpha": 0.97, "drop_order": "strided", "fill": "none"},), fills=True),
    "aggressive": Scenario(
        "Aggressive α: where it breaks",
        "α = 0.9 halves the depth within about 7 tokens and reaches the core floor soon after. The text "
        "usually drifts from full depth early: see where the first divergence lands and how the KL grows.",
        ({"alpha": 0.9},)),
}


def scenario_controls(key: str, step: int, num_layers: int) -> dict[str, Any]:
    """The control values of run `step` of scenario `key`: the D3 defaults with the scenario's changes."""
    scenario = SCENARIOS[as_choice("scenario", key, tuple(SCENARIOS))]
    return {**_d3_defaults(num_layers), **scenario.runs[min(step, len(scenario.runs) - 1)]}


def other_schedules(main: StrategyConfig, d3: D3Config, num_layers: int, steps: int = 128) -> dict[str, StrategyConfig]:
    """The other strategies' planned schedules to draw next to `main` on the decay curve (SkipDecode's
    budget falls over the same `steps` tokens as the run)."""
    candidates: dict[str, StrategyConfig] = {"D3": d3, "SkipDecode (auto)": SkipDecodeConfig(horizon=steps),
                                             "Unified 1.5×": UnifiedConfig(ratio=1.5)}
    out = {}
    for label, cfg in candidates.items():
        if cfg.name == main.name:
            continue
        try:
            cfg.check_layers(num_layers)
        except ValueError:
            continue  # a tiny model may not fit a baseline's defaults; leave it off the chart
        out[label] = cfg
    return out


# ---------------------------------------------------------------- the Sweep tab: a small, bounded sweep


@dataclass(frozen=True)
class SweepChoice:
    """One entry of the Sweep tab's fixed menu: a strategy tuned to a target mean depth (fraction of L)."""

    label: str
    strategy: str  # "d3", "skipdecode" or "unified"
    depth: float


SWEEP_MATCHED_DEPTH = 2 / 3  # the baselines run at this depth, as does the middle D3 setting
SWEEP_MENU: dict[str, SweepChoice] = {
    "d3_85": SweepChoice("D3 at 85% mean depth", "d3", 0.85),
    "d3_75": SweepChoice("D3 at 75% mean depth", "d3", 0.75),
    "d3_67": SweepChoice("D3 at 67% mean depth", "d3", SWEEP_MATCHED_DEPTH),
    "skipdecode_67": SweepChoice("SkipDecode at 67% (matched)", "skipdecode", SWEEP_MATCHED_DEPTH),
    "unified_67": SweepChoice("Unified Layer Skipping at 67% (matched)", "unified", SWEEP_MATCHED_DEPTH),
}
SWEEP_DEFAULT = ("d3_75", "d3_67", "skipdecode_67", "unified_67")
SWEEP_MAX_SETTINGS = 4
SWEEP_MAX_PROMPTS = 2
SWEEP_MAX_NEW_TOKENS = 24
SWEEP_MIN_NEW_TOKENS = 2
SWEEP_TABLE_COLUMNS = ["label", "strategy", "target_depth", "mean_layers", "theoretical_speedup", "measured_speedup",
                       "agreement", "first_divergence", "kl_teacher", "kl_free", "params"]


def sweep_bounds_text() -> str:
    return (f"Bounded on the server: at most {SWEEP_MAX_SETTINGS} settings from the menu (plus the full-depth "
            f"reference row), {SWEEP_MAX_PROMPTS} prompts, {SWEEP_MAX_NEW_TOKENS} new tokens, 1 repeat; "
            "no perplexity or task accuracy.")


def sweep_spec(model: str, prompts: Any, choices: Any, new_tokens: Any, chat_template: Any, caps: Caps) -> "SweepSpec":
    """The SweepSpec of a Sweep-tab request, within the tab's bounds; ValueError with a plain message otherwise.

    prompts: text, one prompt per line (blank lines ignored)."""
    from d3.sweep import SweepSpec

    if isinstance(prompts, str) and len(prompts) > caps.max_prompt_chars:
        raise ValueError(f"prompts are {len(prompts):,} characters long; the limit is {caps.max_prompt_chars:,}")
    if not isinstance(prompts, str) or not prompts.strip():
        raise ValueError("prompt is empty: type one or two prompts, one per line")
    lines = [clean_prompt(line, caps).strip() for line in prompts.splitlines() if line.strip()]
    if not lines:
        raise ValueError("prompt is empty: type one or two prompts, one per line")
    if len(lines) > SWEEP_MAX_PROMPTS:
        raise ValueError(f"{len(lines)} prompts given; the sweep takes at most {SWEEP_MAX_PROMPTS} (one per line)")
    if isinstance(choices, str):
        choices = [choices]
    if not isinstance(choices, (list, tuple)) or not choices:
        raise ValueError("no settings chosen: tick at least one setting to sweep")
    keys = list(dict.fromkeys(as_choice("setting", c, tuple(SWEEP_MENU)) for c in choices))
    if len(keys) > SWEEP_MAX_SETTINGS:
        raise ValueError(f"{len(keys)} settings chosen; the sweep runs at most {SWEEP_MAX_SETTINGS}: untick some")
    tokens = int(as_number("new_tokens", new_tokens, SWEEP_MIN_NEW_TOKENS, min(SWEEP_MAX_NEW_TOKENS, max(
        caps.max_new_tokens, SWEEP_MIN_NEW_TOKENS)), integer=True))
    picked = [SWEEP_MENU[k] for k in keys]
    d3_depths = tuple(c.depth for c in picked if c.strategy == "d3")
    baselines = tuple(dict.fromkeys(c.strategy for c in picked if c.strategy != "d3"))
    return SweepSpec(model=model, prompts=tuple(lines), max_new_tokens=tokens, repeats=1, depths=d3_depths,
                     baselines=baselines, baseline_depths=(SWEEP_MATCHED_DEPTH,) if baselines else None,
                     ppl_chunks=0, chat_template=as_flag("chat_template", chat_template))


def run_small_sweep(engine: Engine, spec: "SweepSpec", progress: Callable[[float, str], None] | None = None) -> pd.DataFrame:
    """Run `spec` on `engine` into a fresh temporary CSV (never resumed from an earlier sweep); the table."""
    import tempfile
    from pathlib import Path

    from d3.sweep import run_sweep

    with tempfile.TemporaryDirectory(prefix="d3-sweep-") as folder:
        return run_sweep(spec, Path(folder) / "sweep.csv", engine=engine, progress=progress)


def sweep_table(df: pd.DataFrame) -> pd.DataFrame:
    """The columns the Sweep tab shows (rounded), one row per setting, in the sweep's order."""
    table = df.reindex(columns=SWEEP_TABLE_COLUMNS).reset_index(drop=True)
    numeric = [c for c in SWEEP_TABLE_COLUMNS if c not in ("label", "strategy", "params")]
    table[numeric] = table[numeric].apply(pd.to_numeric, errors="coerce").round(4)
    return table


def sweep_controls(row: Mapping[str, Any]) -> dict[str, Any]:
    """Live-control values that reproduce one sweep row (`params` is its strategy config as JSON).

    ValueError for the full-depth reference row (the right pane always runs full depth)."""
    from d3.config import strategy_from_dict

    params = json.loads(row["params"]) if isinstance(row["params"], str) else dict(row["params"])
    cfg = strategy_from_dict(dict(params))
    layers = int(row["num_layers"])
    if cfg.name not in STRATEGY_LABELS:
        raise ValueError("this row is the full-depth reference, which the right pane always runs: pick another row")
    out: dict[str, Any] = {"strategy": cfg.name, "fill": cfg.fill, "max_new_tokens": int(row["new_tokens"])}
    if isinstance(cfg, D3Config):
        head, tail = cfg.core(layers)
        out.update(alpha=cfg.alpha, core_head=head, core_tail=tail, start=cfg.start, drop_order=cfg.drop_order)
    elif isinstance(cfg, SkipDecodeConfig):
        hi, lo = cfg.bounds(layers)
        out.update(skipdecode_max=hi, skipdecode_min=lo)
    elif isinstance(cfg, UnifiedConfig):
        out.update(unified_ratio=cfg.ratio)
    return out
