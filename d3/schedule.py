"""Pure layer schedules: (config, num_layers, step) -> which decoder layers run. No torch, no model."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from d3.config import (
    D3Config,
    EarlyExitConfig,
    FullConfig,
    SkipDecodeConfig,
    StaticSkipConfig,
    StrategyConfig,
    UnifiedConfig,
)


@dataclass(frozen=True)
class LayerPlan:
    """The layers a token will run, ascending, and its nominal budget.

    `dynamic` marks strategies (early exit) whose plan is only an upper bound: the decoder
    stops early when confidence passes the threshold, at or after `min_exit`.
    """

    run: tuple[int, ...]
    budget: int
    dynamic: bool = False
    min_exit: int = 0


def raw_decay(alpha: float, num_layers: int, step: int, start: int = 0) -> int:
    """D3's formula before the core floor: floor(L * alpha ** max(0, step - start)), the one place it is written
    (viz draws it from here; the page's browser preview, assets/decay_preview.js, is checked against it)."""
    # A tiny epsilon keeps alpha ** i from flooring 30 * 1.0 to 29 through rounding.
    return math.floor(num_layers * alpha ** max(0, step - start) + 1e-9)


def d3_budget(cfg: D3Config, num_layers: int, step: int) -> int:
    """floor(L * alpha ** (step - start)) clamped to [core_head + core_tail, L] and at least 1."""
    head, tail = cfg.core(num_layers)
    return min(num_layers, max(raw_decay(cfg.alpha, num_layers, step, cfg.start), head + tail, 1))


@lru_cache(maxsize=4096)
def flex_drop_order(num_layers: int, head: int, tail: int, order: str | tuple[int, ...]) -> tuple[int, ...]:
    """Flex layers in the order they are dropped (first = dropped first), for the nested orders.

    `order` is a named order or, for a calibrated one, the permutation itself (checked by the config)."""
    if isinstance(order, tuple):
        return order
    flex = list(range(head, num_layers - tail))
    if order == "top_down":
        return tuple(reversed(flex))
    if order == "bottom_up":
        return tuple(flex)
    # middle_out: nearest to the centre of the flex block first, so dropped layers stay contiguous.
    centre = (head + num_layers - tail - 1) / 2
    return tuple(sorted(flex, key=lambda layer: (abs(layer - centre), layer)))


def _strided_keep(flex: list[int], keep: int) -> set[int]:
    """`keep` flex layers evenly spaced over the flex block (not nested from one budget to the next)."""
    if keep <= 0:
        return set()
    if keep == 1:
        return {flex[len(flex) // 2]}
    span = len(flex) - 1
    return {flex[round(k * span / (keep - 1))] for k in range(keep)}


@lru_cache(maxsize=65536)
def _d3_layers(num_layers: int, head: int, tail: int, order: str | tuple[int, ...], budget: int) -> tuple[int, ...]:
    flex = list(range(head, num_layers - tail))
    keep = max(0, budget - head - tail)
    if order == "strided":
        kept_flex = _strided_keep(flex, keep)
    else:
        dropped = set(flex_drop_order(num_layers, head, tail, order)[: len(flex) - keep])
        kept_flex = set(flex) - dropped
    core = set(range(head)) | set(range(num_layers - tail, num_layers))
    layers = sorted(core | kept_flex)
    if not layers:  # budget >= 1 always, but a zero core with zero flex kept must still run something
        layers = [flex[len(flex) // 2]] if flex else [0]
    return tuple(layers)


def d3_layers(cfg: D3Config, num_layers: int, budget: int) -> tuple[int, ...]:
    """The layers D3 runs, ascending, for a budget of `budget` layers (what `d3_plan` runs for a step's budget)."""
    head, tail = cfg.core(num_layers)
    return _d3_layers(num_layers, head, tail, order_key(cfg), budget)


def order_key(cfg: D3Config) -> str | tuple[int, ...]:
    """The drop order as `flex_drop_order` takes it: the name, or a calibrated order's layers."""
    if cfg.drop_order != "calibrated":
        return cfg.drop_order
    if not isinstance(cfg.layer_order, tuple):
        raise ValueError(f"layer_order={cfg.layer_order!r} is a calibration's name: resolve it for a loaded model "
                         "first (d3.orders.resolve)")
    return cfg.layer_order


def d3_plan(cfg: D3Config, num_layers: int, step: int) -> LayerPlan:
    budget = d3_budget(cfg, num_layers, step)
    return LayerPlan(d3_layers(cfg, num_layers, budget), budget)


def skipdecode_budget(cfg: SkipDecodeConfig, num_layers: int, step: int) -> int:
    """Linear from max at step 0 to min at step horizon - 1, then flat (non-increasing)."""
    hi, lo = cfg.bounds(num_layers)
    if cfg.horizon <= 1:
        return lo
    frac = min(1.0, step / (cfg.horizon - 1))
    return max(lo, min(hi, round(hi - (hi - lo) * frac)))


def skipdecode_plan(cfg: SkipDecodeConfig, num_layers: int, step: int) -> LayerPlan:
    budget = skipdecode_budget(cfg, num_layers, step)
    warm = min(cfg.warmup, budget)
    top = budget - warm
    layers = sorted(set(range(warm)) | set(range(num_layers - top, num_layers)))
    return LayerPlan(tuple(layers), budget)


@lru_cache(maxsize=1024)
def unified_layers(num_layers: int, ratio: float, spacing: str = "even") -> tuple[int, ...]:
    """N = floor(L / r) layers, always the first and the last, the rest spread over the stack.

    even: layer round(k * (L - 1) / (N - 1)) for k = 0 .. N-1, so the gaps between kept layers differ by at
    most one (the paper's "balanced" skipping at every ratio). integer: the literal rule, every
    floor(L / (N - 1))-th layer, then the last; when that interval is 1 (r < 2 on 30 layers) it keeps
    layers 0 .. N-2 and L-1, one contiguous skipped block at the top.
    """
    keep = max(1, min(num_layers, math.floor(num_layers / ratio)))
    if keep >= num_layers:
        return tuple(range(num_layers))
    if keep == 1:
        return (num_layers - 1,)
    if spacing == "even":
        span, gaps = num_layers - 1, keep - 1
        # floor(k * span / gaps + 1/2) in integers: exact, and rounds halves the same way every time.
        return tuple((2 * k * span + gaps) // (2 * gaps) for k in range(keep))
    interval = max(1, num_layers // (keep - 1))
    layers = [k * interval for k in range(keep - 1) if k * interval < num_layers - 1]
    return tuple(sorted(set(layers) | {num_layers - 1}))


def unified_plan(cfg: UnifiedConfig, num_layers: int, step: int) -> LayerPlan:
    layers = unified_layers(num_layers, cfg.ratio, cfg.spacing)
    return LayerPlan(layers, len(layers))


def early_exit_plan(cfg: EarlyExitConfig, num_layers: int, step: int) -> LayerPlan:
    return LayerPlan(tuple(range(num_layers)), num_layers, dynamic=True, min_exit=min(cfg.min_layers, num_layers))


def static_plan(cfg: StaticSkipConfig, num_layers: int, step: int) -> LayerPlan:
    skip = set(cfg.skip)
    return LayerPlan(tuple(i for i in range(num_layers) if i not in skip), num_layers - len(skip))


def full_plan(cfg: FullConfig, num_layers: int, step: int) -> LayerPlan:
    return LayerPlan(tuple(range(num_layers)), num_layers)


_PLANNERS: dict[type, Callable[[Any, int, int], LayerPlan]] = {
    FullConfig: full_plan,
    D3Config: d3_plan,
    SkipDecodeConfig: skipdecode_plan,
    UnifiedConfig: unified_plan,
    EarlyExitConfig: early_exit_plan,
    StaticSkipConfig: static_plan,
}


def plan(cfg: StrategyConfig, num_layers: int, step: int) -> LayerPlan:
    """The layers generated token `step` runs.

    Step 0, the first new token, comes out of the prompt's prefill, which always runs at full depth;
    the strategy decides from step 1 on (for D3 this is the formula itself: floor(L * alpha ** 0) = L).
    """
    if step < 0:
        raise ValueError(f"step={step} is not allowed: step must be an integer >= 0")
    if step == 0:
        return LayerPlan(tuple(range(num_layers)), num_layers)
    return _PLANNERS[type(cfg)](cfg, num_layers, step)


def budgets(cfg: StrategyConfig, num_layers: int, steps: int) -> list[int]:
    """Planned number of layers for steps 0 .. steps-1 (the decay curve)."""
    return [len(plan(cfg, num_layers, i).run) for i in range(steps)]


def planned_mean_layers(cfg: StrategyConfig, num_layers: int, steps: int) -> float:
    """Mean of `budgets` over generated tokens 0..steps-1 (token 0 at full depth: the prefill). NaN for a dynamic
    plan (early exit), whose depth is only known after running."""
    if plan(cfg, num_layers, 1).dynamic:
        return float("nan")
    return sum(budgets(cfg, num_layers, steps)) / steps


def planned_grid(cfg: StrategyConfig, num_layers: int, steps: int) -> list[list[bool]]:
    """[steps][num_layers] True where the layer is planned to run."""
    rows = []
    for i in range(steps):
        run = set(plan(cfg, num_layers, i).run)
        rows.append([layer in run for layer in range(num_layers)])
    return rows


def theoretical_speedup(layers_used: list[int] | tuple[int, ...], num_layers: int, fixed_cost_layers: float = 0.0) -> float:
    """Full-depth cost over the cost used; `fixed_cost_layers` is the embedding + LM head cost in layer units."""
    if not layers_used:
        return 1.0
    mean = sum(layers_used) / len(layers_used)
    return (num_layers + fixed_cost_layers) / max(mean + fixed_cost_layers, 1e-9)


def alpha_for_mean_depth(target_fraction: float, num_layers: int, steps: int, core_head: int | None = None,
                         core_tail: int | None = None, start: int = 0) -> float:
    """The alpha at which D3's mean layer count over `steps` tokens is closest to `target_fraction * L` (bisection)."""
    def mean_fraction(alpha: float) -> float:
        cfg = D3Config(alpha=alpha, core_head=core_head, core_tail=core_tail, start=start)
        return planned_mean_layers(cfg, num_layers, steps) / num_layers

    lo, hi = 0.01, 1.0  # short runs need a steep decay to reach a low mean depth (2 tokens at 2/3: alpha 1/3)
    best = (abs(mean_fraction(hi) - target_fraction), hi)
    for _ in range(50):
        mid = (lo + hi) / 2
        frac = mean_fraction(mid)
        best = min(best, (abs(frac - target_fraction), mid))
        if frac < target_fraction:
            lo = mid
        else:
            hi = mid
    # Six decimals for a readable label, rounded towards whichever neighbour lands closer to the target: plain
    # rounding can turn 0.9999999 (skip one layer per token) into 1.0 (skip nothing).
    candidates = (round(best[1], 6), math.floor(best[1] * 1e6) / 1e6, math.ceil(best[1] * 1e6) / 1e6)
    return min(candidates, key=lambda a: abs(mean_fraction(a) - target_fraction))


# ---------------------------------------------------------------- how skipped layers are filled

Fill = tuple[int, str, "int | None"]  # (skipped layer, how: copy / propagate / none, the layer copied from or None)


def copy_source(ran: Sequence[int], idx: int, layer_types: Sequence[str], same_type: bool = True) -> int | None:
    """The layer whose KV a skipped layer `idx` copies: the nearest lower layer that ran (the official ULS rule),
    else the nearest higher one; with `same_type`, only among layers of idx's attention type (Gemma 3's
    sliding-window layers use rope base 10k, its global layers 1M, so a sliding layer's keys are rotated
    wrongly for a global layer). None when no candidate ran."""
    candidates = [r for r in ran if layer_types[r] == layer_types[idx]] if same_type else list(ran)
    if not candidates:
        return None
    lower = [r for r in candidates if r < idx]
    return lower[-1] if lower else min(candidates, key=lambda r: abs(r - idx))


def fill_plan(ran: Sequence[int], skipped: Sequence[int], fill: str, layer_types: Sequence[str]) -> tuple[Fill, ...]:
    """How each skipped layer's KV entry at this position is filled, and from where: the decoder does exactly this
    and the trace records it, so a figure draws the decision and never works it out again.

    copy / copy_any_type copy `copy_source`'s entry; where nothing fits they fall back to propagate. none leaves a
    hole. layer_types: each layer's attention type ("full_attention", "sliding_attention"); one type on Llama."""
    out = []
    for idx in skipped:
        src = copy_source(ran, idx, layer_types, fill == "copy") if fill in ("copy", "copy_any_type") else None
        how = "copy" if src is not None else ("none" if fill == "none" else "propagate")
        out.append((idx, how, src))
    return tuple(out)


def planned_fills(cfg: StrategyConfig, num_layers: int, steps: int,
                  layer_types: Sequence[str] | None = None) -> list[tuple[Fill, ...]]:
    """Per planned step, `fill_plan` for the layers the schedule skips (what a run of `cfg` would record)."""
    types = list(layer_types) if layer_types else ["full_attention"] * num_layers
    rows = []
    for i in range(steps):
        run = plan(cfg, num_layers, i).run
        rows.append(fill_plan(run, [x for x in range(num_layers) if x not in set(run)], cfg.fill, types))
    return rows
