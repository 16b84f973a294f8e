"""The logit lens: per generated token and layer, how likely the model already found the token it picked,
with the layers that did not run greyed and hatched, and the prediction depth drawn over it."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from d3.trace import SKIPPED, Trace, prediction_depth, token_agreement
from viz.grid import cell_hover
from viz.layout import (
    CELL_COLORS,
    core_shapes,
    drawn_core,
    fit_title,
    fmt,
    guide_line,
    layer_kinds,
    make_figure,
    plot_text,
    quoted,
    shown_text,
    strategy_label,
    tick_subset,
)

LENS_SCALE = "Viridis"  # apart from the blue/orange/green cell colours and the grey skip mask
DEPTH_COLOR = "#000000"  # Okabe-Ito black: the prediction-depth line over any cell colour
DIVERGENCE_COLOR = "#D55E00"  # the first-divergence colour of the token panes
SELECT_COLOR = "#CC79A7"
HATCH_COLOR = "#9CA3AF"


def has_lens(trace: Trace | None) -> bool:
    """True if every step of `trace` carries the lens's per-layer probabilities of its token."""
    return trace is not None and bool(trace.steps) and all(len(s.lens_prob) == trace.num_layers for s in trace.steps)


def lens_arrays(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """(prob float [T, L], rank int [T, L]): the lens's probability and rank of each picked token after each
    layer; NaN and -1 where the layer did not run."""
    if not has_lens(trace):
        raise ValueError("this trace has no logit lens: generate it with TraceConfig(logit_lens=True)")
    prob = np.array([s.lens_prob for s in trace.steps], dtype=np.float64)
    rank = np.array([s.lens_rank for s in trace.steps], dtype=np.int64)
    return prob, rank


def _hover(trace: Trace, prob: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Hover text [L, T] (transposed like z): the lens reading where a layer ran, the cell's fate where not."""
    num_layers = trace.num_layers
    kinds = layer_kinds(num_layers, drawn_core(trace))
    rows = [f"token {quoted(shown_text(s))} (step {s.step})" for s in trace.steps]
    text = cell_hover(trace.grid(), rows, kinds, sources=trace.fill_sources())  # [T, L], names each copy's recorded source
    for t, s in enumerate(trace.steps):
        for layer in range(num_layers):
            if rank[t, layer] >= 0:
                text[t, layer] = (f"{rows[t]} · layer {layer} ({kinds[layer]}) · lens top-1 "
                                  f"{quoted(s.logit_lens[layer]) if s.logit_lens else '?'} · "
                                  f"p({quoted(shown_text(s))}) = {fmt(prob[t, layer])} · rank {rank[t, layer] + 1}")
    return text.T


def _skip_mask(steps: np.ndarray, skipped: np.ndarray, hover: np.ndarray) -> list[go.BaseTraceType]:
    """A flat grey heatmap over the cells of layers that did not run (skipped [T, L]), and a diagonal hatch
    marker on each, so the mask reads without colour too."""
    z = np.where(skipped.T, 1.0, np.nan)  # [L, T]
    grey = CELL_COLORS[SKIPPED]
    mask = go.Heatmap(z=z, x=steps, y=np.arange(skipped.shape[1]), colorscale=[[0, grey], [1, grey]], showscale=False,
                      text=hover, hovertemplate="%{text}<extra></extra>", xgap=1, ygap=1, name="did not run",
                      meta={"role": "skip-mask"})
    t_idx, l_idx = np.nonzero(skipped)
    hatch = go.Scatter(x=steps[t_idx], y=l_idx, mode="markers", name="layer did not run (hatched)",
                       marker=dict(symbol="line-ne", size=9, line=dict(width=1.2, color=HATCH_COLOR), color=HATCH_COLOR),
                       hoverinfo="skip", meta={"role": "hatch"})
    return [mask, hatch]


def _depth_line(steps: np.ndarray, depth: np.ndarray, texts: list[str]) -> go.Scatter:
    hover = [f"token {quoted(x)}: the lens's top-1 is this token from layer {fmt(d, 3)} on" if np.isfinite(d)
             else f"token {quoted(x)}: not the lens's top-1 even at the last layer that ran" for x, d in zip(texts, depth)]
    return go.Scatter(x=steps, y=depth, mode="lines+markers", name="prediction depth", text=hover,
                      hovertemplate="%{text}<extra></extra>", line=dict(color=DEPTH_COLOR, width=2.5, shape="hvh"),
                      marker=dict(color=DEPTH_COLOR, size=6, symbol="diamond"), connectgaps=False,
                      meta={"role": "prediction-depth"})


def _marks(trace: Trace, reference: Trace | None, selected: int | None) -> tuple[list[dict], list[dict]]:
    """Shapes and notes: the first divergence from `reference` and the selected token's column."""
    shapes, notes = [], []
    first = token_agreement(trace.token_ids, reference.token_ids).first_divergence if reference is not None else None
    if first is not None and first < len(trace.steps):
        edge = trace.steps[first].step - 0.5  # just before the token, like the badge in the token panes
        shapes.append(guide_line(x=edge, color=DIVERGENCE_COLOR, dash="dash", width=2))
        # Inside the plot, over the bottom (core) rows: above it the note would run into the title's second line,
        # and on the side of the line with more room, so that a divergence at the first tokens is not cut off.
        left = first < len(trace.steps) / 2
        notes.append(dict(x=edge, y=0, xref="x", yref="y domain", xanchor="left" if left else "right",
                          yanchor="bottom", showarrow=False, bgcolor="rgba(255,255,255,0.85)",
                          text="◂ first divergence" if left else "first divergence ▸", font=dict(color=DIVERGENCE_COLOR)))
    if selected is not None and 0 <= selected < len(trace.steps):
        x = trace.steps[selected].step
        shapes.append(dict(type="rect", xref="x", yref="y domain", x0=x - 0.5, x1=x + 0.5, y0=0, y1=1,
                           line=dict(color=SELECT_COLOR, width=3), name="selected"))
    return shapes, notes


def logit_lens_heatmap(trace: Trace, *, reference: Trace | None = None, selected: int | None = None,
                       max_tokens: int | None = None, title: str | None = None, presentation: bool = False,
                       height: int | None = None) -> go.Figure:
    """Generated tokens along x, layers up y: colour = the lens's probability of the token finally picked
    (`lens_arrays`, [T, L] drawn transposed), grey hatched cells for layers that did not run, the prediction
    depth [T] as a line, the first divergence from `reference` and the `selected` token's column marked."""
    trace = trace.with_steps(trace.steps[:max_tokens])
    prob, rank = lens_arrays(trace)
    num_layers = trace.num_layers
    steps = np.array([s.step for s in trace.steps])
    texts = [shown_text(s) for s in trace.steps]
    hover = _hover(trace, prob, rank)
    depth = prediction_depth(rank)
    heat = go.Heatmap(z=prob.T, x=steps, y=np.arange(num_layers), zmin=0, zmax=1, colorscale=LENS_SCALE, text=hover,
                      hovertemplate="%{text}<extra></extra>", xgap=1, ygap=1, name="lens",
                      colorbar=dict(title=dict(text="p(token)"), len=0.85, thickness=16),
                      meta={"role": "lens", "token_axis": "x"})
    data = [heat, *_skip_mask(steps, rank < 0, hover), _depth_line(steps, depth, texts)]
    shapes, notes = _marks(trace, reference, selected)
    picks = tick_subset(len(steps), 40)
    layout = dict(
        xaxis=dict(title=dict(text="generated token"), tickmode="array", tickvals=steps[picks].tolist(),
                   ticktext=[plot_text(texts[i]) for i in picks], tickangle=-60, showgrid=False,
                   range=[steps[0] - 0.5, steps[-1] + 0.5] if steps.size else None),
        yaxis=dict(title=dict(text="layer"), range=[-0.5, num_layers - 0.5], showgrid=False,
                   tickvals=tick_subset(num_layers, 16).tolist()),
        shapes=core_shapes(num_layers, drawn_core(trace), axis="y") + shapes, annotations=notes,
        hovermode="closest",
    )
    settled = depth[np.isfinite(depth)]
    if title is None:
        mean = f"mean prediction depth {settled.mean():.1f}" if settled.size else "no settled prediction"
        title = fit_title("Logit lens", strategy_label(trace.strategy), f"{mean} of {num_layers} layers",
                          f"{trace.mean_layers:.1f} layers ran per token")
    rows_height = height or int(np.clip(18 * num_layers + 230, 420, 900))
    return make_figure(data, layout, title=title, presentation=presentation, height=rows_height)
