"""Information flow per layer (Fig. 3): how much the attention and MLP sublayers change the hidden state."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from d3.config import default_core
from d3.trace import Trace
from viz.layout import (
    SUBLAYER_COLORS,
    SUBLAYER_NAMES,
    axis_ref,
    core_legend_entry,
    core_shapes,
    empty_figure,
    fit_title,
    fmt,
    layer_kinds,
    make_figure,
    nanmean_count,
    panels,
    strategy_label,
)

SUBLAYERS = ("attn", "mlp")
METRIC_AXES = {
    # (panel title, y title). One short line each: a rotated axis title longer than its plot runs up into the
    # figure's title, and a second line of the right panel's title reaches back over the left panel's plot.
    "cos": ("cosine change (higher = more)", "1 − cos(in, out)"),
    "dist": ("relative distance (higher = more)", "‖out − in‖ / ‖in‖"),
}


def metric_list(metric: str) -> list[str]:
    """The metrics to draw, one subplot each: "cos", "dist" or "both"."""
    if metric == "both":
        return ["cos", "dist"]
    if metric not in METRIC_AXES:
        raise ValueError(f"metric={metric!r} is not allowed: metric must be one of cos, dist, both")
    return [metric]


def as_change(values: np.ndarray, metric: str) -> np.ndarray:
    """Bigger = more change: 1 - cosine for "cos", the relative distance as it is for "dist"."""
    values = np.asarray(values, dtype=np.float64)
    return 1.0 - values if metric == "cos" else values


def _flow_layout(metrics: list[str], num_layers: int, core: tuple[int, int]) -> dict[str, Any]:
    """Layout of side-by-side panels (one per metric) with layers on x and the core layers shaded."""
    layout = panels(len(metrics), titles=[METRIC_AXES[m][0] for m in metrics], spacing=0.14)
    shapes: list[dict] = []
    for index, metric in enumerate(metrics, start=1):
        xref, yref = axis_ref(index)
        shapes += core_shapes(num_layers, core, axis="x", xref=xref, yref=yref)
        layout["xaxis" + xref[1:]].update(title=dict(text="layer"), range=[-0.5, num_layers - 0.5])
        layout["yaxis" + yref[1:]].update(title=dict(text=METRIC_AXES[metric][1]), rangemode="tozero")
    layout["shapes"] = shapes
    return layout


def _flow_line(y: np.ndarray, *, index: int, sub: str, metric: str, source: str, dash: str, kinds: Sequence[str],
               counts: np.ndarray | None = None, spread: np.ndarray | None = None) -> list[go.Scatter]:
    """One sublayer's change per layer (y [L]) in panel `index`, with plain-language hover; `spread` [L]
    adds a translucent band of y ± spread."""
    num_layers = len(y)
    name = f"{SUBLAYER_NAMES[sub]} · {source}"
    color = SUBLAYER_COLORS[sub]
    xref, yref = axis_ref(index)
    hover = []
    for layer in range(num_layers):
        parts = [f"layer {layer} ({kinds[layer]})", f"{SUBLAYER_NAMES[sub]} sublayer, {source}",
                 f"{METRIC_AXES[metric][0]} {fmt(y[layer])}"]
        if spread is not None:
            parts.append(f"± {fmt(spread[layer])}")
        if counts is not None:
            parts.append(f"mean over {int(counts[layer])} " + ("tokens that ran it" if counts[layer] else "tokens: never ran"))
        hover.append(" · ".join(parts))
    x = np.arange(num_layers)
    out = []
    if spread is not None:
        lo, hi = y - spread, y + spread
        ok = np.isfinite(lo) & np.isfinite(hi)
        out.append(go.Scatter(x=np.concatenate([x[ok], x[ok][::-1]]), y=np.concatenate([hi[ok], lo[ok][::-1]]),
                              fill="toself", fillcolor=_translucent(color), line=dict(width=0), hoverinfo="skip",
                              legendgroup=name, showlegend=False, xaxis=xref, yaxis=yref,
                              meta={"role": "band", "name": name}))
    out.append(go.Scatter(x=x, y=y, mode="lines+markers", name=name, legendgroup=name, showlegend=index == 1,
                          line=dict(color=color, dash=dash, width=2.5), marker=dict(size=6), text=hover,
                          hovertemplate="%{text}<extra></extra>", xaxis=xref, yaxis=yref,
                          meta={"role": "flow", "sublayer": sub, "metric": metric, "source": source}))
    return out


def _translucent(hex_color: str, alpha: float = 0.18) -> str:
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r}, {g}, {b}, {alpha})"


def generated_means(trace: Trace, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(nan-mean over decode steps [L], decode steps that ran each layer [L]) of one LAYER_STATS value.
    Step 0 is left out: its statistics are the full-depth prefill's last position (as `d3.research.sweep.table.block_rows`)."""
    decode = np.array([s.step > 0 for s in trace.steps], dtype=bool)
    return nanmean_count(trace.stat(name)[decode], axis=0)


