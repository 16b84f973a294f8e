"""Frozen, validated configs: one per skipping strategy, plus generation and tracing options."""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, ClassVar

DEFAULT_MODEL = "smollm2-135m"  # the model every entry point starts with (page, CLI, sweeps, load test): said once

FILLS = ("copy", "propagate", "none")  # the fills the page offers and compares
# copy_any_type: the nearest lower layer that ran whatever its attention type (this project's copy until Gemma 3's
# mixed sliding / global layers showed the problem); only from the CLI and the API, it equals copy on one-type models.
FILL_VARIANTS = (*FILLS, "copy_any_type")
DROP_ORDERS = ("middle_out", "top_down", "bottom_up", "strided", "calibrated")
# calibrated: the order is data, measured per model (`d3.orders`, measured by `d3.research.calibrate`): D3Config.layer_order names it.
CONFIDENCE_MEASURES = ("softmax_gap", "cosine")
UNIFIED_SPACINGS = ("even", "integer")


def _check(ok: bool, name: str, value: Any, allowed: str) -> None:
    """Raise a ValueError naming the field, the bad value and what is allowed."""
    if not ok:
        raise ValueError(f"{name}={value!r} is not allowed: {name} must be {allowed}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    _check(value in choices, name, value, "one of " + ", ".join(choices))


# ---------------------------------------------------------------- the registry: each field's facts, said once


@dataclass(frozen=True)
class Param:
    """What one config field allows, said once. The configs validate with it; the page's controls, the CLI's flags,
    custom_generate's keywords, share links, sweep specs and report labels are derived from it (`params`).

    lo / hi: the range (open at an end with lo_open / hi_open); integer: whole numbers only; choices: the allowed
    words; optional: None is allowed and means auto; unit: said after the range ("tokens"); default: the field's
    own default, filled in by `params` (the dataclass field is the one place it is written)."""

    label: str
    help: str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    integer: bool = False
    choices: tuple[str, ...] = ()
    optional: bool = False
    unit: str = ""
    default: Any = None
    show: str = ""  # how `describe()` writes the field ("α={}", "start {}"); "" keeps it out of descriptions
    always: bool = False  # described even at its default (the number a strategy is known by: α, the ratio)
    checked: bool = True  # False: a value of its own kind that its config checks itself (a calibrated order)

    def allowed(self) -> str:
        """What is allowed, in the words of an error message: "a number in (0, 1]", "one of copy, none"."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if not self.checked:
            return self.help
        kind = "an integer" if self.integer else "a number"
        if self.lo is not None and self.hi is not None:
            text = f"{kind} in {'(' if self.lo_open else '['}{_num(self.lo)}, {_num(self.hi)}{')' if self.hi_open else ']'}"
        elif self.lo is not None:
            text = f"{kind} {'>' if self.lo_open else '>='} {_num(self.lo)}"
        elif self.hi is not None:
            text = f"{kind} {'<' if self.hi_open else '<='} {_num(self.hi)}"
        else:
            text = kind
        text += f" ({self.unit})" if self.unit else ""
        return text + (" (or None for auto)" if self.optional else "")

    def ok(self, value: Any) -> bool:
        if not self.checked:
            return True  # checked by its config (`__post_init__`), which knows what else it depends on
        if value is None:
            return self.optional
        if self.choices:
            return value in self.choices
        if not (_is_int(value) if self.integer else _is_number(value)):
            return False
        above = self.lo is None or (value > self.lo if self.lo_open else value >= self.lo)
        below = self.hi is None or (value < self.hi if self.hi_open else value <= self.hi)
        return above and below

    def check(self, name: str, value: Any) -> None:
        """Raise ValueError naming the field, the value and what is allowed."""
        _check(self.ok(value), name, value, self.allowed())

    def narrowed(self, lo: float | None = None, hi: float | None = None) -> Param:
        """This field's Param with a narrower range (an entry point that allows less: the page's sliders, a sweep's
        token count); never wider than the field itself allows."""
        new_lo = self.lo if lo is None else (lo if self.lo is None else max(lo, self.lo))
        new_hi = self.hi if hi is None else (hi if self.hi is None else min(hi, self.hi))
        return replace(self, lo=new_lo, hi=new_hi, lo_open=self.lo_open and new_lo == self.lo,
                       hi_open=self.hi_open and new_hi == self.hi)

    def text(self, value: Any, digits: int | None = None) -> str:
        """`value` as `describe()` writes it: words with hyphens (top-down), floats as Python prints them or with
        `digits` decimals (as many more as it takes to tell a value below 1 from 1)."""
        if value is None:
            return "auto"
        if isinstance(value, str):
            return value.replace("_", "-")
        if isinstance(value, float) and digits is not None:
            return _digits(value, digits)
        return str(value)


def _digits(x: float, digits: int) -> str:
    """`digits` decimals, or as many (up to 8) as it takes to tell a value below 1 from 1 (0.999999)."""
    for d in range(digits, 9):
        text = f"{x:.{d}f}"
        if x >= 1.0 or float(text) < 1.0:
            return text
    return repr(x)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def param(default: Any, label: str, help: str, **allowed: Any) -> Any:  # noqa: A002 (help: the field's help text)
    """A config field with its facts: `alpha: float = param(0.99, "α (decay rate)", "...", lo=0, hi=1, lo_open=True)`."""
    return field(default=default, metadata={"param": Param(label, help, **allowed)})


def params(cls: type) -> dict[str, Param]:
    """Every registered field of a config class, in field order, with its default filled in."""
    return dict(_params(cls))


@functools.cache
def _params(cls: type) -> tuple[tuple[str, Param], ...]:
    return tuple((f.name, replace(f.metadata["param"], default=f.default)) for f in fields(cls) if "param" in f.metadata)


def check_params(cfg: Any) -> None:
    """Validate every registered field of a config instance against its Param."""
    for name, p in params(type(cfg)).items():
        p.check(name, getattr(cfg, name))


def drop_order_fields(word: str) -> dict[str, Any]:
    """A drop order as one word (CLI lists, sweep specs): a named order, "calibrated" (the model's measured order),
    or "calibrated:NAME" (a cached calibration, e.g. calibrated:agreement) -> D3Config's drop_order / layer_order."""
    name, _, order = str(word).partition(":")
    _check_choice("drop_order", name, DROP_ORDERS)
    if name != "calibrated":
        _check(not order, "drop_order", word, f"{name} without ':' (only calibrated takes a name)")
        return {"drop_order": name}
    return {"drop_order": "calibrated", "layer_order": order or "measured"}


def drop_order_word(cfg: Any) -> str:
    """The one-word name of a D3 config's drop order (inverse of `drop_order_fields` for named calibrations)."""
    if cfg.drop_order != "calibrated":
        return str(cfg.drop_order)
    if isinstance(cfg.layer_order, str):
        return f"calibrated:{cfg.layer_order}"
    return "calibrated[" + ",".join(map(str, cfg.layer_order[:4])) + (",…]" if len(cfg.layer_order) > 4 else "]")


def core_fits(head: int, tail: int, num_layers: int) -> bool:
    """The core rule, for the page, the CLI, sweeps and the engine alike: head + tail <= L - 1, so at least one flex
    layer is left to drop (a model of one layer has none: only the empty core fits it). A core over the whole stack
    would make D3 full depth under another name, and a calibrated order of it would have to be empty."""
    return head >= 0 and tail >= 0 and head + tail <= max(num_layers - 1, 0)


def check_core(head: int, tail: int, num_layers: int) -> None:
    """ValueError naming core_head + core_tail when (head, tail) breaks the core rule (`core_fits`)."""
    _check(core_fits(head, tail, num_layers), "core_head + core_tail", head + tail,
           f"at most {max(num_layers - 1, 0)}: the model's {num_layers} layers less one flex layer to drop "
           f"(got head {head} + tail {tail})")


def max_core_side(other: int, num_layers: int) -> int:
    """How far one side of the core reaches when the other side holds `other` layers (the core rule)."""
    return max(num_layers - 1 - other, 0)


def default_core(num_layers: int) -> tuple[int, int]:
    """The default core split (head, tail): an eighth of the stack at each end, at least one layer, as long as that
    leaves a flex layer to skip (a model of one or two layers gets no core: (1, 1) would not even fit one layer)."""
    n = min(max(1, num_layers // 8), max(0, (num_layers - 1) // 2))
    return n, n


@dataclass(frozen=True)
class StrategyConfig:
    """Base of every strategy: how the key/value states of skipped layers are filled.

    fill: copy (default) puts the KV entry of the nearest lower layer that ran, of the same attention type, into
    the skipped layer's cache (on models with one attention type, like Llama, that is simply the nearest lower
    layer, the official Unified Layer Skipping rule; on Gemma 3 a skipped global layer copies a global one, not
    a sliding-window layer whose keys carry a different rope base); copy_any_type ignores the type;
    propagate computes the layer's own K/V from the hidden state that skipped it; none leaves a masked-out
    hole. With a nested drop order and a budget that never grows (D3's default middle_out, SkipDecode,
    Unified) a skipped layer never runs again, so no later token reads a filled entry and the choice has no
    effect; it matters for strided, early exit, and any schedule whose layer sets are not nested.
    """

    name: ClassVar[str] = "base"
    short: ClassVar[str] = "base"  # in legends and tables
    label: ClassVar[str] = "base"
    fill: str = param("copy", "Fill", "how a skipped layer's key/value entry is filled for later tokens: copy the "
                      "nearest lower layer that ran (of the same attention type), propagate (the layer's own K/V of "
                      "the state that skipped it), or none (a masked hole)", choices=FILL_VARIANTS, show="fill {}")

    def __post_init__(self) -> None:
        check_params(self)

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.name, **asdict(self)}

    def changed(self) -> dict[str, Any]:
        """The fields that differ from their defaults (transformers' `GenerationConfig.to_diff_dict`)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}

    def describe(self, *, every: bool = False, digits: int | None = None) -> str:
        """A short name for the page, legends and tables: `short`, then the fields that differ from the defaults
        (and those marked `always`), each as its Param's `show` writes it: "D3 (α=0.99, start 8, top-down)".
        every: every described field, default or not (a table's rows line up); digits: decimals for floats."""
        parts = self.parts(every=every, digits=digits)
        return f"{self.short} ({', '.join(parts)})" if parts else self.short

    def parts(self, *, every: bool = False, digits: int | None = None) -> list[str]:
        """The described fields, each as its Param's `show` writes it (see `describe`)."""
        changed = self.changed()
        registry = params(type(self))
        names = [n for n in registry if n != "fill"] + ["fill"]  # the fill, common to all, comes last
        return [registry[n].show.format(registry[n].text(getattr(self, n), digits)) for n in names
                if registry[n].show and (every or registry[n].always or n in changed)]

    def check_layers(self, num_layers: int) -> None:
        """Raise ValueError if this config cannot run on a model with `num_layers` decoder layers."""
        _check(_is_int(num_layers) and num_layers >= 1, "num_layers", num_layers, "an integer >= 1")

    def with_(self, **changes: Any) -> StrategyConfig:
        return replace(self, **changes)


@dataclass(frozen=True)
class FullConfig(StrategyConfig):
    """Full depth: every layer for every token (the reference)."""

    name: ClassVar[str] = "full"
    short: ClassVar[str] = "full depth"  # in legends and tables
    label: ClassVar[str] = "Full depth"


@dataclass(frozen=True)
class D3Config(StrategyConfig):
    """Position-aware depth decay: generated token i (0 = the first) runs floor(L * alpha ** max(0, i - start))
    layers, never fewer than core_head + core_tail (and at least one).

    alpha: decay rate in (0, 1].
    core_head / core_tail: layers always run at the bottom / top (None: `default_core`).
    start: the step the decay counts from: tokens 0..start (start + 1 of them) run at full depth, token
        start + k runs floor(L * alpha ** k); start=5 keeps steps 0-5 at full depth.
    drop_order: order in which flex (middle) layers are dropped as the budget shrinks: middle_out (the paper's
        literal reading), top_down, bottom_up, strided (not nested), or calibrated (the measured order in
        `layer_order`).
    layer_order: with drop_order="calibrated", the flex layers in the order they are dropped (first = dropped first):
        a permutation of this model's flex layers for this core split (checked by `check_layers`), or the name of
        a cached calibration ("agreement", "task:arithmetic_1_digit_addition", ...) that `d3.orders.resolve`
        turns into that tuple for a loaded model.
    fill: copy (default) copies the nearest lower layer that ran of the same attention type, so on Gemma 3 a
        global layer never gets a sliding-window layer's keys (another rope base); no effect with the nested
        default drop order; the other fills and why: `StrategyConfig`.
    """

    name: ClassVar[str] = "d3"
    short: ClassVar[str] = "D3"  # in legends and tables
    label: ClassVar[str] = "D3 (depth decay)"
    alpha: float = param(0.99, "α (decay rate)", "token i runs floor(L·α^i) layers: 1 keeps full depth, lower "
                         "decays faster", lo=0, hi=1, lo_open=True, show="α={}", always=True)
    core_head: int | None = param(None, "Core head", "layers at the bottom that always run (auto: L // 8)", lo=0,
                                  integer=True, optional=True)
    core_tail: int | None = param(None, "Core tail", "layers at the top that always run (auto: L // 8)", lo=0,
                                  integer=True, optional=True)
    start: int = param(0, "Start", "the step the decay counts from: tokens 0..start run at full depth", lo=0,
                       integer=True, unit="tokens", show="start {}")
    drop_order: str = param("middle_out", "Drop order", "which flex layers go first as the budget shrinks "
                            "(calibrated: a measured order, named or given by layer_order)", choices=DROP_ORDERS,
                            show="{}")
    layer_order: tuple[int, ...] | str | None = param(None, "Calibrated order", "with drop order calibrated: the "
                                                     "flex layers in the order they are dropped (first dropped first), "
                                                     "or a cached calibration's name", checked=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.layer_order, list):  # JSON and keyword callers hand a list; the config keeps a tuple
            object.__setattr__(self, "layer_order", tuple(self.layer_order))
        if self.drop_order != "calibrated":
            _check(self.layer_order is None, "layer_order", self.layer_order,
                   'None unless drop_order="calibrated" (the order is only read then)')
            return
        order = self.layer_order
        _check(isinstance(order, str) and bool(order.strip())
               or isinstance(order, tuple) and len(order) > 0 and all(_is_int(x) and x >= 0 for x in order),
               "layer_order", order, 'with drop_order="calibrated", a tuple of flex layer indices (first dropped '
               'first) or the name of a cached calibration (see `python -m d3 calibrate`)')

    def parts(self, *, every: bool = False, digits: int | None = None) -> list[str]:
        """α, start, then the core as one part ("core 3+3", "core auto+2"), then drop order and fill."""
        parts = super().parts(every=every, digits=digits)
        if every or self.core_head is not None or self.core_tail is not None:
            head, tail = ("auto" if x is None else x for x in (self.core_head, self.core_tail))
            parts.insert(2 if every or self.start != 0 else 1, f"core {head}+{tail}")
        return parts

    @property
    def resolved(self) -> bool:
        """False while layer_order is a calibration's name that `d3.orders.resolve` has not turned into layers."""
        return not isinstance(self.layer_order, str)

    def core(self, num_layers: int) -> tuple[int, int]:
        """The concrete (head, tail) core split for a model with `num_layers` layers."""
        head, tail = default_core(num_layers)
        return (head if self.core_head is None else self.core_head, tail if self.core_tail is None else self.core_tail)

    def check_layers(self, num_layers: int) -> None:
        super().check_layers(num_layers)
        head, tail = self.core(num_layers)
        check_core(head, tail, num_layers)
        if self.drop_order == "calibrated":
            check_layer_order(self.layer_order, num_layers, head, tail)


def check_layer_order(order: Any, num_layers: int, head: int, tail: int) -> None:
    """A calibrated order must be a permutation of the flex layers head .. L - tail - 1; the error names what is off."""
    if isinstance(order, str):
        raise ValueError(f"layer_order={order!r} is a calibration's name: resolve it for a loaded model first "
                         "(d3.orders.resolve), or give the layers as a tuple")
    flex = set(range(head, num_layers - tail))
    given = list(order)
    problems = []
    if len(given) > num_layers:  # refused before anything else looks at every entry
        raise ValueError(f"layer_order has {len(given):,} entries: at most this model's {num_layers} layers")
    counts = Counter(given)  # one pass: the checks stay linear in the order's length
    missing = sorted(flex - counts.keys())
    extra = sorted(counts.keys() - flex)
    repeated = sorted(x for x, n in counts.items() if n > 1)
    if missing:
        problems.append(f"missing {missing}")
    if extra:
        problems.append(f"not flex layers {extra}")
    if repeated:
        problems.append(f"repeated {repeated}")
    if problems:
        span = f"{head}..{num_layers - tail - 1}" if flex else "none"
        raise ValueError(f"layer_order is not a permutation of this model's flex layers ({span} for core {head}+{tail} "
                         f"of {num_layers} layers): " + "; ".join(problems))


@dataclass(frozen=True)
class SkipDecodeConfig(StrategyConfig):
    """SkipDecode: budget falls linearly from max_layers to min_layers over `horizon` tokens.

    A token runs the bottom `warmup` layers plus the top (budget - warmup) layers. None: auto
    (max = ceil(2L/3), min = L // 3), the 32-layer (22, 11) setting scaled to L.
    """

    name: ClassVar[str] = "skipdecode"
    short: ClassVar[str] = "SkipDecode"  # in legends and tables
    label: ClassVar[str] = "SkipDecode"
    max_layers: int | None = param(None, "SkipDecode max layers", "the budget at the first token (auto: ceil(2L/3))",
                                   lo=1, integer=True, optional=True, show="max {}")
    min_layers: int | None = param(None, "SkipDecode min layers", "the lowest budget, reached after `horizon` tokens "
                                   "(auto: L // 3)", lo=1, integer=True, optional=True, show="min {}")
    warmup: int = param(1, "Warm-up layers", "bottom layers every token runs", lo=0, integer=True,
                       show="warm-up {}")
    horizon: int = param(128, "Horizon", "tokens over which the budget falls linearly", lo=1, integer=True,
                         unit="tokens", show="over {} tokens", always=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_layers is not None and self.min_layers is not None:
            _check(self.min_layers <= self.max_layers, "min_layers", self.min_layers, f"<= max_layers ({self.max_layers})")

    def bounds(self, num_layers: int) -> tuple[int, int]:
        """The concrete (max, min) budget for a model with `num_layers` layers."""
        hi = math.ceil(2 * num_layers / 3) if self.max_layers is None else self.max_layers
        lo = num_layers // 3 if self.min_layers is None else self.min_layers
        return hi, max(1, min(lo, hi))

    def check_layers(self, num_layers: int) -> None:
        super().check_layers(num_layers)
        hi, lo = self.bounds(num_layers)
        _check(hi <= num_layers, "max_layers", hi, f"at most the model's {num_layers} layers")
        # An explicit min above the budget's start (the auto max: ceil(2L/3)) is refused, never lowered silently.
        _check(self.min_layers is None or self.min_layers <= hi, "min_layers", self.min_layers,
               f"at most max_layers ({hi} on this model's {num_layers} layers)")
        _check(self.warmup <= lo, "warmup", self.warmup, f"at most min_layers ({lo})")


@dataclass(frozen=True)
class UnifiedConfig(StrategyConfig):
    """Unified Layer Skipping: keep N = floor(L / ratio) layers, first and last always, the rest spread out.

    spacing: "even" (default) spaces the kept layers as evenly as integers allow at every ratio (gaps differ
    by at most one), the paper's "balanced" skipping; "integer" is the paper's literal interval
    floor(L / (N - 1)), which for ratios below 2 keeps one contiguous block of low layers and the last.
    """

    name: ClassVar[str] = "unified"
    short: ClassVar[str] = "Unified"  # in legends and tables
    label: ClassVar[str] = "Unified Layer Skipping"
    ratio: float = param(1.5, "Unified ratio", "target speedup: keep floor(L / ratio) layers, first and last always",
                         lo=1, hi=64, show="{}×", always=True)
    spacing: str = param("even", "Spacing", "kept layers evenly spaced (even) or every floor(L / (N - 1))-th (integer, "
                         "the paper's literal rule)", choices=UNIFIED_SPACINGS, show="spacing {}")

    def check_layers(self, num_layers: int) -> None:
        super().check_layers(num_layers)
        keep = math.floor(num_layers / self.ratio)
        _check(keep >= min(2, num_layers), "ratio", self.ratio, f"small enough to keep 2 of {num_layers} layers")


@dataclass(frozen=True)
class EarlyExitConfig(StrategyConfig):
    """CALM-style confidence early exit: stop once confidence passes `threshold` (not before `min_layers`).

    softmax_gap: top-1 minus top-2 probability through the final norm and LM head.
    cosine: cosine similarity of consecutive hidden states.
    """

    name: ClassVar[str] = "early_exit"
    short: ClassVar[str] = "early exit"  # in legends and tables
    label: ClassVar[str] = "Confidence early exit (CALM-style)"
    # propagate: CALM's own state propagation (an exited token's skipped layers get their K/V from its last state);
    # the page, the CLI and custom_generate all read this one default.
    fill: str = param("propagate", "Fill", "how the layers above an exit get their key/value entry: propagate (CALM's "
                      "state propagation), copy, or none", choices=FILL_VARIANTS, show="fill {}")
    measure: str = param("softmax_gap", "Confidence measure", "softmax_gap: top-1 minus top-2 probability through the "
                         "LM head; cosine: similarity of consecutive hidden states", choices=CONFIDENCE_MEASURES,
                         show="{}", always=True)
    threshold: float = param(0.9, "Confidence threshold", "exit once the confidence passes this", lo=0, hi=1,
                             lo_open=True, show="≥ {}", always=True)
    min_layers: int = param(4, "Min layers", "layers every token runs before it may exit", lo=1, integer=True,
                             show="min {} layers")

    def check_layers(self, num_layers: int) -> None:
        super().check_layers(num_layers)
        _check(self.min_layers <= num_layers, "min_layers", self.min_layers, f"at most the model's {num_layers} layers")


@dataclass(frozen=True)
class StaticSkipConfig(StrategyConfig):
    """Static layer removal (SLEB-style): every generated token after the first (the prompt's prefill runs at full
    depth) skips exactly the layers in `skip`. What a nested drop order's prefix removes at a fixed budget; the
    calibration's `task` signal (`d3.research.calibrate`) scores candidate removals with it. Not offered on the page."""

    name: ClassVar[str] = "static"
    short: ClassVar[str] = "static"  # in legends and tables
    label: ClassVar[str] = "Static removal"
    skip: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.skip, list):
            object.__setattr__(self, "skip", tuple(self.skip))
        _check(isinstance(self.skip, tuple) and all(_is_int(x) and x >= 0 for x in self.skip)
               and len(set(self.skip)) == len(self.skip), "skip", self.skip, "a tuple of distinct layer indices >= 0")

    def check_layers(self, num_layers: int) -> None:
        super().check_layers(num_layers)
        _check(all(x < num_layers for x in self.skip) and len(self.skip) < num_layers, "skip", self.skip,
               f"distinct layers among 0..{num_layers - 1}, leaving at least one to run")


# The strategies a person can run, in the order every list, menu and table shows them: full depth (the reference),
# D3, then the baselines.
STRATEGIES: dict[str, type[StrategyConfig]] = {
    cls.name: cls for cls in (FullConfig, D3Config, SkipDecodeConfig, UnifiedConfig, EarlyExitConfig)
}
BASELINES: tuple[str, ...] = tuple(n for n in STRATEGIES if n not in ("full", "d3"))


def strategy_from_dict(data: dict[str, Any]) -> StrategyConfig:
    """Build a strategy config from {"strategy": name, **fields}; unknown names or fields raise ValueError."""
    data = dict(data)
    name = data.pop("strategy", "d3")
    _check_choice("strategy", name, tuple(STRATEGIES))
    cls = STRATEGIES[name]
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown field(s) for strategy {name!r}: {', '.join(unknown)}; allowed: {', '.join(sorted(known))}")
    return cls(**data)


MAX_NEW_TOKENS_CAP = 1024
MAX_PROMPT_TOKENS_CAP = 4096
# Seeds up to 2**32 - 1: numpy's and most tools' seed range, and exact in a browser's number box (a JavaScript number
# holds integers exactly only up to 2**53), so a seed shown on the page is the seed that ran.
SEED_MAX = 2**32 - 1
# Every layer of the models served (30 for SmolLM2, 28 for Qwen2.5, 18/26 for Gemma 3), so a run can record them all.
# A trace keeps per token [layers, heads, positions] float16 weights: SmolLM2 (30 x 9 heads), 256 tokens after a
# 1,024-token prompt: 30 * 9 * sum(1024 + t for t < 256) * 2 bytes = 159 MB; the page bounds what it records
# (explorer/runs.py, ATTENTION_BUDGET_BYTES).
MAX_ATTENTION_LAYERS = 64


@dataclass(frozen=True)
class GenerationConfig:
    """How tokens are picked and when to stop. temperature 0 means greedy."""

    max_new_tokens: int = param(64, "New tokens", "how many tokens each run generates at most", lo=1,
                                hi=MAX_NEW_TOKENS_CAP, integer=True)
    temperature: float = param(0.0, "Temperature", "sampling temperature; 0 picks the most likely token (greedy)",
                               lo=0, hi=5, unit="0 = greedy")
    top_p: float = param(1.0, "Top-p", "sample from the smallest set of tokens whose probability reaches this", lo=0,
                         hi=1, lo_open=True)
    seed: int = param(0, "Seed", "the sampling seed (same seed, same text)", lo=0, hi=SEED_MAX, integer=True)
    stop_at_eos: bool = True

    def __post_init__(self) -> None:
        check_params(self)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class TraceConfig:
    """What the decoder records. `enabled=False` records only tokens, layer sets and timings.

    sublayer_stats: per layer, the change attention / MLP make to the residual stream (from hooks).
    logit_lens: the top-1 token read out after every layer (costs an LM head per layer and step).
    lens_states: keep what the logit lens reads instead (each layer's output at the newest position), to be
      read out later in one batched LM-head call (`d3.lens.read_lens`) only if someone looks at it.
    attention_layers: layers whose attention weights are kept, per head, for generated tokens.
    top_k: how many next-token candidates each step keeps.
    """

    enabled: bool = True
    sublayer_stats: bool = True
    logit_lens: bool = False
    lens_states: bool = False
    attention_layers: tuple[int, ...] = field(default_factory=tuple)
    top_k: int = 5

    def __post_init__(self) -> None:
        _check(_is_int(self.top_k) and 0 <= self.top_k <= 20, "top_k", self.top_k, "an integer in [0, 20]")
        _check(
            isinstance(self.attention_layers, tuple) and all(_is_int(x) and x >= 0 for x in self.attention_layers)
            and len(self.attention_layers) <= MAX_ATTENTION_LAYERS,
            "attention_layers",
            self.attention_layers,
            f"a tuple of at most {MAX_ATTENTION_LAYERS} layer indices >= 0 (attention is kept per head and token)",
        )


TRACE_OFF = TraceConfig(enabled=False, sublayer_stats=False)
