"""Frozen, validated configs: one per skipping strategy, plus generation and tracing options."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, ClassVar

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


def _check_optional_int(name: str, value: Any, lo: int, hi: int | None = None) -> None:
    if value is None:
        return
    allowed = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"
    _check(_is_int(value) and value >= lo and (hi is None or value <= hi), name, value, allowed + " (or None for auto)")


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
        return cfg.drop_order
    if isinstance(cfg.layer_order, str):
        return f"calibrated:{cfg.layer_order}"
    return "calibrated[" + ",".join(map(str, cfg.layer_order[:4])) + (",…]" if len(cfg.layer_order) > 4 else "]")


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
    fill: str = "copy"

    def __post_init__(self) -> None:
        _check_choice("fill", self.fill, FILL_VARIANTS)

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.name, **asdict(self)}

    def check_layers(self, num_layers: int) -> None:
        """Raise ValueError if this config cannot run on a model with `num_layers` decoder layers."""
        _check(_is_int(num_layers) and num_layers >= 1, "num_layers", num_layers, "an integer >= 1")

    def with_(self, **changes: Any) -> "StrategyConfig":
        return replace(self, **changes)


@dataclass(frozen=True)
class FullConfig(StrategyConfig):
    """Full depth: every layer for every token (the reference)."""

    name: ClassVar[str] = "full"


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
    alpha: float = 0.99
    core_head: int | None = None
    core_tail: int | None = None
    start: int = 0
    drop_order: str = "middle_out"
    layer_order: tuple[int, ...] | str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(_is_number(self.alpha) and 0 < self.alpha <= 1, "alpha", self.alpha, "a number in (0, 1]")
        _check_optional_int("core_head", self.core_head, 0)
        _check_optional_int("core_tail", self.core_tail, 0)
        _check(_is_int(self.start) and self.start >= 0, "start", self.start, "an integer >= 0 (tokens)")
        _check_choice("drop_order", self.drop_order, DROP_ORDERS)
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
        _check(
            head + tail <= num_layers,
            "core_head + core_tail",
            head + tail,
            f"at most the model's {num_layers} layers (got head {head} + tail {tail})",
        )
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
    max_layers: int | None = None
    min_layers: int | None = None
    warmup: int = 1
    horizon: int = 128

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_optional_int("max_layers", self.max_layers, 1)
        _check_optional_int("min_layers", self.min_layers, 1)
        _check(_is_int(self.warmup) and self.warmup >= 0, "warmup", self.warmup, "an integer >= 0")
        _check(_is_int(self.horizon) and self.horizon >= 1, "horizon", self.horizon, "an integer >= 1 (tokens)")
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
        _check(self.warmup <= lo, "warmup", self.warmup, f"at most min_layers ({lo})")


@dataclass(frozen=True)
class UnifiedConfig(StrategyConfig):
    """Unified Layer Skipping: keep N = floor(L / ratio) layers, first and last always, the rest spread out.

    spacing: "even" (default) spaces the kept layers as evenly as integers allow at every ratio (gaps differ
    by at most one), the paper's "balanced" skipping; "integer" is the paper's literal interval
    floor(L / (N - 1)), which for ratios below 2 keeps one contiguous block of low layers and the last.
    """

    name: ClassVar[str] = "unified"
    ratio: float = 1.5
    spacing: str = "even"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(_is_number(self.ratio) and 1 <= self.ratio <= 64, "ratio", self.ratio, "a number in [1, 64]")
        _check_choice("spacing", self.spacing, UNIFIED_SPACINGS)

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
    fill: str = "propagate"
    threshold: float = 0.9
    measure: str = "softmax_gap"
    min_layers: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(_is_number(self.threshold) and 0 < self.threshold <= 1, "threshold", self.threshold, "a number in (0, 1]")
        _check_choice("measure", self.measure, CONFIDENCE_MEASURES)
        _check(_is_int(self.min_layers) and self.min_layers >= 1, "min_layers", self.min_layers, "an integer >= 1")

    def check_layers(self, num_layers: int) -> None:
        super().check_layers(num_layers)
        _check(self.min_layers <= num_layers, "min_layers", self.min_layers, f"at most the model's {num_layers} layers")


@dataclass(frozen=True)
class StaticSkipConfig(StrategyConfig):
    """Static layer removal (SLEB-style): every generated token after the first (the prompt's prefill runs at full
    depth) skips exactly the layers in `skip`. What a nested drop order's prefix removes at a fixed budget; the
    calibration's `task` signal (`d3.research.calibrate`) scores candidate removals with it. Not offered on the page."""

    name: ClassVar[str] = "static"
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


STRATEGIES: dict[str, type[StrategyConfig]] = {
    cls.name: cls for cls in (FullConfig, D3Config, SkipDecodeConfig, UnifiedConfig, EarlyExitConfig)
}


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
MAX_ATTENTION_LAYERS = 4  # bounds a trace: 4 layers x heads x (prompt + 1024) x 1024 tokens in float16


@dataclass(frozen=True)
class GenerationConfig:
    """How tokens are picked and when to stop. temperature 0 means greedy."""

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    stop_at_eos: bool = True

    def __post_init__(self) -> None:
        _check(
            _is_int(self.max_new_tokens) and 1 <= self.max_new_tokens <= MAX_NEW_TOKENS_CAP,
            "max_new_tokens",
            self.max_new_tokens,
            f"an integer in [1, {MAX_NEW_TOKENS_CAP}]",
        )
        _check(_is_number(self.temperature) and 0 <= self.temperature <= 5, "temperature", self.temperature, "a number in [0, 5] (0 = greedy)")
        _check(_is_number(self.top_p) and 0 < self.top_p <= 1, "top_p", self.top_p, "a number in (0, 1]")
        _check(_is_int(self.seed) and 0 <= self.seed < 2**63, "seed", self.seed, "an integer in [0, 2**63)")

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
