"""Attention overviews for a projector: where D3 changes attention (one cell per layer and head: the Jensen-Shannon
divergence between D3's and full depth's attention rows, `divergence_overview`), and every head of one layer (or one
head across the recorded layers), for D3, full depth and D3 minus full depth, as a grid of heatmaps on two shared colour
scales (`attention_overview`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go

from d3.trace import Trace, token_agreement
from viz.attention import SKIPPED_FILL, SKIPPED_TEXT, attention_matrix, prompt_length
from viz.layout import (
    PANEL_TITLES,
    SEQUENTIAL,
    axis_ref,
    empty_figure,
    fit_title,
    font_size,
    guide_line,
    make_figure,
    short_label,
    title_margin,
)

DIVERGING = "RdBu_r"  # red: D3 attends more than full depth; blue: less; white: the same
COLUMNS = ("d3", "full", "difference")
COLUMN_GAP = 0.04
ROW_GAP = 0.035
MAX_TOKENS = 128  # rows per panel: 27 panels of 128 x ~200 keys stay under a few MB for the browser
WEIGHT_PERCENTILE = 99  # the top of the weight scale; larger weights draw in its darkest colour


def compared_weights(d3: Trace, full: Trace, layer: int, head: int,
                     max_tokens: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(D3 [T, K], full depth [T, K]) attention weights of one layer and head over the positions both runs reached:
    T = the shorter run's tokens (at most `max_tokens`), K = prompt + T - 1 keys (what the last compared token
    sees); NaN where a token did not run the layer (or nothing was recorded) and right of each token's own keys."""
    steps = min(len(d3.steps), len(full.steps), max_tokens or len(full.steps))
    keys = prompt_length(full, layer) + steps - 1
    mine, theirs = (attention_matrix(run, layer, head, min_width=keys)[:steps, :keys] for run in (d3, full))
    return mine, theirs


def difference(d3_weights: np.ndarray, full_weights: np.ndarray) -> np.ndarray:
    """D3 minus full depth, [T, K]; NaN where either is missing."""
    return np.asarray(d3_weights, dtype=np.float32) - np.asarray(full_weights, dtype=np.float32)


def symmetric_range(diffs: list[np.ndarray]) -> float:
    """The largest |difference| over all panels (a small floor so identical runs still get a scale)."""
    finite = [np.abs(d[np.isfinite(d)]) for d in diffs]
    return float(max([1e-3] + [x.max() for x in finite if x.size]))


def num_heads(*runs: Trace) -> int:
    """Heads per layer: the trace's own count, else read off a recorded attention array [heads, kv_len]."""
    for run in runs:
        if run.num_heads:
            return run.num_heads
    for run in runs:
        for s in run.steps:
            for weights in s.attention.values():
                return int(np.asarray(weights).shape[0])
    return 0


def recorded_layers(*runs: Trace) -> list[int]:
    """Layers with attention recorded in any of the runs, ascending."""
    return sorted({layer for run in runs for s in run.steps for layer in s.attention}
                  | {layer for run in runs for layer in run.prompt_stats.attention})


def _panel_rows(d3: Trace, full: Trace, layer: int | None, head: int | None) -> list[tuple[int, int, str]]:
    """(layer, head, row label) per row of panels: every head of `layer`, or `head` at every recorded layer."""
    if (layer is None) == (head is None):
        raise ValueError("choose one: layer (all heads of one layer) or head (one head across the recorded layers)")
    heads = num_heads(d3, full)
    if layer is not None:
        return [(layer, h, f"head {h}") for h in range(heads)]
    if heads and not 0 <= head < heads:
        raise ValueError(f"head={head} is not allowed: head must be in [0, {heads - 1}]")
    return [(k, head, f"layer {k}") for k in recorded_layers(d3, full)]


def _span(lo: float, size: float) -> list[float]:
    """[lo, lo + size] within [0, 1] (float error puts the bottom row's edge a hair below 0, which plotly refuses)."""
    return [max(0.0, round(lo, 6)), min(1.0, round(lo + size, 6))]


