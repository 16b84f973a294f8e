"""Error against full depth (Fig. 2): local vs compounding KL, filled-KV error, and fill strategies side by side."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from d3.trace import CELL_NAMES, HOLE, RAN, Comparison, run_counts
from viz.layout import (
    EXTRA_COLORS,
    FILL_COLORS,
    apply_layout,
    core_shapes,
    drawn_core,
    fit_title,
    fmt,
    guide_line,
    layer_kinds,
    quoted,
    short_label,
    shown_text,
)

KL_COLORS = {"teacher": "#0072B2", "free": "#D55E00"}
KL_NAMES = {"teacher": "KL teacher-forced (local error)", "free": "KL free-running (compounding error)"}
KV_FLOOR = 1e-6  # relative KV errors below this are drawn at the floor of the log scale


def _token_at(comparison: Comparison, position: int, run: str) -> str:
    steps = (comparison.full if run == "full" else comparison.skip).steps
    return quoted(shown_text(steps[position])) if position < len(steps) else "(none)"


def _kl_line(comparison: Comparison, which: str, *, name: str, color: str, dash: str = "solid",
             legendgroup: str | None = None, showlegend: bool = True) -> go.Scatter:
    """KL per position ([T] teacher-forced or [T'] free-running) with the tokens in the hover."""
    values = np.asarray(comparison.kl_teacher if which == "teacher" else comparison.kl_free, dtype=np.float64)
    run = "full" if which == "teacher" else "skip"  # teacher forcing feeds the full-depth tokens
    what = "local error: skip fed full-depth tokens" if which == "teacher" else "compounding error: skip on its own tokens"
    hover = [f"position {t} · token {_token_at(comparison, t, run)} · KL(full ‖ skip) = {fmt(v)} nats · {what}"
             for t, v in enumerate(values)]
    return go.Scatter(x=np.arange(len(values)), y=values, mode="lines", name=name, text=hover,
                      hovertemplate="%{text}<extra></extra>", line=dict(color=color, dash=dash, width=2.5),
                      legendgroup=legendgroup, showlegend=showlegend, meta={"role": f"kl_{which}", "name": name})


# One subtitle line each (SUBTITLE_CHARS): the title of four wrapped lines took the left half of the figure (issue 44,
# U5); why the fill then changes nothing is in the view's explanation.
NEVER_READ = "nested: no filled entry is ever read"
NONE_READ_HERE = "no filled entry is read in this run"
HOLE_NAME = "hole (masked)"  # fill none writes no entry: as the layer stack names it (viz/stack.py)


def is_nested(layers_run: list[tuple[int, ...]]) -> bool:
    """Whether each token's layers are a subset of the previous token's (then no skipped layer runs again)."""
    return all(set(later) <= set(earlier) for earlier, later in zip(layers_run, layers_run[1:]))


def read_later(grid: np.ndarray) -> np.ndarray:
    """bool [T, L] from cell codes [T, L]: True where a later position ran that layer, so its attention there reads
    the entry written at this position (a filled entry that is never read cannot change any output)."""
    grid = np.asarray(grid)
    if grid.size == 0:
        return np.zeros(grid.shape, dtype=bool)
    ran_after = np.flip(np.cumsum(np.flip(grid == RAN, axis=0), axis=0), axis=0)  # [T, L] ran at t or later
    out = np.zeros(grid.shape, dtype=bool)
    out[:-1] = ran_after[1:] > 0
    return out


def filled_read(comparison: Comparison) -> tuple[np.ndarray, np.ndarray]:
    """(filled and read by a later token, filled and never read), each bool [T, L] (teacher-forced run)."""
    filled = np.asarray(comparison.filled_mask, dtype=bool)
    grid = comparison.teacher_grid
    read = read_later(grid) if grid.shape == filled.shape else np.ones(filled.shape, dtype=bool)
    return filled & read, filled & ~read


def _kv_heatmap(comparison: Comparison) -> tuple[go.Heatmap, go.Scatter, go.Scatter]:
    """log10 of `kv_error` [T, L], drawn transposed (layers up, positions along the shared x), and
    open markers on the filled cells (`filled_mask` [T, L]): squares where a later token reads them, small grey
    dots where none ever does."""
    err = np.asarray(comparison.kv_error, dtype=np.float64)  # [T, L]
    read, unread = filled_read(comparison)
    filled = read | unread
    positions, num_layers = err.shape
    core = drawn_core(comparison.skip)
    kinds = layer_kinds(num_layers, core)
    grid = comparison.teacher_grid if comparison.teacher_grid.shape == err.shape else None
    with np.errstate(divide="ignore", invalid="ignore"):
        log_err = np.log10(np.clip(err, KV_FLOOR, None))
    hover = np.empty((num_layers, positions), dtype=object)  # transposed, like z
    for t in range(positions):
        token = _token_at(comparison, t, "full")
        for layer in range(num_layers):
            state = CELL_NAMES[int(grid[t, layer])] if grid is not None else ("filled" if filled[t, layer] else "")
            hover[layer, t] = (f"position {t} · token {token} · layer {layer} ({kinds[layer]}) · relative KV error "
                               f"{fmt(err[t, layer])}" + (f" · {state}" if state else ""))
    finite = log_err[np.isfinite(log_err)]
    lo, hi = (np.floor(finite.min()), np.ceil(finite.max())) if finite.size else (np.log10(KV_FLOOR), 0.0)
    ticks = np.arange(lo, max(hi, lo) + 1)
    heat = go.Heatmap(z=log_err.T, x=np.arange(positions), y=np.arange(num_layers), text=hover,
                      hovertemplate="%{text}<extra></extra>", colorscale="Magma", reversescale=True,
                      # the bar's title along its side: above it, it ran into the panel's title on a phone
                      colorbar=dict(title=dict(text="KV error", side="right"), tickvals=ticks, ticktext=[f"1e{int(k)}" for k in ticks],
                                    y=0.3, len=0.6), meta={"role": "kv_error"})
    # fill none writes no entry: a later token that runs the layer masks the hole out, it reads nothing from it
    holes = grid is not None and bool(filled.any()) and bool(np.all(grid[filled] == HOLE))
    t_idx, l_idx = np.nonzero(read)
    marks = go.Scatter(x=t_idx, y=l_idx, mode="markers",
                       name=f"{HOLE_NAME}, its layer runs later" if holes else "filled, read by later tokens",
                       marker=dict(symbol="square-open", size=7, color="#22D3EE", line=dict(width=1.5)),
                       hoverinfo="skip", meta={"role": "filled"})
    t_idx, l_idx = np.nonzero(unread)
    unread_marks = go.Scatter(x=t_idx, y=l_idx, mode="markers", name=HOLE_NAME if holes else "filled, never read",
                              marker=dict(symbol="circle", size=3, color="#9CA3AF"), hoverinfo="skip",
                              meta={"role": "filled-unread"})
    return heat, marks, unread_marks


def error_propagation(comparison: Comparison, *, log_kl: bool = False, title: str | None = None,
                      presentation: bool = False, height: int | None = None) -> go.Figure:
    """Top: KL teacher-forced [T] (local error) and free-running [T'] (compounding error) per position,
    first divergence marked. Bottom: relative error of the KV cache under teacher forcing, `kv_error`
    [T, L] on a log scale (z is transposed to [L, T] so positions share the x axis), filled entries
    (`filled_mask` [T, L]) outlined."""
    has_kv = comparison.kv_error.size > 0
    rows = 2 if has_kv else 1
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        row_heights=[0.4, 0.6] if has_kv else None,
                        # Short: centred over a plot about 150 px wide on a phone (the legend names the marks).
                        subplot_titles=["next-token KL vs full depth"] + (["KV cache error, teacher-forced"]
                                                                          if has_kv else []))
    for which in ("teacher", "free"):
        fig.add_trace(_kl_line(comparison, which, name=KL_NAMES[which], color=KL_COLORS[which]), row=1, col=1)
    shapes = []
    first = comparison.first_divergence
    if first is not None:
        for row in range(1, rows + 1):
            xref, yref = ("x", "y") if row == 1 else ("x2", "y2")
            shapes.append(guide_line(x=first, xref=xref, yref=yref, color="#B91C1C", dash="dash", width=2))
        kl_free = np.asarray(comparison.kl_free, dtype=np.float64)
        y = kl_free[first] if first < len(kl_free) else np.nan
        text = (f"first divergence at position {first}: full depth {_token_at(comparison, first, 'full')}, "
                f"skip {_token_at(comparison, first, 'skip')}")
        fig.add_trace(go.Scatter(x=[first], y=[y], mode="markers", name="first divergence", text=[text],
                                 hovertemplate="%{text}<extra></extra>", meta={"role": "divergence"},
                                 marker=dict(symbol="x", size=14, color="#B91C1C", line=dict(width=2))), row=1, col=1)
        # Inside the plot, under its top edge: above it, it ran into the panel's title on a phone. Towards the
        # line's far end the label hangs to the left of the line, so it stays inside the plot.
        late = first > 0.5 * max(len(comparison.kl_free), len(comparison.kl_teacher), 1)
        fig.add_annotation(x=first, y=1, xref="x", yref="y domain", xanchor="right" if late else "left", yanchor="top",
                           showarrow=False, name="first-divergence",
                           text=f"first divergence: {first} " if late else f" first divergence: {first}",
                           font=dict(color="#B91C1C"),
                           bgcolor="rgba(255,255,255,0.85)")
    if has_kv:
        heat, marks, unread = _kv_heatmap(comparison)
        for trace in (heat, marks, unread):
            fig.add_trace(trace, row=2, col=1)
        shapes += core_shapes(comparison.kv_error.shape[1], drawn_core(comparison.skip), axis="y", xref="x2", yref="y2")
        fig.update_yaxes(title_text="layer", row=2, col=1)
        fig.update_xaxes(title_text="position (generated token)", row=2, col=1)
    else:
        fig.update_xaxes(title_text="position (generated token)", row=1, col=1)
    fig.update_layout(shapes=shapes)
    fig.update_yaxes(title_text="KL (nats)", type="log" if log_kl else "linear", row=1, col=1)
    if title is None:  # the note under the title, not over the heatmap: on a phone the heatmap is 150 px wide
        read, never = filled_read(comparison) if has_kv else (None, None)
        counts = run_counts(comparison.skip, comparison.full)  # the one count of the run (d3.trace.run_counts)
        notes = [f"{short_label(comparison.skip.strategy)} · {counts['agreeing']} of {counts['compared']} tokens agree"]
        if has_kv and never.any() and not read.any():
            # said of the order only where the order is nested: a strided run whose budget did not move yet is not
            nested = comparison.skip.strategy.get("drop_order") != "strided" and \
                is_nested([s.layers_run for s in comparison.skip.steps])
            notes.append(NEVER_READ if nested else NONE_READ_HERE)
        title = fit_title("Error against full depth", *notes)
    return apply_layout(fig, title=title, presentation=presentation, height=height or (640 if has_kv else 400))


def _fill_colors(comparisons: dict[str, Comparison]) -> list[str]:
    """The fill's own colour for the first run of each fill (copy / propagate / none), extras after."""
    seen: set[str] = set()
    extra = iter(EXTRA_COLORS * (1 + len(comparisons) // len(EXTRA_COLORS)))
    out = []
    for comp in comparisons.values():
        fill = str(comp.skip.strategy.get("fill", ""))
        out.append(FILL_COLORS[fill] if fill in FILL_COLORS and fill not in seen else next(extra))
        seen.add(fill)
    return out


def fill_strategies(comparisons: dict[str, Comparison], *, title: str | None = None, presentation: bool = False,
                    height: int | None = None) -> go.Figure:
    """The same prompt under several fill strategies (copy / propagate / none): KL teacher-forced [T]
    and free-running [T'] per position, then mean KL and greedy agreement per strategy as bars."""
    # Room between the rows for the top row's axis titles and the bottom row's panel titles, at either font size.
    fig = make_subplots(rows=2, cols=2, vertical_spacing=0.34 if presentation else 0.26, horizontal_spacing=0.1,
                        # Short: four panels, each about 110 px wide on a phone (the legend and the hover say more)
                        subplot_titles=["KL, teacher-forced", "KL, free-running", "mean KL (nats)", "agreement"])
    for (key, comp), color in zip(comparisons.items(), _fill_colors(comparisons)):
        fig.add_trace(_kl_line(comp, "teacher", name=key, color=color, legendgroup=key), row=1, col=1)
        fig.add_trace(_kl_line(comp, "free", name=key, color=color, legendgroup=key, showlegend=False), row=1, col=2)
        summary = comp.summary()
        means = [summary["kl_teacher_mean"], summary["kl_free_mean"]]
        fig.add_trace(go.Bar(x=["teacher-forced", "free-running"], y=means, name=key, marker_color=color,
                             legendgroup=key, showlegend=False, meta={"role": "kl_mean", "name": key},
                             hovertemplate=f"{key}: mean KL %{{x}} = %{{y:.3g}} nats<extra></extra>"), row=2, col=1)
        first = summary["first_divergence"]
        diverge = "never diverges" if first is None else f"first divergence at position {first}"
        fig.add_trace(go.Bar(x=[key], y=[comp.agreement], name=key, marker_color=color, legendgroup=key,
                             showlegend=False, meta={"role": "agreement", "name": key},
                             hovertemplate=f"{key}: %{{y:.1%}} of tokens agree with full depth · {diverge}"
                                           "<extra></extra>"), row=2, col=2)
    fig.update_xaxes(title_text="position", row=1, col=1)
    fig.update_xaxes(title_text="position", row=1, col=2)
    fig.update_yaxes(title_text="KL (nats)", row=1, col=1)
    fig.update_yaxes(tickformat=".0%", range=[0, 1.05], row=2, col=2)
    fig.update_layout(barmode="group", legend=dict(title=dict(text="fill: ")))
    if title is None:
        notes = ["copy vs propagate vs none, against full depth"]
        if comparisons and not any(filled_read(c)[0].any() for c in comparisons.values()):
            notes.append("The lines coincide: no later token reads a filled entry (a nested drop order), so every fill "
                         "gives the same tokens")
        title = fit_title("Filling skipped layers' KV", *notes)
    return apply_layout(fig, title=title, presentation=presentation, height=height or 640)
