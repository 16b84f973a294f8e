"""The Live tab's controls, written once: one frozen `Controls` of raw page values, the handler signatures and
API parameter names made from it, and its parsing into validated configs."""

from __future__ import annotations

import functools
import inspect
import math
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable

import numpy as np

from d3.config import (
    DEFAULT_MODEL,
    DROP_ORDERS,
    Param,
    FILLS,
    D3Config,
    EarlyExitConfig,
    GenerationConfig,
    SkipDecodeConfig,
    StrategyConfig,
    UnifiedConfig,
    core_fits,
    default_core,
    max_core_side,
    params,
)
from d3.orders import CHAT_ORDERS, MEASURED
from d3.schedule import plan
from explorer.caps import Caps
from explorer.parse import as_choice, as_number, shown, whole

# Strategies a person can put against full depth, with the names the page shows (each strategy's own label).
STRATEGIES: tuple[type[StrategyConfig], ...] = (D3Config, SkipDecodeConfig, UnifiedConfig, EarlyExitConfig)
STRATEGY_LABELS: dict[str, str] = {cls.name: cls.label for cls in STRATEGIES}
STRATEGY_CLASSES: dict[str, type[StrategyConfig]] = {cls.name: cls for cls in STRATEGIES}
# The fill control's first choice: each strategy's own default fill (D3's copy, early exit's propagate), so that the
# page's one fill control never hands one strategy another's default.
OWN_FILL = "default"
FILL_CHOICES = (OWN_FILL, *FILLS)
DECODINGS = ("greedy", "sample")
# The controls that are a config field (d3.config's registry): the page's name (the API's parameter) -> (config
# class, field). Their defaults, ranges, labels and help come from the field's `Param`, said once in d3/config.py.
FIELDS: dict[str, tuple[type, str]] = {
    "alpha": (D3Config, "alpha"), "core_head": (D3Config, "core_head"), "core_tail": (D3Config, "core_tail"),
    "start": (D3Config, "start"), "drop_order": (D3Config, "drop_order"), "fill": (StrategyConfig, "fill"),
    "unified_ratio": (UnifiedConfig, "ratio"), "skipdecode_max": (SkipDecodeConfig, "max_layers"),
    "skipdecode_min": (SkipDecodeConfig, "min_layers"), "threshold": (EarlyExitConfig, "threshold"),
    "max_new_tokens": (GenerationConfig, "max_new_tokens"), "temperature": (GenerationConfig, "temperature"),
    "seed": (GenerationConfig, "seed"),
}


def param_of(name: str) -> Param:
    cls, key = FIELDS[name]
    return params(cls)[key]


# Each control as the page labels it: a config field's own label, the page's own controls' here. Messages on the
# page name fields by these (`page_words`).
LABELS: dict[str, str] = {
    **{name: param_of(name).label for name in FIELDS},
    "attention_layer": "Attention layer to record", "attention_head": "Head", "layer_order": "Calibrated order",
    "strategy": "Strategy", "decoding": "Decoding", "prompt": "Prompt", "model": "Model",
    "sweep_prompts": "Prompts", "sweep_settings": "Settings", "sweep_tokens": "New tokens per run",
}
HELP: dict[str, str] = {name: param_of(name).help for name in FIELDS}
# The page's narrower ranges, one overlay over the registry's (each within its field's `Param` range): α's slider
# shows the part of (0, 1] where a decay leaves anything to look at; temperature's the part worth sampling at. The
# sliders, the checks of a typed value, the needs view's slider and a sweep row's loading all read this table.
PAGE_RANGES: dict[str, tuple[float, float]] = {"alpha": (0.8, 1.0), "temperature": (0.05, 2.0)}
ALPHA_STEP = 0.001  # the α slider's step


def page_param(name: str) -> Param:
    """A control's Param as the page allows it: the registry's, narrowed by `PAGE_RANGES`."""
    p = param_of(name)
    return p.narrowed(*PAGE_RANGES[name]) if name in PAGE_RANGES else p
METRICS = ("both", "cos", "dist")