def _domains(rows: int) -> list[list[tuple[list[float], list[float]]]]:
    """[row][column] -> (x domain, y domain), row 0 at the top."""
    width = (1 - COLUMN_GAP * (len(COLUMNS) - 1)) / len(COLUMNS)
    height = (1 - ROW_GAP * (rows - 1)) / rows
    return [[(_span(c * (width + COLUMN_GAP), width), _span(1 - r * (height + ROW_GAP) - height, height))
             for c in range(len(COLUMNS))] for r in range(rows)]


def _heat(z: np.ndarray, index: int, coloraxis: str, name: str, what: str) -> go.Heatmap:
    xref, yref = axis_ref(index)
    return go.Heatmap(z=z, coloraxis=coloraxis, xaxis=xref, yaxis=yref, hoverongaps=False, name=name,
                      hovertemplate=f"{what} · token %{{y}} · key %{{x}} · %{{z:.3f}}<extra></extra>",
                      meta={"role": "attention-overview", "column": name})


def _grey(skipped: list[int], shape: tuple[int, int], index: int, layer: int) -> list[go.Heatmap]:
    """A flat grey layer over the rows of tokens where D3 skipped `layer` (those rows are NaN)."""
    if not skipped:
        return []
    z = np.full(shape, np.nan, dtype=np.float32)
    z[skipped] = 1.0
    xref, yref = axis_ref(index)
    return [go.Heatmap(z=z, xaxis=xref, yaxis=yref, colorscale=[[0, SKIPPED_FILL], [1, SKIPPED_FILL]], zmin=0, zmax=1,
                       showscale=False, hoverongaps=False, name="skipped", meta={"role": "skipped-rows"},
                       hovertemplate=f"token %{{y}}: D3 skipped layer {layer}<extra></extra>")]


def _row(d3: Trace, full: Trace, layer: int, head: int, label: str, first: int,
         max_tokens: int) -> tuple[list, list[np.ndarray]]:
    """The three heatmaps (and greyed rows) of one row of panels, numbered from `first`; and its difference [T, K]."""
    mine, theirs = compared_weights(d3, full, layer, head, max_tokens)
    diff = difference(mine, theirs)
    skipped = [t for t, s in enumerate(d3.steps[: len(mine)]) if layer not in s.layers_run]
    where = f"{label}" if label.startswith("layer") else f"layer {layer}, {label}"
    data = [_heat(mine, first, "coloraxis", "d3", f"D3 · {where}"),
            _heat(theirs, first + 1, "coloraxis", "full", f"full depth · {where}"),
            _heat(diff, first + 2, "coloraxis2", "difference", f"D3 − full depth · {where}")]
    data += _grey(skipped, mine.shape, first, layer) + _grey(skipped, mine.shape, first + 2, layer)
    return data, [mine, theirs, diff]


def _axes(domains, rows: list[tuple[int, int, str]], prompt_len: int, divergence: int | None,
          presentation: bool) -> tuple[dict[str, Any], list[dict]]:
    """Axis settings per panel (ticks only on the outer ones, tokens down, keys across) and the guide lines: the
    prompt's end (dotted, vertical) and the first token where the texts differ (dashed, horizontal)."""
    layout: dict[str, Any] = {}
    shapes: list[dict] = []
    small = dict(size=font_size(presentation, delta=-4))
    for r, (_, _, label) in enumerate(rows):
        for c in range(len(COLUMNS)):
            index = r * len(COLUMNS) + c + 1
            xref, yref = axis_ref(index)
            x_dom, y_dom = domains[r][c]
            layout["xaxis" + xref[1:]] = dict(domain=x_dom, anchor=yref, showgrid=False, nticks=4, tickfont=small,
                                              showticklabels=r == len(rows) - 1,
                                              # once, under the middle column: three side by side overlap on a phone
                                              title=dict(text="key position") if (r, c) == (len(rows) - 1, 1) else None)
            layout["yaxis" + yref[1:]] = dict(domain=y_dom, anchor=xref, autorange="reversed", showgrid=False,
                                              nticks=3, tickfont=small, showticklabels=c == 0,
                                              title=dict(text=label, font=dict(size=font_size(presentation, delta=-2)))
                                              if c == 0 else None)
            if prompt_len:
                shapes.append(guide_line(x=prompt_len - 0.5, xref=xref, yref=yref, color="#D55E00", dash="dot"))
            if divergence is not None:
                shapes.append(guide_line(y=divergence - 0.5, xref=xref, yref=yref, color="#111827", dash="dash"))
    return layout, shapes


