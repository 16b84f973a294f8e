"""The grid: each strategy tuned to a target mean depth (pure arithmetic on schedules), and the settings to run."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from d3.config import (
    TRACE_OFF,
    D3Config,
    EarlyExitConfig,
    FullConfig,
    GenerationConfig,
    SkipDecodeConfig,
    StrategyConfig,
    UnifiedConfig,
    drop_order_fields,
)
from d3.research.sweep.spec import Setting, SweepSpec
from d3.schedule import alpha_for_mean_depth, planned_mean_layers, unified_layers

# ---------------------------------------------------------------- matching depths (pure)


def d3_for_depth(depth: float, num_layers: int, steps: int, *, core: tuple[int, int] | None = None, start: int = 0,
                 fill: str = "copy", drop_order: str = "middle_out") -> D3Config:
    """The D3 config of these variants whose planned mean depth is closest to `depth * L` (alpha by bisection).

    drop_order: one word (`d3.config.drop_order_fields`): a named order, calibrated or calibrated:NAME."""
    head, tail = core if core is not None else (None, None)
    alpha = alpha_for_mean_depth(depth, num_layers, steps, core_head=head, core_tail=tail, start=start)
    return D3Config(alpha=alpha, core_head=head, core_tail=tail, start=start, fill=fill, **drop_order_fields(drop_order))


S = TypeVar("S", bound=StrategyConfig)


def _closest(candidates: Iterable[S], target: float, num_layers: int, steps: int) -> S:
    return min(candidates, key=lambda c: abs(planned_mean_layers(c, num_layers, steps) - target))


def skipdecode_for_depth(depth: float, num_layers: int, steps: int, warmup: int = 1) -> SkipDecodeConfig:
    """SkipDecode with max:min = 2:1 (the paper's (22, 11) shape), linear over `steps`, closest planned mean."""
    target = depth * num_layers
    candidates = []
    for hi in range(max(1, warmup), num_layers + 1):
        lo = max(warmup, 1, round(hi / 2))
        candidates.append(SkipDecodeConfig(max_layers=hi, min_layers=min(lo, hi), warmup=warmup, horizon=steps))
    return _closest(candidates, target, num_layers, steps)


def unified_for_depth(depth: float, num_layers: int, steps: int) -> UnifiedConfig:
    """Unified Layer Skipping with the ratio whose kept layers give the closest planned mean."""
    target = depth * num_layers
    candidates = []
    for keep in range(2, num_layers + 1):
        ratio = round(num_layers / keep, 6)
        if 1 <= ratio <= 64 and len(unified_layers(num_layers, ratio)) >= min(2, num_layers):
            candidates.append(UnifiedConfig(ratio=ratio))
    return _closest(candidates, target, num_layers, steps)


def exit_layers(confidence: Sequence[float], min_exit: int, num_layers: int, threshold: float) -> int:
    """Layers a token would run under `threshold`, from the confidences measured after layers min_exit, min_exit+1..."""
    for k, c in enumerate(confidence):
        if c >= threshold:
            return min_exit + k
    return num_layers


def threshold_for_depth(profiles: Sequence[Sequence[float]], min_exit: int, num_layers: int, depth: float) -> float:
    """The early-exit threshold whose mean depth over `profiles` (one confidence list per token) is closest to
    `depth * L`; token 0 (the prefill) counts as full depth, like every strategy's."""
    target = depth * num_layers

    def mean_at(t: float) -> float:
        used = [num_layers] + [exit_layers(p, min_exit, num_layers, t) for p in profiles]
        return sum(used) / len(used)

    lo, hi = 1e-6, 1.0  # mean depth rises with the threshold
    for _ in range(40):
        mid = (lo + hi) / 2
        if mean_at(mid) < target:
            lo = mid
        else:
            hi = mid
    best = min((lo, hi), key=lambda t: abs(mean_at(t) - target))
    return float(f"{best:.4g}")


# ---------------------------------------------------------------- the grid


LABEL_DIGITS = 4  # decimals of a tuned number in a row's label (more where it takes them to tell a value from 1)


def label(cfg: StrategyConfig) -> str:
    """A row's label: the config's own description (`StrategyConfig.describe`), tuned numbers to LABEL_DIGITS."""
    return cfg.describe(digits=LABEL_DIGITS)


def d3_settings(spec: SweepSpec, num_layers: int) -> list[Setting]:
    """D3 variants: base values at every depth; other values one at a time at `variants_at` (or the full product)."""
    T = spec.max_new_tokens
    axes = (spec.cores, spec.starts, spec.fills, spec.drop_orders)
    combos: list[tuple[float, tuple]] = []
    base = tuple(a[0] for a in axes)
    if spec.product:
        combos = [(d, c) for d in spec.depths for c in itertools.product(*axes)]
    else:
        combos = [(d, base) for d in spec.depths]
        paired = "strided" in spec.drop_orders and base[3] != "strided"
        for i, axis in enumerate(axes):
            for value in axis[1:]:
                combo = list(base)
                combo[i] = value
                if i == 2 and paired:  # fills only matter where layer sets are not nested: run them strided
                    combo[3] = "strided"
                combos.append((spec.variants_at, tuple(combo)))
    out = []
    for depth, (core, start, fill, order) in combos:
        cfg = d3_for_depth(depth, num_layers, T, core=core, start=start, fill=fill, drop_order=order)
        if cfg.resolved:  # a calibration's name is checked once the engine resolves it against its model
            cfg.check_layers(num_layers)
        out.append(Setting(label(cfg), cfg, depth))
    for alpha in spec.alphas:
        cfg = D3Config(alpha=alpha)
        out.append(Setting(label(cfg), cfg, None))
    return _unique(out)


def _unique(settings: list[Setting]) -> list[Setting]:
    seen: set[str] = set()
    out = []
    for s in settings:
        k = json.dumps(s.config.to_dict(), sort_keys=True)
        if k not in seen:
            seen.add(k)
            out.append(s)
    return out


def planned_baselines(spec: SweepSpec, num_layers: int) -> list[Setting]:
    """SkipDecode and Unified Layer Skipping at each baseline depth (their depth is known before running)."""
    T = spec.max_new_tokens
    out: list[Setting] = []
    for depth in spec.baseline_depths or spec.depths:
        if "skipdecode" in spec.baselines:
            skip = skipdecode_for_depth(depth, num_layers, T)
            out.append(Setting(label(skip), skip, depth))
        if "unified" in spec.baselines:
            cfg = unified_for_depth(depth, num_layers, T)
            out.append(Setting(label(cfg), cfg, depth))
    return _unique(out)


def early_exit_settings(spec: SweepSpec, num_layers: int, profiles: dict[str, tuple[list[list[float]], int]]) -> list[Setting]:
    """Early exit at each baseline depth, thresholds calibrated from `profiles` (measure -> (confidences, min_exit))."""
    out = []
    for depth in spec.early_exit_depths or spec.baseline_depths or spec.depths:
        for measure, (conf, min_exit) in profiles.items():
            t = threshold_for_depth(conf, min_exit, num_layers, depth)
            cfg = EarlyExitConfig(threshold=t, measure=measure)
            out.append(Setting(label(cfg), cfg, depth))
    return _unique(out)


def calibrate_early_exit(engine: Any, spec: SweepSpec) -> dict[str, tuple[list[list[float]], int]]:
    """Per measure: the confidence after every layer of every token of the first prompt, at (almost) full depth.

    threshold 1.0 almost never exits, so this records the whole confidence profile once; thresholds for any
    depth are then read off it (on the full-depth trajectory: the real run's depth is measured, not assumed)."""
    if "early_exit" not in spec.baselines:
        return {}
    out = {}
    gen = GenerationConfig(max_new_tokens=min(spec.max_new_tokens, 32), stop_at_eos=False)
    for measure in spec.early_exit_measures:
        cfg = EarlyExitConfig(threshold=1.0, measure=measure)
        trace = engine.generate(spec.prompts[0], cfg, gen, TRACE_OFF, chat_template=spec.chat_template)
        min_exit = min(cfg.min_layers, engine.num_layers)
        out[measure] = ([list(s.confidence) for s in trace.steps[1:]], min_exit)
    return out


def all_settings(spec: SweepSpec, engine: Any) -> list[Setting]:
    """Full depth first (the reference row), then D3, then the baselines."""
    L = engine.num_layers
    profiles = calibrate_early_exit(engine, spec)
    d3 = [replace(s, config=engine.resolve(s.config)) for s in d3_settings(spec, L)]  # a calibration's name -> layers
    return [Setting(label(FullConfig()), FullConfig(), 1.0), *d3, *planned_baselines(spec, L),
            *early_exit_settings(spec, L, profiles)]