def control(default: Any, *, redraws: bool = False) -> Any:
    """A field of `Controls`; `redraws`: changing it redraws the schedule preview (decay curve, planned grid)."""
    return field(default=default, metadata={"redraws": redraws})


@dataclass(frozen=True)
class Controls:
    """Every control of the Live tab as the page (or an API call) sent it, raw: nothing here is validated until
    it is parsed (`strategy_config`, `generation`, `parse_schedule`). The field order is the order of the page's inputs and
    of the API's parameters; the defaults are the page's initial values. None for core_head, core_tail and
    attention_layer means the model's default (the page sends the model's own numbers)."""

    prompt: Any = ""
    model: Any = control(DEFAULT_MODEL, redraws=True)
    chat_template: Any = True
    strategy: Any = control("d3", redraws=True)
    alpha: Any = control(D3Config.alpha, redraws=True)  # the engine's default decay: the page's one source of it
    core_head: Any = control(None, redraws=True)
    core_tail: Any = control(None, redraws=True)
    start: Any = control(param_of("start").default, redraws=True)
    drop_order: Any = control(param_of("drop_order").default, redraws=True)
    layer_order: Any = control("", redraws=True)  # with drop_order "calibrated": the flex layers, dropped first first
    fill: Any = control(OWN_FILL, redraws=True)  # OWN_FILL: the chosen strategy's own default
    max_new_tokens: Any = control(param_of("max_new_tokens").default, redraws=True)
    decoding: Any = "greedy"
    temperature: Any = 0.8
    seed: Any = param_of("seed").default
    unified_ratio: Any = control(param_of("unified_ratio").default, redraws=True)
    skipdecode_max: Any = control(0, redraws=True)
    skipdecode_min: Any = control(0, redraws=True)
    threshold: Any = control(param_of("threshold").default, redraws=True)
    attention_layer: Any = None
    attention_head: Any = 0
    logit_lens: Any = True  # record the lens while generating (the Logit lens and Token scrubber views read it)
    metric: Any = "both"
    log_kl: Any = False
    presentation: Any = control(False, redraws=True)

    def with_(self, **changes: Any) -> "Controls":
        return replace(self, **changes)

    def strategy_config(self, num_layers: int, caps: Caps) -> StrategyConfig:
        """The strategy config the controls describe; ValueError with a plain message for anything out of range."""
        return parse_strategy(self, num_layers, caps)

    def generation(self, caps: Caps) -> GenerationConfig:
        sampling = as_choice("decoding", self.decoding, DECODINGS) == "sample"
        return GenerationConfig(
            max_new_tokens=self.new_tokens(caps),
            temperature=as_param("temperature", self.temperature, lo_open=True) if sampling else 0.0,
            seed=int(as_param("seed", self.seed)))

    def new_tokens(self, caps: Caps) -> int:
        return int(as_param("max_new_tokens", self.max_new_tokens, hi=caps.max_new_tokens))

    def attention_layer_index(self, num_layers: int) -> int:
        """The layer whose attention is recorded: validated, since it changes what a run records."""
        value = default_attention_layer(num_layers, self.model) if self.attention_layer is None else self.attention_layer
        return int(as_number("attention_layer", value, 0, num_layers - 1, integer=True))

    @property
    def view(self) -> "ViewOptions":
        """View settings, made safe: they only change how a trace is drawn, so junk falls back to a default."""
        return ViewOptions(layer=whole(self.attention_layer), head=whole(self.attention_head),
                           metric=self.metric if self.metric in METRICS else "both", log_kl=self.log_kl is True,
                           presentation=self.presentation is True)


CONTROL_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Controls))
REDRAW_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Controls) if f.metadata.get("redraws"))
DEFAULTS = Controls()


@dataclass(frozen=True)
class ViewOptions:
    """How the views draw a trace (never what runs)."""

    layer: int = 0
    head: int = 0
    metric: str = "both"
    log_kl: bool = False
    presentation: bool = False