def _column_titles(domains, presentation: bool) -> list[dict]:
    names = ["D3", "full", "D3 − full"]  # short: on a phone each panel is about 70 px wide
    return [dict(text=name, x=sum(domains[0][c][0]) / 2, xref="paper", xanchor="center", y=1, yref="paper",
                 yanchor="bottom", yshift=4, showarrow=False, font=dict(size=font_size(presentation, delta=-1)))
            for c, name in enumerate(names)]


def _color_axes(weights: list[np.ndarray], diffs: list[np.ndarray], presentation: bool) -> dict[str, Any]:
    """One scale for D3's and full depth's weights (0 to their 99th percentile: the few weights on an attention sink,
    near 1, would leave the rest of the scale pale), one diverging scale centred at 0 for the difference (symmetric:
    -m to m, m the largest |difference|)."""
    finite = np.concatenate([w[np.isfinite(w)] for w in weights])
    top = max(float(np.percentile(finite, WEIGHT_PERCENTILE)) if finite.size else 0.0, 1e-3)
    m = symmetric_range(diffs)
    bar = dict(thickness=14, len=0.45, x=1.02, tickfont=dict(size=font_size(presentation, delta=-4)))
    return dict(coloraxis=dict(colorscale=SEQUENTIAL, cmin=0, cmax=top,
                               colorbar=dict(bar, y=0.77, title=dict(text="weight"))),
                coloraxis2=dict(colorscale=DIVERGING, cmin=-m, cmax=m, cmid=0,
                                colorbar=dict(bar, y=0.23, title=dict(text="D3 −<br>full"))))


def attention_overview(d3: Trace, full: Trace, *, layer: int | None = None, head: int | None = None,
                       max_tokens: int = MAX_TOKENS, title: str | None = None, presentation: bool = False,
                       height: int | None = None) -> go.Figure:
    """Attention of the generated tokens (rows [T], down) over key positions (columns [K], prompt then generated):
    one row of three panels per head of `layer`, or per recorded layer for `head` (give one of the two): D3, full
    depth, and D3 minus full depth, over the positions both runs reached (`compared_weights`; the first `max_tokens`
    of them). Weights share one colour scale, the difference a diverging one centred at 0 (symmetric); rows of
    tokens where D3 skipped the layer are grey, a dashed line marks where the two texts start to differ."""
    if d3.prompt != full.prompt:
        raise ValueError("the D3 run and the full-depth run must answer the same prompt to compare their attention")
    if not (isinstance(max_tokens, int) and max_tokens >= 1):
        raise ValueError(f"max_tokens={max_tokens!r} is not allowed: max_tokens must be an integer >= 1")
    rows = _panel_rows(d3, full, layer, head)
    captured = [k for k in {k for k, _, _ in rows} if any(k in s.attention for s in full.steps)]
    if not rows or not captured or min(len(d3.steps), len(full.steps)) == 0:
        where = f"layer {layer}" if layer is not None else "any layer"
        return empty_figure(f"No attention of full depth was captured for {where}. Add the layer to "
                            "TraceConfig.attention_layers and run both again.", title=title, presentation=presentation,
                            height=height)
    domains = _domains(len(rows))
    data, weights, diffs = [], [], []
    for r, (k, h, label) in enumerate(rows):
        traces, (mine, theirs, diff) = _row(d3, full, k, h, label, r * len(COLUMNS) + 1, max_tokens)
        data += traces
        weights += [mine, theirs]
        diffs.append(diff)
    divergence = token_agreement(d3.token_ids, full.token_ids).first_divergence
    divergence = divergence if divergence is not None and divergence < len(weights[0]) else None  # among the rows
    layout, shapes = _axes(domains, rows, prompt_length(full, rows[0][0]), divergence, presentation)
    layout.update(_color_axes(weights, diffs, presentation), shapes=shapes,
                  annotations=_column_titles(domains, presentation), margin=dict(r=90))
    if title is None:
        what = f"all heads of layer {layer}" if layer is not None else f"head {head}, layer by layer"
        both = min(len(d3.steps), len(full.steps))
        shown_of = f"the first {len(weights[0])} of {both} tokens" if len(weights[0]) < both else f"{both} tokens"
        notes = [f"{short_label(d3.strategy)} vs full depth, {shown_of}"]
        if any(k not in s.layers_run for k, _, _ in rows for s in d3.steps[: len(weights[0])]):
            notes.append(("grey rows: D3 skipped the layer", SKIPPED_TEXT))
        if divergence is not None:
            notes.append(f"dashed: texts differ from token {divergence}")
        title = fit_title(f"Attention overview · {what}", *notes)
    row_px = 165 if presentation else 125
    return make_figure(data, layout, title=title, presentation=presentation, legend=False,
                       height=height or int(np.clip(row_px * len(rows) + 230, 380, 2000)))


