"""The Live tab's controls, written once: one frozen `Controls` of raw page values, the handler signatures and
API parameter names made from it, and its parsing into validated configs."""

from __future__ import annotations

import functools
import inspect
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, make_dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from d3.config import (
    DEFAULT_MODEL,
    DROP_ORDERS,
    FILLS,
    D3Config,
    EarlyExitConfig,
    GenerationConfig,
    Param,
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
# The rules of the controls and the run, written once (issue 43; the code that keeps each names it "RULES"):
RULES = """
A typed value: a value typed into a slider's box runs nothing, when the box is left (Tab, Enter, a click elsewhere,
  a click on Stop) or not: the controls settle (bounds, a re-fitted order, the status line's message) and the curve
  follows. A core value typed past its slider's end counts as that end, the end the other side leaves (head + tail
  below L, the other side as last settled, or the model's default core on a fresh page): the boxes, both sliders'
  ends, the curve, the status line and the run that Generate starts all show that one core
  (`clamped_core`). Only a slider let go by a pointer (its track, its reset) runs, and only on valid controls.
Stop: stops this session's run within one token, and a run still waiting begins and stops at once; it never
  starts a run. Idle, it says "Nothing is running." with how the last run ended.
A model switch: stops this session's run, which shows nothing more (its panes are emptied for the new model), and
  sets the controls to the model's own; no run follows.
The status line says "Stopped." only after Stop (or the time limit): a run stopped because a newer one was asked
  for leaves the status to that run ("A new run is asked for…", then its own), and a model switch says the model.
"""
METRICS = ("both", "cos", "dist")
ALPHA_STEP = 0.001  # the α slider's step
WIDGETS = ("slider", "number", "dropdown", "text", "checkbox", "radio")
LINKS = ("number", "text", "flag")


@dataclass(frozen=True)
class Control:
    """One control of the Live tab, said once (the page builds, parses, bounds, wires, links and previews it from
    this). param: what it allows, its label and help: a config field's own `Param` (d3.config's registry) or the
    page's own; field: the (config class, field) it sets, None for the page's own controls; widget: how the page
    shows it (`WIDGETS`); page: the page's narrower range, an overlay of the registry's (never wider); scope: "run"
    (what a run does) or "view" (how a run is drawn); redraws: changing it redraws the schedule preview; settles: a
    person's move of it settles the controls (bounds, a re-fitted order, a message); release: a slider whose
    pointer release regenerates, and which the browser's preview follows while it moves; link: how a share link
    stores it (`LINKS`); elem_id: its element's id on the page ("" none); preview: the name the decay curve's
    meta and the browser's preview know it by ("" not previewed)."""

    name: str
    param: Param
    widget: str = "number"
    field: tuple[type, str] | None = None
    page: tuple[float, float] | None = None
    scope: str = "run"
    redraws: bool = False
    settles: bool = False
    release: bool = False
    link: str = "number"
    elem_id: str = ""
    preview: str = ""

    def __post_init__(self) -> None:
        assert self.widget in WIDGETS and self.link in LINKS and self.scope in ("run", "view"), self

    @property
    def label(self) -> str:
        return self.param.label

    @property
    def help(self) -> str:
        return self.param.help

    def page_param(self) -> Param:
        """Its Param as the page allows it: the registry's, narrowed by `page`."""
        return self.param.narrowed(*self.page) if self.page else self.param


def _own(label: str, help: str = "", **allowed: Any) -> Param:  # noqa: A002 (help: the control's help text)
    """The Param of a control that is no config field (the page's own)."""
    return Param(label, help, **allowed)


def _field(cls: type, key: str, name: str = "", **spec: Any) -> Control:
    """A control that is config field `key` of `cls`: its Param from the registry."""
    return Control(name or key, params(cls)[key], field=(cls, key), **spec)


_RUN: dict[str, Any] = dict(redraws=True, settles=True)  # a setting of what runs: it redraws the preview and settles the controls
# Every control of the Live tab, in the page's order: the order of `Controls`' fields, of the handlers' inputs and of
# the API's parameters. A config field added to D3's registry that this table does not name yet is added after it
# (`_grown`): it gets a box on the page, a parse, a share link, a CLI flag (d3/cli) and the preview's redraw.
_TABLE: tuple[Control, ...] = (
    Control("prompt", _own("Prompt"), "text", link="text", elem_id="prompt"),
    Control("model", _own("Model"), "dropdown", redraws=True, link="text", elem_id="model"),
    Control("chat_template", _own("Chat template (instruct models)"), "checkbox", link="flag"),
    Control("strategy", _own("Strategy", choices=tuple(STRATEGY_LABELS)), "dropdown", link="text", **_RUN),
    _field(D3Config, "alpha", widget="slider", page=(0.8, 1.0), release=True, elem_id="alpha", preview="alpha",
           **_RUN),
    _field(D3Config, "core_head", widget="slider", release=True, elem_id="core-head", preview="core_head", **_RUN),
    _field(D3Config, "core_tail", widget="slider", release=True, elem_id="core-tail", preview="core_tail", **_RUN),
    _field(D3Config, "start", widget="slider", release=True, elem_id="start", preview="start", **_RUN),
    _field(D3Config, "drop_order", widget="dropdown", link="text", **_RUN),
    _field(D3Config, "layer_order", widget="text", link="text", elem_id="layer-order", **_RUN),
    _field(StrategyConfig, "fill", widget="dropdown", link="text", **_RUN),
    _field(GenerationConfig, "max_new_tokens", elem_id="max-new-tokens", **_RUN),
    Control("decoding", _own("Decoding", choices=DECODINGS), "radio", link="text", settles=True),
    _field(GenerationConfig, "temperature", widget="slider", page=(0.05, 2.0), settles=True),
    _field(GenerationConfig, "seed", settles=True),
    _field(UnifiedConfig, "ratio", "unified_ratio", **_RUN),
    _field(SkipDecodeConfig, "max_layers", "skipdecode_max", **_RUN),
    _field(SkipDecodeConfig, "min_layers", "skipdecode_min", **_RUN),
    _field(EarlyExitConfig, "threshold", **_RUN),
    Control("attention_layer", _own("Attention layer to record", "the layer whose attention a run records (set "
                                    "before generating)", lo=0, integer=True), "slider", settles=True),
    Control("attention_head", _own("Head", lo=0, integer=True), "slider", scope="view"),
    Control("logit_lens", _own("Logit lens"), "checkbox", link="flag"),
    Control("metric", _own("Metric", choices=METRICS), "radio", scope="view", link="text"),
    Control("log_kl", _own("Log KL"), "checkbox", scope="view", link="flag"),
    Control("presentation", _own("Presentation mode (big fonts)"), "checkbox", scope="view", redraws=True,
            link="flag", elem_id="presentation"),
)


def _grown(table: tuple[Control, ...]) -> tuple[Control, ...]:
    """The table with every field of D3's registry it does not name yet, as a box (a slider needs a range the page
    chose), after the others: a field added to D3Config (and its schedule) is on the page without an edit here."""
    named = {c.field[1] for c in table if c.field is not None and c.field[0] in (D3Config, StrategyConfig)}
    new = [_field(D3Config, key, widget="dropdown" if p.choices else "number", link="text" if p.choices else "number",
                  elem_id=key.replace("_", "-"), **_RUN)
           for key, p in params(D3Config).items() if key not in named]
    return (*table, *new)


CONTROLS: dict[str, Control] = {c.name: c for c in _grown(_TABLE)}
GROWN: tuple[str, ...] = tuple(CONTROLS)[len(_TABLE):]  # the registry's fields the table did not name (see `_grown`)
# The controls that are a config field: the page's name (the API's parameter) -> (config class, field).
FIELDS: dict[str, tuple[type, str]] = {n: c.field for n, c in CONTROLS.items() if c.field is not None}
# Each control as the page labels it (messages on the page name fields by these: `page_words`), and the Sweep tab's.
LABELS: dict[str, str] = {**{n: c.label for n, c in CONTROLS.items()}, "strategy": "Strategy",
                          "sweep_prompts": "Prompts", "sweep_settings": "Settings",
                          "sweep_tokens": "New tokens per run"}
HELP: dict[str, str] = {n: c.help for n, c in CONTROLS.items()}
# The page's narrower ranges, one overlay over the registry's (α's slider shows the part of (0, 1] where a decay
# leaves anything to look at; temperature's the part worth sampling at): the sliders, the checks of a typed value,
# the needs view's slider and a sweep row's loading read it.
PAGE_RANGES: dict[str, tuple[float, float]] = {n: c.page for n, c in CONTROLS.items() if c.page is not None}
RELEASE_NAMES: tuple[str, ...] = tuple(n for n, c in CONTROLS.items() if c.release)
SETTLED_NAMES: tuple[str, ...] = tuple(n for n, c in CONTROLS.items() if c.settles)
# The decay curve's own inputs, by the name its meta and the browser's preview know them (`viz.depth`), -> element id.
PREVIEW_IDS: dict[str, str] = {c.preview or c.field[1]: c.elem_id for c in CONTROLS.values()
                               if c.field is not None and c.field[0] is D3Config and c.redraws
                               and c.param.checked and not c.param.choices}


def param_of(name: str) -> Param:
    return CONTROLS[name].param


def page_param(name: str) -> Param:
    """A control's Param as the page allows it: the registry's, narrowed by its page range."""
    return CONTROLS[name].page_param()


@dataclass(frozen=True)
class Controls:
    """Every control of the Live tab as the page (or an API call) sent it, raw: nothing here is validated until
    it is parsed (`strategy_config`, `generation`, `parse_schedule`). The field order is the order of the page's inputs and
    of the API's parameters; the defaults are the page's initial values. None for core_head, core_tail and
    attention_layer means the model's default (the page sends the model's own numbers)."""

    prompt: Any = ""
    model: Any = DEFAULT_MODEL
    chat_template: Any = True
    strategy: Any = "d3"
    alpha: Any = D3Config.alpha  # the engine's default decay: the page's one source of it
    core_head: Any = None
    core_tail: Any = None
    start: Any = param_of("start").default
    drop_order: Any = param_of("drop_order").default
    layer_order: Any = ""  # with drop_order "calibrated": the flex layers, dropped first first
    fill: Any = OWN_FILL  # OWN_FILL: the chosen strategy's own default
    max_new_tokens: Any = param_of("max_new_tokens").default
    decoding: Any = "greedy"
    temperature: Any = 0.8
    seed: Any = param_of("seed").default
    unified_ratio: Any = param_of("unified_ratio").default
    skipdecode_max: Any = 0
    skipdecode_min: Any = 0
    threshold: Any = param_of("threshold").default
    attention_layer: Any = None
    attention_head: Any = 0
    logit_lens: Any = True  # record the lens while generating (the Logit lens and Token scrubber views read it)
    metric: Any = "both"
    log_kl: Any = False
    presentation: Any = False

    def with_(self, **changes: Any) -> Controls:
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
    def view(self) -> ViewOptions:
        """View settings, made safe: they only change how a trace is drawn, so junk falls back to a default."""
        return ViewOptions(layer=whole(self.attention_layer), head=whole(self.attention_head),
                           metric=self.metric if self.metric in METRICS else "both", log_kl=self.log_kl is True,
                           presentation=self.presentation is True)


def _grow(cls: type) -> type:
    """`Controls` with a field for each control of the table it does not declare (a field added to D3's registry:
    `_grown`), after the others, its default the registry's: an API parameter of the same name, at the end."""
    declared = {f.name for f in fields(cls)}
    extra = [(n, Any, field(default=c.param.default)) for n, c in CONTROLS.items() if n not in declared]
    if not extra:
        return cls
    return make_dataclass(cls.__name__, extra, bases=(cls,), frozen=True,
                          namespace={"__module__": __name__, "__doc__": cls.__doc__})


if not TYPE_CHECKING:
    Controls = _grow(Controls)
CONTROL_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Controls))
assert CONTROL_NAMES == tuple(CONTROLS), "Controls declares the table's controls in the table's order"
REDRAW_NAMES: tuple[str, ...] = tuple(n for n, c in CONTROLS.items() if c.redraws)
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
# Each model's default new tokens: the most, in steps of 8, whose default run (both panes, tracing, the comparison) is
# predicted to end within half of D3_MAX_RUN_S on the shared 2-core CPU with another visitor's default run beside it
# (scripts/default_tokens.py; the figures are in docs/speed.md: 64, 64 and 16), and at most 32: a class shares one
# CPU, and a 32-token run lets twice the students through a slot as a 64-token one (docs/reliability.md's load test).
# A person or an API call may ask more.
PAGE_TOKENS = {"smollm2-135m": 32, "gemma3-270m": 32, "qwen2.5-coder-1.5b": 16}


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
              if owner is not GenerationConfig and name != "layer_order"}  # the order: with the drop order, below
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
    box loses focus (RULES, "a typed value"). That end is what the other side leaves (head + tail < L), the other
    side being the one the person did not just change (`last`: the core as it was last settled; None: the model's
    default core, which a fresh page and a model switch show). Where both sides or neither changed, the head gives
    way first."""
    head, tail = _core_or_default(c, num_layers)
    before = default_core(num_layers) if last is None else last
    if head == before[0] and tail != before[1]:
        tail = min(tail, max_core_side(head, num_layers))
    else:
        head = min(head, max_core_side(tail, num_layers))
        tail = min(tail, max_core_side(head, num_layers))
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