def takes_controls(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn(..., controls: Controls)` as `fn(..., prompt, model, ...)`, one parameter per control in page order.

    Gradio passes a handler's inputs positionally and names the API's parameters after its signature, so every
    handler that reads the controls gets the same list from `Controls`; direct callers may use keywords, and
    controls they leave out take the page's defaults."""
    signature = inspect.signature(fn)
    leading = list(signature.parameters.values())[:-1]
    own = [inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=f.default)
           for f in fields(Controls)]
    combined = signature.replace(parameters=[*leading, *own])

    def split(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], Controls]:
        bound = combined.bind(*args, **kwargs)
        bound.apply_defaults()
        values = bound.arguments
        return [values[p.name] for p in leading], Controls(**{n: values[n] for n in CONTROL_NAMES})

    if inspect.isgeneratorfunction(fn):  # Gradio streams only from a generator function
        @functools.wraps(fn)
        def streaming(*args: Any, **kwargs: Any) -> Any:
            first, controls = split(args, kwargs)
            yield from fn(*first, controls)
        wrapper = streaming
    else:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            first, controls = split(args, kwargs)
            return fn(*first, controls)
    wrapper.__signature__ = combined  # type: ignore[attr-defined]
    return wrapper


# ---------------------------------------------------------------- parsing into configs


ATTENTION_RUN_SHARE = 0.75  # the default attention layer runs for about this share of the default run's tokens


def default_attention_layer(num_layers: int, model: Any = None) -> int:
    """The default attention layer of a model (see `_default_attention_layer`), worked out once per model."""
    return _default_attention_layer(num_layers, None if model is None else str(model))


@functools.lru_cache(maxsize=64)
def _default_attention_layer(num_layers: int, model: str | None) -> int:
    """The flex layer the page's default D3 run keeps for about three quarters of its tokens: most D3 rows of the
    attention view show the head at work next to full depth, and the last rows, where the decay dropped the
    layer, are grey. (The first layer the schedule drops is skipped from the first tokens on: a blank panel.)"""
    head, tail = default_core(num_layers)
    try:
        cfg = parse_strategy(model_defaults(model).with_(strategy="d3"), num_layers, Caps())
        tokens = DEFAULTS.new_tokens(Caps())
    except ValueError:
        return min(head, num_layers - 1)
    counts = np.zeros(num_layers)
    for step in range(tokens):
        counts[list(plan(cfg, num_layers, step).run)] += 1
    flex = [layer for layer in range(head, num_layers - tail) if counts[layer] < tokens] or [min(head, num_layers - 1)]
    return min(flex, key=lambda layer: (abs(counts[layer] - ATTENTION_RUN_SHARE * tokens), layer))


def as_param(name: str, value: Any, *, hi: float | None = None, lo_open: bool | None = None) -> Any:
    """A control's value converted to a number and checked against its config field's range (d3.config's registry),
    narrowed where the server allows less (`hi`, the server's cap) or the page asks more (`lo_open`); ValueError
    naming the control by its API name (the page words it with its label: `page_words`)."""
    p = param_of(name)
    top = p.hi if p.hi is not None else math.inf
    number = as_number(name, value, -math.inf if p.lo is None else p.lo, top if hi is None else min(top, hi),
                       integer=p.integer, lo_open=p.lo_open if lo_open is None else lo_open)
    return int(number) if p.integer else number


def _optional_layers(name: str, value: Any, num_layers: int) -> int | None:
    """0 (or empty) means auto for SkipDecode's bounds."""
    if value in (None, "", 0, 0.0, "0"):
        return None
    return int(as_number(name, value, 1, num_layers, integer=True))


def _core_layer(name: str, value: Any, default: int, num_layers: int) -> int:
    return int(as_number(name, default if value is None else value, 0, num_layers, integer=True))


ORDER_CHARS_PER_LAYER = 8  # "17, " is 4: room for spaces, never for a 5,000-digit number


def parse_layer_order(value: Any, num_layers: int) -> tuple[int, ...]:
    """"3, 4, 17" (or a list of them) -> (3, 4, 17); ValueError saying what to type. Its length is bounded before
    it is split (an order has at most as many entries as the model has layers), so a huge text costs nothing."""
    how = ("layer_order: with drop order 'calibrated', type the flex layers in the order they are dropped "
           "(e.g. 3, 4, 17, ...) or press “Use this order” in Which layers matter")
    if isinstance(value, (list, tuple)):
        if len(value) > num_layers:
            raise ValueError(f"layer_order has {len(value):,} entries: at most this model's {num_layers} layers")
        value = ",".join(map(str, value))
    text = value if isinstance(value, str) else str(value or "")[:ORDER_CHARS_PER_LAYER * num_layers + 1]
    if len(text) > ORDER_CHARS_PER_LAYER * num_layers:
        raise ValueError(f"layer_order is {len(text):,} characters long: at most {ORDER_CHARS_PER_LAYER * num_layers} "
                         f"for this model's {num_layers} layers")
    parts = [p for p in text.replace(" ", ",").split(",") if p]
    if not parts or not all(p.isdigit() and len(p) <= len(str(num_layers)) for p in parts):
        raise ValueError(how + (f" (got {text[:40]!r})" if text.strip() else ""))
    if len(parts) > num_layers:
        raise ValueError(f"layer_order has {len(parts):,} entries: at most this model's {num_layers} layers")
    return tuple(int(p) for p in parts)


def layer_order_text(order: tuple[int, ...] | None) -> str:
    return ", ".join(map(str, order or ()))


# The page's D3 settings per embedded model and kind of text: the order calibrated on that kind of text
# (d3/orders.py: CHAT_ORDERS on chat prompts, MEASURED on worked arithmetic; docs/drop_order.md), at the measured
# α. The page's default prompt is chat text, so it starts with the chat order where one ships (on SmolLM2 the
# arithmetic order sent the sky prompt into wrong physics at token 16; issue 24); the arithmetic scenarios ask for
# the arithmetic one. Other models (a local directory, the tests' tiny one) and API calls that leave them out keep
# the engine's own defaults (the paper's literal middle-out at α 0.99).
TEXT_KINDS = ("chat", "arithmetic")
PAGE_MODELS = {"smollm2-135m": (0.998, (3, 3)), "gemma3-270m": (0.998, (2, 2)),
               "qwen2.5-coder-1.5b": (0.99, (3, 3))}  # docs/models.md: keeps the worked answer at 24.5 of 28 layers
# (Qwen: its chat order on chat text, the drop-order study's order on arithmetic; the "deeper model" scenario asks
# for middle-out itself)
# Each model's default new tokens: the most, in steps of 8 up to 64, whose default run (both panes, tracing, the
# comparison) is predicted to end within half of D3_MAX_RUN_S on the shared 2-core CPU with another visitor's default
# run beside it (scripts/default_tokens.py; the figures are in docs/speed.md). A person or an API call may ask more.
PAGE_TOKENS = {"smollm2-135m": 32, "gemma3-270m": 24, "qwen2.5-coder-1.5b": 8}


def calibrated_order(model: str, core: tuple[int, int], kind: str = "chat") -> tuple[int, ...] | None:
    """The order calibrated for `model` and `core` on `kind` of text (the arithmetic one where no chat one ships)."""
    orders = CHAT_ORDERS if kind == "chat" else MEASURED
    return orders.get(model, {}).get(core) or MEASURED.get(model, {}).get(core)


def model_defaults(model: Any, kind: str = "chat") -> Controls:
    """The page's controls for `model` and `kind` of text: its calibrated D3 setting where there is one, else the
    engine's defaults; its default new tokens (`PAGE_TOKENS`)."""
    if str(model) not in PAGE_MODELS:
        return DEFAULTS
    alpha, core = PAGE_MODELS[str(model)]
    own = DEFAULTS.with_(alpha=alpha, max_new_tokens=PAGE_TOKENS.get(str(model), DEFAULTS.max_new_tokens))
    order = calibrated_order(str(model), core, kind)
    if order is None:  # no calibration ships for this kind (Qwen's arithmetic): the paper's middle-out at its α
        return own.with_(drop_order="middle_out", layer_order="")
    return own.with_(drop_order="calibrated", layer_order=layer_order_text(order))


def _drop_order(c: Controls, num_layers: int) -> dict[str, Any]:
    """drop_order and, when calibrated, the order fitted to the core (`fitted`; the page says so as the core moves)."""
    order = as_choice("drop_order", c.drop_order, DROP_ORDERS)
    c, _ = fitted(c, num_layers)
    if order != "calibrated":
        return {"drop_order": order}
    return {"drop_order": order, "layer_order": parse_layer_order(c.layer_order, num_layers)}


def _field_value(name: str, c: Controls, num_layers: int, caps: Caps) -> Any:
    """A config-field control's value, checked against its field's range (narrowed where the page or the server
    allows less), whichever strategy is chosen."""
    value = getattr(c, name)
    if name in ("core_head", "core_tail"):
        head, tail = default_core(num_layers)
        return _core_layer(name, value, head if name == "core_head" else tail, num_layers)
    if name == "start":
        return int(as_number("start", value, 0, caps.max_new_tokens, integer=True))
    if name in ("skipdecode_max", "skipdecode_min"):
        return _optional_layers(name, value, num_layers)
    if name == "fill":
        return as_choice("fill", value, FILL_CHOICES)
    if name == "drop_order":
        return as_choice("drop_order", value, DROP_ORDERS)
    return as_param(name, value)


def parse_strategy(c: Controls, num_layers: int, caps: Caps) -> StrategyConfig:
    """The strategy config of the controls; ValueError naming the field and its range. Every config-field control
    is checked, the chosen strategy's and the others' alike (a field the strategy does not read takes no NaN, dict
    or megabyte of text either); the chosen strategy's own fields are built from them (`FIELDS`), its other fields
    keep their registry defaults, except the few the page sets from the run (SkipDecode's horizon: the run's
    length; early exit's min layers: at most the model's)."""
    cls = STRATEGY_CLASSES[as_choice("strategy", c.strategy, tuple(STRATEGY_CLASSES))]
    values = {name: _field_value(name, c, num_layers, caps) for name, (owner, _) in FIELDS.items()
              if owner is not GenerationConfig}
    if c.drop_order != "calibrated" or cls is not D3Config:  # read only then: else the parse bounds it itself
        _check_unused_order(c, num_layers)
    own = {key: values[name] for name, (owner, key) in FIELDS.items() if name in values and issubclass(cls, owner)}
    if own.get("fill") == OWN_FILL:
        own["fill"] = params(cls)["fill"].default
    if cls is D3Config:
        own.update(_drop_order(c, num_layers))
    elif cls is SkipDecodeConfig:
        own["horizon"] = c.new_tokens(caps)
    elif cls is EarlyExitConfig:
        own["min_layers"] = min(params(EarlyExitConfig)["min_layers"].default, num_layers)
    cfg = cls(**own)
    cfg.check_layers(num_layers)
    return cfg


def _check_unused_order(c: Controls, num_layers: int) -> None:
    """The calibrated order's box, read or not, holds text of a bounded length (a list: of bounded entries)."""
    value = c.layer_order
    limit = ORDER_CHARS_PER_LAYER * max(num_layers, REFIT_FROM_LAYERS)
    if isinstance(value, (list, tuple)):
        if len(value) > max(num_layers, REFIT_FROM_LAYERS) or not all(isinstance(x, (int, str)) for x in value):
            raise ValueError(f"layer_order must be a list of at most {max(num_layers, REFIT_FROM_LAYERS)} layer numbers "
                             "(unused unless D3's drop order is calibrated)")
        return
    if value is not None and not isinstance(value, str):
        raise ValueError(f"layer_order={shown(value)} is not allowed: layer_order must be text (e.g. 3, 4, 17)")
    if value is not None and len(value) > limit:
        raise ValueError(f"layer_order is {len(value):,} characters long: at most {limit} (unused unless D3's drop "
                         "order is calibrated)")


def slider_ranges(c: Controls, num_layers: int, caps: Caps) -> dict[str, tuple[float, float, bool]]:
    """The page's sliders: name -> (min, max, integer), derived from the one state of the controls: each core
    slider reaches as far as the other leaves at least one flex layer (head + tail < L). The page sets the
    sliders' maxima from this (`derived`) and checks a typed value against it (`check_sliders`)."""
    head, tail = _core_or_default(c, num_layers)
    return {"alpha": (*PAGE_RANGES["alpha"], False), "core_head": (0, max_core_side(tail, num_layers), True),
            "core_tail": (0, max_core_side(head, num_layers), True), "start": (0, caps.max_new_tokens, True),
            "temperature": (*PAGE_RANGES["temperature"], False), "attention_layer": (0, num_layers - 1, True)}


def _core_or_default(c: Controls, num_layers: int) -> tuple[int, int]:
    """The core the controls ask for, each side read leniently (a bad value counts as the model's default)."""
    head, tail = default_core(num_layers)
    top = num_layers - 1
    h = head if c.core_head is None else min(max(whole(c.core_head, head), 0), top)
    t = tail if c.core_tail is None else min(max(whole(c.core_tail, tail), 0), top)
    return h, t


def core_of(c: Controls, num_layers: int) -> tuple[int, int]:
    """(head, tail) as the controls ask for them, each read leniently (see `slider_ranges`)."""
    return _core_or_default(c, num_layers)


def clamped_core(c: Controls, num_layers: int, last: tuple[int, int] | None) -> Controls:
    """The controls with a core value typed past its slider's end set to that end, as the browser sets it when the
    box loses focus. That end is what the other side leaves (head + tail < L), the other side being the one the
    person did not just change (`last`: the core as it was last settled; None: nothing is clamped)."""
    if last is None:
        return c
    head, tail = _core_or_default(c, num_layers)
    if head == last[0] and tail != last[1]:
        tail = min(tail, max_core_side(head, num_layers))
    elif tail == last[1] and head != last[0]:
        head = min(head, max_core_side(tail, num_layers))
    return c.with_(core_head=head, core_tail=tail)


def _reworded(message: str, word: Callable[[str], str]) -> str:
    """`message` with each field it names (a parameter name before `=`, ` must`, ` is `, `:` or ` + `) as `word`
    writes it."""
    pattern = "|".join(sorted(map(re.escape, LABELS), key=len, reverse=True))
    return re.sub(rf"\b({pattern})(?==| must| is |:| \+ )", lambda m: word(m.group(1)), message)


def page_words(message: str) -> str:
    """A message worded for the API (fields by parameter name) worded for the page (fields as the page labels
    them): `core_head=99 ...` -> `Core head=99 ...`."""
    return _reworded(message, LABELS.__getitem__)


def both_words(message: str) -> str:
    """A message that both a person on the page and an API caller read (a raised gr.Error): each field by its
    label and its parameter name, `max_new_tokens must ...` -> `New tokens (max_new_tokens) must ...`,
    `alpha must ...` -> `α (decay rate, alpha) must ...`; a label that is its name stays one word."""
    def word(name: str) -> str:
        label = LABELS[name]
        if label.lower() == name:
            return label
        return f"{label[:-1]}, {name})" if label.endswith(")") else f"{label} ({name})"
    return _reworded(message, word)


def check_sliders(c: Controls, num_layers: int, caps: Caps, last: tuple[int, int] | None = None) -> None:
    """ValueError naming the slider as the page labels it, with its real range (None: the default). `last`: the
    core as last settled, so that a core value typed past its end is judged against the range the other side
    leaves (and the message names the one typed)."""
    for name, (lo, hi, integer) in slider_ranges(clamped_core(c, num_layers, last), num_layers, caps).items():
        value = getattr(c, name)
        if value is not None:
            as_number(LABELS[name], value, lo, hi, integer=integer)


def refit_order(order: tuple[int, ...], model: Any, num_layers: int, head: int, tail: int,
                kind: str = "chat") -> tuple[int, ...]:
    """A calibrated order made to fit the core (head, tail): the order the page ships for that core, model and `kind`
    of text where there is one (`calibrated_order`: a reset to the page's core gives back the page's own order),
    else `order` restricted to the new flex layers in the same order, followed by the layers the core gave up
    (nearest the middle first: they were kept, so they go last)."""
    flex = range(head, num_layers - tail)
    shipped = calibrated_order(str(model), (head, tail), kind)
    if shipped is not None and sorted(shipped) == list(flex):
        return tuple(shipped)
    kept = [layer for layer in order if layer in flex]
    middle = (num_layers - 1) / 2
    freed = sorted((layer for layer in flex if layer not in kept), key=lambda layer: (abs(layer - middle), layer))
    return (*kept, *freed)


REFIT_FROM_LAYERS = 256  # an order made for another model (up to this many layers) may be re-fitted, still bounded


def fitted(c: Controls, num_layers: int, kind: str = "chat") -> tuple[Controls, str]:
    """The controls with a calibrated order that fits their core, and one line saying what changed ("" when
    nothing did); `kind`: the kind of text the prompt is (the order the page ships for it is preferred). Only an
    order of distinct layers is re-fitted (one calibrated for another core or model, or typed
    short: no dead end, issue 24); anything else is left for the parse to refuse with what to type."""
    if c.drop_order != "calibrated":
        return c, ""
    try:
        order = parse_layer_order(c.layer_order, max(num_layers, REFIT_FROM_LAYERS))  # another model's order too
        head = int(as_number("core_head", default_core(num_layers)[0] if c.core_head is None else c.core_head,
                             0, num_layers - 1, integer=True))
        tail = int(as_number("core_tail", default_core(num_layers)[1] if c.core_tail is None else c.core_tail,
                             0, num_layers - 1, integer=True))
    except ValueError:
        return c, ""
    if len(set(order)) != len(order) or not core_fits(head, tail, num_layers) \
            or sorted(order) == list(range(head, num_layers - tail)):
        return c, ""
    new = refit_order(order, c.model, num_layers, head, tail, kind)
    how = (f"the page's order for this core on {kind} text"
           if tuple(calibrated_order(str(c.model), (head, tail), kind) or ()) == new
           else "the same order over the new flex layers")
    note = (f"Calibrated order re-fitted to core {head} + {tail} ({how}: flex layers {head}–{num_layers - tail - 1}, "
            f"starting {layer_order_text(new[:4])}, …).")
    return c.with_(layer_order=layer_order_text(new)), note


def derived(c: Controls, num_layers: int, caps: Caps) -> dict[str, Any]:
    """What the page shows that follows from the controls: the core sliders' maxima (head + tail < L). A dict of
    component updates, set by the server and listened to by nothing, so it can start no other update."""
    ranges = slider_ranges(c, num_layers, caps)
    return {name: {"maximum": max(int(ranges[name][1]), 1), "interactive": ranges[name][1] > 0}
            for name in ("core_head", "core_tail")}


def parse_controls(c: Controls, num_layers: int, caps: Caps) -> tuple[StrategyConfig, GenerationConfig]:
    """(strategy, generation) configs from the controls; ValueError naming the field and its range."""
    return parse_strategy(c, num_layers, caps), c.generation(caps)


@dataclass(frozen=True)
class Schedule:
    """What the decay curve and the planned grid draw: no model needed."""

    strategy: StrategyConfig
    num_layers: int
    steps: int
    others: dict[str, StrategyConfig] = field(default_factory=dict)  # other strategies, drawn on the same axes


def parse_schedule(c: Controls, num_layers: int, caps: Caps) -> Schedule:
    """The planned schedule of the controls; ValueError like `parse_controls`."""
    return schedule_of(c, parse_strategy(c, num_layers, caps), num_layers, caps)


def schedule_of(c: Controls, strategy: StrategyConfig, num_layers: int, caps: Caps) -> Schedule:
    """The planned schedule of `strategy`, already parsed from `c` (D3's own is parsed only when another strategy
    runs: it is drawn beside it)."""
    steps = c.new_tokens(caps)
    d3 = strategy if isinstance(strategy, D3Config) else parse_strategy(c.with_(strategy="d3"), num_layers, caps)
    assert isinstance(d3, D3Config)
    return Schedule(strategy, num_layers, steps, other_schedules(strategy, d3, num_layers, steps))


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