# ---------------------------------------------------------------- where D3 changes attention: layers x heads


DIVERGENCE_HEIGHT = {False: 400, True: 480}  # px: with the page's header and tabs it fits a 1280x800 screen


def js_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen-Shannon divergence in bits (0: the same weights, 1: no key in common) of two attention rows over the same
    keys [keys]; each is normalised to sum 1 (float16 rows sum to 1 only within rounding). A key with zero weight in
    a row adds nothing to that row's term (0 log 0 = 0), as in scipy's `jensenshannon` (whose square is this)."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    p, q = p / p.sum(), q / q.sum()
    m = (p + q) / 2
    return float(max(0.0, (_kl_bits(p, m) + _kl_bits(q, m)) / 2))


def _kl_bits(p: np.ndarray, m: np.ndarray) -> float:
    """KL(p || m) in bits over the keys where p > 0 (m > 0 there, since m is the mean of p and another row)."""
    where = p > 0
    return float(np.sum(p[where] * np.log2(p[where] / m[where])))


def same_context_steps(d3: Trace, full: Trace) -> list[int]:
    """Steps whose attention rows D3 and full depth computed over the same text: step t reads tokens 0..t-1, so every
    step up to and including the first divergence (all compared steps when the texts never differ). Step 0 is the
    prompt's, whose rows are not kept per token."""
    compared = min(len(d3.steps), len(full.steps))
    first = token_agreement(d3.token_ids, full.token_ids).first_divergence
    last = compared - 1 if first is None else min(first, compared - 1)
    return list(range(1, last + 1))


