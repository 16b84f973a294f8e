"""Tokens x layers grids (Fig. 1): which layers each token ran, skipped or filled, actual or planned."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from d3.config import StrategyConfig
from d3.schedule import planned_fills, planned_grid
from d3.trace import (
    FILL_CODES,
    FILLED_COPY,
    FILLED_PROPAGATE,
    HOLE,
    RAN,
    SKIPPED,
    Trace,
)
from viz.layout import (
    CELL_CODES,
    CELL_COLORS,
    CORE_FILL,
    axis_ref,
    cell_names,
    core_legend_entry,
    core_shapes,
    decode_plan,
    display_core,
    drawn_core,
    fit_title,
    layer_kinds,
    make_figure,
    panels,
    plot_text,
    quoted,
    shown_text,
    strategy_label,
    tick_subset,
)

assert CELL_CODES == tuple(range(len(CELL_CODES))), "the discrete colour scale assumes codes 0..n-1"


def _cell_coloraxis() -> dict:
    """A shared discrete colour axis: one flat colour band per cell code. No colour bar: each colour is a legend
    entry (`cell_legend`), which wraps under the grid on a narrow screen where a colour bar would take the width
    of ten layers."""
    n = len(CELL_CODES)
    scale = []
    for code in CELL_CODES:
        scale += [[code / n, CELL_COLORS[code]], [(code + 1) / n, CELL_COLORS[code]]]
    return dict(colorscale=scale, cmin=-0.5, cmax=n - 0.5, showscale=False)


def cell_legend() -> list[go.Scatter]:
    """One legend entry per cell colour, in code order (invisible traces: the legend names the grid's colours)."""
    return [go.Scatter(x=[None], y=[None], mode="markers", name=name, legendrank=1000 + code, hoverinfo="skip",
                       marker=dict(symbol="square", size=14, color=CELL_COLORS[code], line=dict(color="#6B7280", width=1)),
                       meta={"role": "cell-legend", "code": code})
            for code, name in zip(CELL_CODES, cell_names())]


STATE_PHRASES = {
    RAN: "ran",
    SKIPPED: "skipped: no KV entry written",
    FILLED_PROPAGATE: "skipped: KV computed from the hidden state<br>passed through unchanged (propagate)",
    HOLE: "skipped: KV left empty<br>and masked out of attention (hole)",
}


def cell_hover(codes: np.ndarray, row_labels: Sequence[str], kinds: Sequence[str], *,
               sources: np.ndarray | None = None, planned: bool = False) -> np.ndarray:
    """Hover text [T, L] for a grid of cell codes [T, L]; `row_labels` [T] name each row, `kinds` [L]
    is "core"/"flex" per layer. `sources` (int [T, L], -1 where unknown) is where each copied cell's KV entry came
    from, as the decoder recorded it (`Trace.fill_sources`): a copied cell names that layer and nothing is worked out
    here. Built with elementwise object-array ops: a planned grid of 512 x 32 cells is redrawn on every slider move."""
    num_layers = codes.shape[1]
    src = np.full(codes.shape, -1, dtype=np.int64) if sources is None else np.asarray(sources, dtype=np.int64)
    state = np.empty(codes.shape, dtype=object)
    for code, phrase in STATE_PHRASES.items():
        state[codes == code] = phrase
    copied = codes == FILLED_COPY
    layer_ids = np.broadcast_to(np.arange(num_layers), codes.shape)
    known = copied & (src >= 0)
    from_below = known & (src < layer_ids)
    from_above = known & (src > layer_ids)
    state[from_below] = np.array([f"skipped: KV filled by copying layer {k}" for k in range(num_layers)],
                                 dtype=object)[src[from_below]]
    state[from_above] = np.array([f"skipped: KV filled by copying layer {k}<br>(no lower layer of its type ran)"
                                  for k in range(num_layers)], dtype=object)[src[from_above]]
    state[copied & ~known] = "skipped: KV filled by copy"
    prefix = " · planned: " if planned else " · "
    # Short lines (the row, then the cell): a label as wide as a phone's grid would be cut at its edge.
    rows = np.array([f"{label}<br>" for label in row_labels], dtype=object)[:, None]  # [T, 1]
    cored = "core" in kinds  # a strategy without a core has no flex layers either: the hover names the layer alone
    layers = np.array([f"layer {layer}" + (f" ({kinds[layer]})" if cored else "") + prefix
                       for layer in range(num_layers)], dtype=object)
    return rows + layers[None, :] + state  # [T, L]


def fill_grid(fills: Sequence[Sequence[tuple[int, str, int | None]]], ran: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes int8 [T, L], sources int16 [T, L]) from per-row fill decisions (`d3.schedule.planned_fills`) and the
    layers that ran (bool [T, L])."""
    codes = np.where(ran, RAN, SKIPPED).astype(np.int8)
    sources = np.full(ran.shape, -1, dtype=np.int16)
    for t, row in enumerate(fills):
        for layer, how, source in row:
            codes[t, layer] = FILL_CODES[how]
            if source is not None:
                sources[t, layer] = source
    return codes, sources


def _grid_panel(codes: np.ndarray, ys: Sequence[int], row_labels: Sequence[str], core: tuple[int, int], *,
                index: int, tick_text: Sequence[str] | None, planned: bool, max_labels: int, name: str,
                max_layer_ticks: int = 16, sources: np.ndarray | None = None) -> tuple[go.Heatmap, list[dict], dict, dict]:
    """One tokens x layers heatmap (z = codes [T, L]) for panel `index` (1-based): the trace, its core
    shapes, and its x / y axis settings."""
    num_layers = codes.shape[1]
    xref, yref = axis_ref(index)
    heat = go.Heatmap(
        z=codes, x=np.arange(num_layers), y=np.asarray(ys), coloraxis="coloraxis", name=name, xaxis=xref, yaxis=yref,
        text=cell_hover(codes, row_labels, layer_kinds(num_layers, core), sources=sources, planned=planned),
        hovertemplate="%{text}<extra></extra>", xgap=1, ygap=1 if len(ys) <= 128 else 0,
        meta={"role": "grid", "name": name},
    )
    shapes = core_shapes(num_layers, core, axis="x", xref=xref, yref=yref, strip=True)
    picks = tick_subset(len(ys), max_labels)
    yaxis = dict(autorange="reversed", tickmode="array", tickvals=[ys[i] for i in picks], showgrid=False)
    if tick_text is not None:
        yaxis["ticktext"] = [tick_text[i] for i in picks]
    xaxis = dict(tickmode="array", tickvals=tick_subset(num_layers, max_layer_ticks).tolist(),
                 title=dict(text="layer"), range=[-0.5, num_layers - 0.5], showgrid=False)
    return heat, shapes, xaxis, yaxis


def _grid_figure(panels_: list[tuple[go.Heatmap, list[dict], dict, dict]], *, titles: Sequence[str] | None,
                 y_title: str, title: str, presentation: bool, height: int) -> go.Figure:
    """Grid panels side by side on one discrete cell colour axis, with the core legend entry."""
    layout = panels(len(panels_), titles=titles, spacing=0.03)
    shapes: list[dict] = []
    for i, (_, panel_shapes, xaxis, yaxis) in enumerate(panels_):
        suffix = "" if i == 0 else str(i + 1)
        layout["xaxis" + suffix].update(xaxis)
        layout["yaxis" + suffix].update(yaxis)
        shapes += panel_shapes
    layout["yaxis"]["title"] = dict(text=y_title)
    for note in layout["annotations"]:
        note["yshift"] = 14  # subplot titles clear the core/flex ribbon
    layout.update(shapes=shapes, coloraxis=_cell_coloraxis())
    # the core's legend entry only where a panel draws a core band (a strategy without one draws none)
    cored = any(shape.get("fillcolor") == CORE_FILL for _, panel_shapes, *_ in panels_ for shape in panel_shapes)
    data = [heat for heat, *_ in panels_] + cell_legend() + ([core_legend_entry()] if cored else [])
    return make_figure(data, layout, title=title, presentation=presentation, height=height)


def _grid_height(rows: int, height: int | None) -> int:
    return height or int(np.clip(16 * rows + 160, 360, 1600))


def _trace_rows(trace: Trace, max_tokens: int | None) -> tuple[np.ndarray, list[int], list[str], list[str], np.ndarray]:
    """(codes [T, L], steps [T], hover row labels [T], tick labels [T], fill sources [T, L]) for the first
    `max_tokens` tokens."""
    steps = trace.steps[:max_tokens]
    codes = trace.grid()[: len(steps)]
    ys = [s.step for s in steps]
    hover_rows = [f"token {quoted(shown_text(s))} (step {s.step}) · {s.n_layers}/{trace.num_layers} layers" for s in steps]
    return codes, ys, hover_rows, [plot_text(shown_text(s)) for s in steps], trace.fill_sources()[: len(steps)]


def layer_grid(trace: Trace, *, title: str | None = None, max_tokens: int | None = None, token_labels: bool = True,
               max_labels: int = 80, presentation: bool = False, height: int | None = None) -> go.Figure:
    """Per-token layer usage: a heatmap of `trace.grid()` (int8 [T, L] cell codes), one row per generated
    token (labelled with its text) and one column per layer, core bands marked."""
    codes, ys, hover_rows, ticks, sources = _trace_rows(trace, max_tokens)
    if presentation:  # rows are 16 px high and the labels 22 px: every other row is labelled, so none overlap
        max_labels = min(max_labels, (len(ys) + 1) // 2)
    panel = _grid_panel(codes, ys, hover_rows, drawn_core(trace), index=1, tick_text=ticks if token_labels else None,
                        planned=False, max_labels=max_labels, name=strategy_label(trace.strategy), sources=sources)
    title = title if title is not None else fit_title(
        "Layers per token", f"{strategy_label(trace.strategy)} · {trace.mean_layers:.1f}/{trace.num_layers} on average")
    return _grid_figure([panel], titles=None, y_title="generated token" if token_labels else "step", title=title,
                        presentation=presentation, height=_grid_height(len(ys), height))


def planned_grid_figure(cfg: StrategyConfig, num_layers: int, steps: int, *, layer_types: Sequence[str] | None,
                        show_fill: bool = False, title: str | None = None, max_labels: int = 40,
                        presentation: bool = False, height: int | None = None) -> go.Figure:
    """The planned grid from `d3.schedule.planned_grid` (bool [steps, L]) without running a model.
    `show_fill` colours planned skips as the decoder would fill them (`d3.schedule.planned_fills`) with the model's
    `layer_types` [L] (required: on Gemma 3 a global layer copies a global one, so assuming one type names the wrong
    source); None where they are not known yet (a model not loaded): the skips are then drawn without their fills."""
    cfg.check_layers(num_layers)
    if layer_types is not None and len(layer_types) != num_layers:
        raise ValueError(f"layer_types has {len(layer_types)} entries for {num_layers} layers")
    ran = np.array(planned_grid(cfg, num_layers, steps), dtype=bool).reshape(steps, num_layers)
    codes, sources = np.where(ran, RAN, SKIPPED).astype(np.int8), None  # [steps, L]
    if show_fill and layer_types is not None:
        codes, sources = fill_grid(planned_fills(cfg, num_layers, steps, list(layer_types)), ran)
    ys = list(range(steps))
    counts = ran.sum(axis=1)
    hover_rows = [f"step {i} · {counts[i]}/{num_layers} layers" for i in ys]
    fig_height = height or _planned_height(min(steps, 60))
    # One step label per TICK_PX of plot at most (the plot is the figure less about CHROME_PX of title, axis and, on a
    # phone, the legend under it), and at most PLANNED_LAYER_TICKS layer labels: they overlapped at 1280 and on a
    # phone (issue 35).
    max_labels = min(max_labels, max(2, (fig_height - CHROME_PX) // TICK_PX))
    panel = _grid_panel(codes, ys, hover_rows, display_core(cfg, num_layers), index=1, tick_text=None, planned=True,
                        max_labels=max_labels, name=strategy_label(cfg), sources=sources,
                        max_layer_ticks=PLANNED_LAYER_TICKS)
    first = decode_plan(cfg, num_layers)
    if title is None:
        notes = [strategy_label(cfg)]
        if show_fill and layer_types is None:
            notes.append("fills are drawn once the model is loaded (its layer types decide the copy sources)")
        if first.dynamic:
            notes.append(f"early exit decides per token while decoding: this is only the upper bound "
                         f"(a token may stop after layer {first.min_exit - 1})")
        title = fit_title("Planned layers", *notes)
    return _grid_figure([panel], titles=None, y_title="generated token (step)", title=title,
                        presentation=presentation, height=fig_height)


TICK_PX = 22  # px of plot per step label: a label is about 14 px high
CHROME_PX = 300  # px of a planned grid's figure that is not plot (title, axis, the legend under it on a phone)
PLANNED_LAYER_TICKS = 10  # layer labels at most: every third of 30 layers, legible in a phone's 250 px


def _planned_height(rows: int) -> int:
    """The planned grid's height: room for its legend under the plot on a phone, and 18 px per planned step."""
    return int(np.clip(18 * rows + CHROME_PX, 460, 1600))


def fig1_panels(traces: dict[str, Trace], *, max_tokens: int | None = 64, title: str | None = None,
                presentation: bool = False, height: int | None = None) -> go.Figure:
    """Small multiples as in the paper's Fig. 1: one tokens x layers grid per trace (e.g. full depth,
    early exit, SkipDecode, D3), side by side on one shared cell colour scale."""
    if not traces:
        raise ValueError("traces must name at least one trace, e.g. {'full depth': trace}")
    names = list(traces)
    built = []
    for index, name in enumerate(names, start=1):
        codes, ys, hover_rows, _, sources = _trace_rows(traces[name], max_tokens)
        built.append(_grid_panel(codes, ys, hover_rows, drawn_core(traces[name]), index=index, tick_text=None, planned=False,
                                 max_labels=16, name=name, max_layer_ticks=max(2, 24 // len(names)), sources=sources))
    longest = max(min(len(t.steps), max_tokens or len(t.steps)) for t in traces.values())
    title = title if title is not None else "Which layers each token ran (paper Fig. 1)"
    return _grid_figure(built, titles=names, y_title="generated token (step)", title=title, presentation=presentation,
                        height=_grid_height(longest, height))