def sublayer_flow(trace: Trace, *, metric: str = "both", compare: Trace | None = None, title: str | None = None,
                  presentation: bool = False, height: int | None = None) -> go.Figure:
    """Per layer, the change attention and MLP make to the residual stream: prompt mean
    (`trace.prompt_stats.stats[name]`, [L], dotted) and the nan-mean over generated tokens
    (`trace.stat(name)`, [T, L] -> [L], decode steps only, solid); `compare` (e.g. full depth) adds its generated
    means dashed. One subplot per metric, core layers shaded."""
    metrics = metric_list(metric)
    has_stats = any(np.isfinite(trace.stat(f"{s}_{m}")).any() for s in SUBLAYERS for m in metrics) or any(
        f"{s}_{m}" in trace.prompt_stats.stats for s in SUBLAYERS for m in metrics)
    if not has_stats:
        return empty_figure("No sublayer statistics in this trace: run with TraceConfig(sublayer_stats=True).",
                            title=title, presentation=presentation, height=height)
    kinds = layer_kinds(trace.num_layers, trace.core)
    label = strategy_label(trace.strategy)
    lines: list[go.Scatter] = []
    for index, m in enumerate(metrics, start=1):
        for sub in SUBLAYERS:
            name = f"{sub}_{m}"
            style = dict(index=index, sub=sub, metric=m, kinds=kinds)
            prompt = trace.prompt_stats.stats.get(name)
            if prompt is not None:
                lines += _flow_line(as_change(prompt, m), dash="dot", source="prompt (full depth)", **style)
            mean, count = generated_means(trace, name)
            lines += _flow_line(as_change(mean, m), dash="solid", counts=count, source=f"generated, {label}", **style)
            if compare is not None:
                mean, count = generated_means(compare, name)
                lines += _flow_line(as_change(mean, m), dash="dash", counts=count,
                                    source=f"generated, {strategy_label(compare.strategy)}", **style)
        title = title if title is not None else fit_title("How much each sublayer changes the hidden state", label)
    return make_figure(lines + [core_legend_entry()], _flow_layout(metrics, trace.num_layers, trace.core), title=title,
                       presentation=presentation, height=height or 480)


def stats_frame(traces: Iterable[Trace] | Mapping[str, Trace], *, source: str = "generated") -> pd.DataFrame:
    """One row per (trace, layer): the trace's mean of each sublayer stat at that layer, over its
    generated tokens (`source="generated"`) or its prompt (`source="prompt"`)."""
    items = traces.items() if isinstance(traces, Mapping) else enumerate(traces)
    rows: list[dict[str, Any]] = []
    names = [f"{sub}_{m}" for sub in SUBLAYERS for m in METRIC_AXES]
    for key, trace in items:
        per_layer = {}  # name -> [L]
        for name in names:
            if source == "prompt":
                values = trace.prompt_stats.stats.get(name)
                per_layer[name] = np.full(trace.num_layers, np.nan) if values is None else np.asarray(values, np.float64)
            else:
                per_layer[name] = generated_means(trace, name)[0]
        for layer in range(trace.num_layers):
            rows.append({"trace": key, "layer": layer, **{name: float(per_layer[name][layer]) for name in names}})
    return pd.DataFrame(rows)


def _mean_lines(data: pd.DataFrame, metrics: Sequence[str], kinds: Sequence[str], *, band: str,
                unit: str) -> list[go.Scatter]:
    """One line per (metric, sublayer) present in `data`: the mean per layer with its ± `band` spread."""
    layers = pd.RangeIndex(len(kinds), name="layer")
    lines: list[go.Scatter] = []
    for index, m in enumerate(metrics, start=1):
        for sub in SUBLAYERS:
            name = f"{sub}_{m}"
            if name not in data:
                continue
            grouped = data.groupby("layer")[name]
            mean = grouped.mean().reindex(layers).to_numpy(dtype=np.float64)
            spread = grouped.std(ddof=1).reindex(layers).to_numpy(dtype=np.float64)
            count = grouped.count().reindex(layers, fill_value=0).to_numpy()
            if band == "sem":
                spread = spread / np.sqrt(np.maximum(count, 1))
            lines += _flow_line(as_change(mean, m), index=index, sub=sub, metric=m, dash="solid", kinds=kinds,
                                spread=np.nan_to_num(spread, nan=0.0), source=f"mean over {int(count.max())} {unit}")
    return lines


def block_change(data: pd.DataFrame | Sequence[Trace] | Mapping[str, Trace], *, metric: str = "both",
                 source: str = "generated", band: str = "std", core: tuple[int, int] | None = None,
                 title: str | None = None, presentation: bool = False, height: int | None = None) -> go.Figure:
    """Per-block change across layers over a dataset (paper Fig. 3): the mean over rows of
    attention/MLP change per layer with a ± `band` ("std" or "sem") error band.

    data: traces (each first reduced to its per-layer means, see `stats_frame`) or a DataFrame with a
    `layer` column and any of attn_cos, attn_dist, mlp_cos, mlp_dist (e.g. `Trace.to_frame()` rows,
    in which case the band spreads over tokens)."""
    if source not in ("generated", "prompt"):
        raise ValueError(f"source={source!r} is not allowed: source must be generated or prompt")
    if band not in ("std", "sem"):
        raise ValueError(f"band={band!r} is not allowed: band must be std or sem")
    metrics = metric_list(metric)
    unit = "rows"
    if not isinstance(data, pd.DataFrame):
        unit = "traces"
        traces = list(data.values()) if isinstance(data, Mapping) else list(data)
        core = core or (traces[0].core if traces else None)
        data = stats_frame(traces, source=source)
    if data.empty or "layer" not in data:
        return empty_figure("No per-layer statistics to average.", title=title, presentation=presentation,
                            height=height)
    num_layers = int(data["layer"].max()) + 1
    core = core or default_core(num_layers)
    lines = _mean_lines(data, metrics, layer_kinds(num_layers, core), band=band, unit=unit)
    title = title if title is not None else f"Change per block across layers (mean ± {band}, paper Fig. 3)"
    return make_figure(lines + [core_legend_entry()], _flow_layout(metrics, num_layers, core), title=title,
                       presentation=presentation, height=height or 480)