def divergence_grid(d3: Trace, full: Trace, layers: int | None = None,
                    heads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(mean JS divergence [layers, heads], tokens averaged per layer [layers]) over `same_context_steps`, for each
    token where D3 ran the layer and both runs recorded its attention; NaN for a layer with no such token."""
    layers = layers if layers is not None else max(d3.num_layers, full.num_layers)
    heads = heads if heads is not None else num_heads(d3, full)
    total = np.zeros((layers, heads))
    counted = np.zeros(layers, dtype=int)
    for t in same_context_steps(d3, full):
        mine, theirs = d3.steps[t].attention, full.steps[t].attention
        for layer in sorted(set(mine) & set(theirs)):
            if layer >= layers:
                continue
            a, b = np.asarray(mine[layer]), np.asarray(theirs[layer])
            keys = min(a.shape[-1], b.shape[-1])
            total[layer] += [js_divergence(a[h, :keys], b[h, :keys]) for h in range(heads)]
            counted[layer] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        grid = np.where(counted[:, None] > 0, total / np.maximum(counted, 1)[:, None], np.nan)
    return grid, counted


def divergence_overview(d3: Trace, full: Trace, *, presentation: bool = False, height: int | None = None) -> go.Figure:
    """Where D3 changes attention: one cell per layer (across) and head (down), coloured by the mean Jensen-Shannon
    divergence (bits) between D3's and full depth's attention rows over the tokens both runs read alike
    (`divergence_grid`); grey where D3 skipped the layer on every such token or nothing was recorded. Each cell's
    customdata is [layer, head], for a click that opens that head's detail."""
    if d3.prompt != full.prompt:
        raise ValueError("the D3 run and the full-depth run must answer the same prompt to compare their attention")
    grid, counted = divergence_grid(d3, full)
    steps = same_context_steps(d3, full)
    if not grid.size or not steps or not counted.any():
        return empty_figure("No attention was recorded for tokens both runs read alike. Press Generate to record "
                            "every layer's attention.", presentation=presentation,
                            height=height or DIVERGENCE_HEIGHT[presentation])
    layers, heads = grid.shape
    z = grid.T  # [heads, layers]: layers across, heads down
    cells = np.dstack(np.meshgrid(np.arange(layers), np.arange(heads))).tolist()  # [heads][layers] = [layer, head]
    top = max(float(np.nanmax(grid)), 1e-3)
    small = dict(size=font_size(presentation, delta=-3))
    data = [go.Heatmap(z=z, x=list(range(layers)), y=list(range(heads)), customdata=cells, coloraxis="coloraxis",
                       xgap=1, ygap=1, hoverongaps=False, name="js", meta={"role": "attention-divergence"},
                       hovertemplate="layer %{x} · head %{y} · JS %{z:.4f} bits<br>click: this head in detail"
                                     "<extra></extra>")]
    skipped = np.where(np.isnan(z), 1.0, np.nan)
    if np.isfinite(skipped).any():
        data.append(go.Heatmap(z=skipped, x=list(range(layers)), y=list(range(heads)), customdata=cells, xgap=1, ygap=1,
                               colorscale=[[0, SKIPPED_FILL], [1, SKIPPED_FILL]], zmin=0, zmax=1, showscale=False,
                               hoverongaps=False, name="skipped", meta={"role": "skipped-cells"},
                               hovertemplate="layer %{x} · head %{y}: D3 skipped this layer on every token compared"
                                             "<extra></extra>"))
    span = f"token {steps[0]}" if len(steps) == 1 else f"tokens {steps[0]}–{steps[-1]}"
    layout = dict(xaxis=dict(title=dict(text="layer"), showgrid=False, dtick=5 if layers > 12 else 1, tickfont=small,
                             constrain="domain"),
                  yaxis=dict(title=dict(text="head"), showgrid=False, autorange="reversed", dtick=1 if heads <= 16 else 4,
                             tickfont=small),
                  # The colour bar lies under the plot, across, so the cells get the figure's whole width (on a
                  # phone a bar at the side left 6 px per layer).
                  coloraxis=dict(colorscale=SEQUENTIAL, cmin=0, cmax=top,
                                 colorbar=dict(orientation="h", thickness=12, len=0.75, lenmode="fraction", x=0,
                                               xanchor="left", yref="container", y=0, yanchor="bottom",
                                               title=dict(text="JS bits", side="right"), tickfont=small,
                                               tickangle=0, nticks=4)))
    # Short lines (fit_title wraps at 40): the head never wraps, the notes take two lines on a phone too.
    title = fit_title("Where D3 changes attention", f"JS divergence, mean of {span}",
                      ("grey: skipped · click: that head", SKIPPED_TEXT))
    # No panel titles under the title: their room (viz.layout.PANEL_TITLES) goes to the plot; the bottom margin
    # holds the layer axis and, under it, the colour bar.
    layout["margin"] = dict(t=title_margin(title, presentation) - PANEL_TITLES, r=20,
                            b=round(5.5 * font_size(presentation)))
    return make_figure(data, layout, title=title, presentation=presentation, legend=False,
                       height=height or DIVERGENCE_HEIGHT[presentation])
