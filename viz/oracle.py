"""What each token needs: oracle depths over D3's decay curve, one answer or many (numbers in, figures out)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from d3.config import D3Config
from d3.schedule import budgets
from viz.layout import CORE_LINE, STRATEGY_COLORS, guide_line, make_figure, quoted, strategy_label

# Okabe-Ito: needs met / not met, and the fitted curves, stay apart for colour-blind viewers.
SERVED_COLOR = "#009E73"
UNDERSERVED_COLOR = "#D55E00"
FIT_COLORS: dict[str, str] = {"least_squares": "#E69F00", "coverage": "#CC79A7"}
FIT_NAMES: dict[str, str] = {"least_squares": "least-squares fit", "coverage": "coverage fit"}
LENS_COLOR = "#56B4E9"
BAND_FILL = "rgba(0, 158, 115, 0.18)"


def _schedule_line(cfg: D3Config, num_layers: int, steps: int, *, name: str, color: str, dash: str = "solid",
                   role: str = "schedule") -> go.Scatter:
    """D3's planned layers [steps] for `cfg` as a step-wise line."""
    y = np.asarray(budgets(cfg, num_layers, steps), dtype=np.int64)
    return go.Scatter(x=np.arange(steps), y=y, mode="lines", name=name, line=dict(color=color, dash=dash, width=2.5,
                      shape="hv"), hovertemplate="token %{x}: " + name + " runs %{y} layers<extra></extra>",
                      meta={"role": role, "alpha": cfg.alpha, "start": cfg.start})


def _axes(num_layers: int, steps: int, floor: int) -> dict:
    shapes = [guide_line(y=floor, color=CORE_LINE, dash="dot")] if floor > 0 else []
    return dict(shapes=shapes, hovermode="closest",
                xaxis=dict(title=dict(text="generated token (position i)"), range=[-0.5, max(steps, 1) - 0.5]),
                yaxis=dict(title=dict(text="decoder layers"), range=[0, num_layers + 1]))


def _need_dots(x: np.ndarray, need: np.ndarray, hover: list[str], *, under: bool) -> go.Scatter:
    name = "needs more than D3 gives (under-served)" if under else "need met by D3"
    marker = dict(color=UNDERSERVED_COLOR, size=10, symbol="x") if under else dict(color=SERVED_COLOR, size=8)
    return go.Scatter(x=x, y=need, mode="markers", name=name, marker=marker, text=hover,
                      hovertemplate="%{text}<extra></extra>", meta={"role": "underserved" if under else "served"})


def token_needs(oracle_depth: Sequence[int], num_layers: int, cfg: D3Config, *, texts: Sequence[str] | None = None,
                fitted: D3Config | None = None, prediction_depth: Sequence[int] | None = None,
                title: str | None = None, presentation: bool = False, height: int | None = None) -> go.Figure:
    """One answer: each token's oracle depth [T] as a dot over D3's budget under `cfg` [T], under-served tokens
    (need above the budget) marked; the `fitted` schedule dashed; the logit lens's prediction depth [T] hollow."""
    cfg.check_layers(num_layers)
    need = np.asarray(oracle_depth, dtype=np.int64)
    steps = len(need)
    budget = np.asarray(budgets(cfg, num_layers, steps), dtype=np.int64)
    under = need > budget
    texts = list(texts) if texts is not None else [""] * steps
    hover = [f"token {i} {quoted(t)}: needs {n} of {num_layers} layers, D3 gives {b}" for i, (t, n, b)
             in enumerate(zip(texts, need, budget))]
    x = np.arange(steps)
    data = [_schedule_line(cfg, num_layers, steps, name=strategy_label(cfg), color=STRATEGY_COLORS["d3"])]
    if fitted is not None:
        data.append(_schedule_line(fitted, num_layers, steps, name=f"fitted: α={fitted.alpha:g}, start {fitted.start}",
                                   color=FIT_COLORS["least_squares"], dash="dash", role="fitted"))
    if prediction_depth is not None:
        data.append(go.Scatter(x=x, y=np.asarray(prediction_depth), mode="markers", name="logit-lens prediction depth",
                               marker=dict(color=LENS_COLOR, size=8, symbol="circle-open"), meta={"role": "lens"},
                               hovertemplate="token %{x}: the lens settles after %{y} layers<extra></extra>"))
    data.append(_need_dots(x[~under], need[~under], [h for h, u in zip(hover, under) if not u], under=False))
    data.append(_need_dots(x[under], need[under], [h for h, u in zip(hover, under) if u], under=True))
    layout = _axes(num_layers, steps, sum(cfg.core(num_layers)))
    if title is None:
        title = f"What each token needs · {int(under.sum())} of {steps} tokens under-served by D3 α={cfg.alpha:g}"
    return make_figure(data, layout, title=title, presentation=presentation, height=height or 460)


def need_bands(needs: Sequence[Sequence[int]]) -> dict[str, np.ndarray]:
    """Per position (over prompts that reach it): mean, 25th and 75th percentile of need, and the count; each [T]."""
    steps = max((len(r) for r in needs), default=0)
    grid = np.full((len(needs), steps), np.nan)
    for row, values in zip(grid, needs):
        row[: len(values)] = values
    count = np.isfinite(grid).sum(0)
    # Every position has at least one prompt (steps is the longest answer), so no column is all-NaN.
    return {"mean": np.nanmean(grid, 0), "q25": np.nanpercentile(grid, 25, axis=0),
            "q75": np.nanpercentile(grid, 75, axis=0), "count": count}


def needs_summary(needs: Sequence[Sequence[int]], num_layers: int, cfg: D3Config, *,
                  fits: Mapping[str, D3Config] | None = None, model: str = "", title: str | None = None,
                  presentation: bool = False, height: int | None = None) -> go.Figure:
    """Across prompts: mean need by position [T] with its interquartile band, D3's schedule under `cfg`, and the
    fitted schedules (`fits`: "least_squares" / "coverage" -> config)."""
    cfg.check_layers(num_layers)
    bands = need_bands(needs)
    steps = len(bands["mean"])
    x = np.arange(steps)
    data = [
        go.Scatter(x=np.concatenate([x, x[::-1]]), y=np.concatenate([bands["q75"], bands["q25"][::-1]]), fill="toself",
                   fillcolor=BAND_FILL, line=dict(width=0), name="need: 25th-75th percentile", hoverinfo="skip",
                   meta={"role": "band"}),
        go.Scatter(x=x, y=bands["mean"], mode="lines+markers", name="mean need", customdata=bands["count"],
                   line=dict(color=SERVED_COLOR, width=2), marker=dict(size=5), meta={"role": "mean"},
                   hovertemplate="token %{x}: mean need %{y:.1f} layers over %{customdata} answers<extra></extra>"),
        _schedule_line(cfg, num_layers, steps, name=strategy_label(cfg), color=STRATEGY_COLORS["d3"]),
    ]
    for key, fit in (fits or {}).items():
        data.append(_schedule_line(fit, num_layers, steps, name=f"{FIT_NAMES.get(key, key)}: α={fit.alpha:g}, "
                                   f"start {fit.start}", color=FIT_COLORS.get(key, "#444444"), dash="dash",
                                   role=f"fit:{key}"))
    layout = _axes(num_layers, steps, sum(cfg.core(num_layers)))
    if title is None:
        title = f"Depth each token needs{' · ' + model if model else ''} · {len(needs)} answers, L = {num_layers}"
    return make_figure(data, layout, title=title, presentation=presentation, height=height or 480)
