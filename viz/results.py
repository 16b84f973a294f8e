"""Benchmark results: quality vs measured speedup with its Pareto front, and per-task accuracy deltas (Fig. 5)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from viz.layout import empty_figure, fmt, guide_line, make_figure, series_colors

# metric -> (axis title, higher is better, value of a perfect run when no full-depth row is given)
QUALITY_METRICS: dict[str, tuple[str, bool, float | None]] = {
    "agreement": ("greedy token agreement with full depth", True, 1.0),
    "accuracy": ("task accuracy", True, None),
    "kl_teacher": ("KL teacher-forced, nats (lower = better)", False, 0.0),
    "kl_free": ("KL free-running, nats (lower = better)", False, 0.0),
    "ppl_ratio": ("perplexity / full-depth perplexity (lower = better)", False, 1.0),
}
HOVER_COLUMNS = ("measured_speedup", "theoretical_speedup", "agreement", "accuracy", "kl_teacher", "kl_free",
                 "ppl_ratio", "mean_layers")


def pareto_front(points: np.ndarray | Sequence[Sequence[float]], *, maximize: tuple[bool, bool] = (True, True)) -> np.ndarray:
    """Indices of the non-dominated rows of `points` [n, 2], ordered by the first coordinate.

    A point is dominated when another is at least as good on both coordinates and better on one
    (`maximize` gives each coordinate's direction); exact duplicates do not dominate each other.
    Rows with a NaN are never on the front."""
    pts = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    signs = np.where(np.asarray(maximize, dtype=bool), 1.0, -1.0)
    q = pts * signs  # now both coordinates are "higher is better"
    valid = np.flatnonzero(np.isfinite(q).all(axis=1))
    x, y = q[valid, 0], q[valid, 1]
    order = np.lexsort((-y, -x))  # x descending, then y descending
    keep: list[int] = []
    best = -np.inf  # highest y among points with a strictly larger x
    i = 0
    while i < len(order):
        j = i
        while j < len(order) and x[order[j]] == x[order[i]]:
            j += 1
        group_max = y[order[i]]
        if group_max > best:  # the group's best is not beaten by any larger x; lower ones lose to it
            keep.extend(int(k) for k in order[i:j] if y[k] == group_max)
        best = max(best, group_max)
        i = j
    front = valid[keep]
    return front[np.argsort(pts[front, 0], kind="stable")]


def _quality_direction(y: str, higher_is_better: bool | None) -> bool:
    if higher_is_better is not None:
        return higher_is_better
    if y in QUALITY_METRICS:
        return QUALITY_METRICS[y][1]
    raise ValueError(f"higher_is_better must be given for y={y!r} (known metrics: {', '.join(QUALITY_METRICS)})")


def target_quality(df: pd.DataFrame, y: str, loss: float, higher: bool) -> float | None:
    """The quality bound of "at most `loss` quality lost", against the full-depth rows if `df` has them
    (for accuracy also its `accuracy_full` column), else a perfect run (agreement 1, ppl ratio 1, KL 0).
    Fractions (agreement, accuracy) lose `loss` points (0.01 = 1 point, as `d3.reports.sweep`), ratios lose
    `loss` relative, KL gains `loss` nats."""
    full = df[df["strategy"] == "full"][y].dropna() if "strategy" in df else pd.Series(dtype=float)
    if not len(full) and y == "accuracy" and "accuracy_full" in df:
        full = df["accuracy_full"].dropna()
    ref = float(full.mean()) if len(full) else QUALITY_METRICS.get(y, ("", True, None))[2]
    if ref is None:
        return None
    if y in ("agreement", "accuracy") or y.startswith("kl"):
        return ref - loss if higher else ref + loss
    return ref * (1 - loss) if higher else ref * (1 + loss)


def _point_hover(row: pd.Series, on_front: bool) -> str:
    parts = [str(row.get("label", row.get("strategy", "")))]
    for col in HOVER_COLUMNS:
        if col in row and pd.notna(row[col]):
            value = row[col]
            parts.append(f"{col.replace('_', ' ')} {value:.2f}×" if col.endswith("speedup") else f"{col.replace('_', ' ')} {fmt(value)}")
            low, high = row.get(f"{col}_low"), row.get(f"{col}_high")
            if low is not None and high is not None and pd.notna(low) and pd.notna(high):
                parts[-1] += f" [95%: {fmt(low)} to {fmt(high)}]"
    parts.append("on the Pareto front" if on_front else "dominated: another setting is at least as fast and at least as good")
    return " · ".join(parts)


def _error_bars(rows: pd.DataFrame, y: str) -> dict[str, Any] | None:
    """Plotly error bars from `y`_low / `y`_high (None where the table has no interval for `y`)."""
    low, high = f"{y}_low", f"{y}_high"
    if low not in rows or high not in rows or not (rows[low].notna() & rows[high].notna()).any():
        return None
    up = (pd.to_numeric(rows[high], errors="coerce") - rows[y]).clip(lower=0).fillna(0)
    down = (rows[y] - pd.to_numeric(rows[low], errors="coerce")).clip(lower=0).fillna(0)
    return dict(type="data", symmetric=False, array=up.tolist(), arrayminus=down.tolist(), thickness=1.5, width=4)


def pareto(df: pd.DataFrame, *, x: str = "measured_speedup", y: str = "agreement", higher_is_better: bool | None = None,
           target: tuple[float, float] | None = (1.5, 0.01), title: str | None = None, presentation: bool = False,
           height: int | None = None) -> go.Figure:
    """Quality (`y`) against speedup (`x`, higher is better), one colour per `strategy`, the Pareto front
    as a step line through exactly the non-dominated rows, and the paper's operating point, `target` =
    (speedup, quality loss) (about 1.5x at under 1% loss), as a region and a star. Where `y`_low and `y`_high
    are given (a paired 95% interval), each point carries them as error bars.

    df: one row per run with columns `strategy`, `label`, `x`, `y` (plus any of HOVER_COLUMNS, `y`_low, `y`_high)."""
    if df.empty or x not in df or y not in df:
        return empty_figure(f"No results with columns {x!r} and {y!r} yet: run a benchmark first.", title=title,
                            presentation=presentation, height=height)
    higher = _quality_direction(y, higher_is_better)
    df = df.reset_index(drop=True)
    front = pareto_front(df[[x, y]].to_numpy(dtype=np.float64), maximize=(True, higher))
    on_front = np.zeros(len(df), dtype=bool)
    on_front[front] = True
    data: list[go.Scatter] = []
    shapes = [guide_line(x=1.0, color="#9CA3AF", dash="dot")]  # no speedup
    groups = list(dict.fromkeys(df["strategy"])) if "strategy" in df else ["runs"]
    for group, color in zip(groups, series_colors([str(g) for g in groups])):
        rows = df[df["strategy"] == group] if "strategy" in df else df
        data.append(go.Scatter(
            x=rows[x], y=rows[y], mode="markers", name=str(group),
            text=[_point_hover(r, on_front[i]) for i, r in rows.iterrows()], hovertemplate="%{text}<extra></extra>",
            customdata=rows.index.tolist(),  # the row of `df` each point is: a click on it can load that setting
            marker=dict(color=color, size=[14 if on_front[i] else 10 for i in rows.index],
                        line=dict(color="#111827", width=[2 if on_front[i] else 0 for i in rows.index])),
            error_y=_error_bars(rows, y), meta={"role": "points", "name": str(group)}))
    data.append(go.Scatter(x=df.loc[front, x], y=df.loc[front, y], mode="lines", name="Pareto front",
                           line=dict(color="#111827", width=2, shape="vh"), hoverinfo="skip",
                           meta={"role": "front", "index": front.tolist()}))
    if target is not None:
        marker, region = _target(df, x, y, target, higher)
        data += marker
        shapes += region
    layout = dict(shapes=shapes, hovermode="closest", xaxis=dict(title=dict(text=f"{x.replace('_', ' ')} (×, higher = faster)")),
                  yaxis=dict(title=dict(text=QUALITY_METRICS.get(y, (y,))[0])))
    title = title if title is not None else f"Quality vs {x.replace('_', ' ')}"
    return make_figure(data, layout, title=title, presentation=presentation, height=height or 520)


def _target(df: pd.DataFrame, x: str, y: str, target: tuple[float, float], higher: bool) -> tuple[list, list[dict]]:
    """The paper's operating point, `target` = (speedup, quality loss): a star and a translucent region of
    the settings that beat it (or only a line at that speedup when no quality reference is known)."""
    speed, loss = target
    bound = target_quality(df, y, loss, higher)
    if bound is None:
        return [], [guide_line(x=speed, color="#15803D", dash="dash")]
    x_hi = max(float(np.nanmax(df[x].to_numpy(dtype=np.float64), initial=speed)), speed) * 1.15
    y_values = df[y].to_numpy(dtype=np.float64)
    if higher:
        y0, y1 = bound, max(float(np.nanmax(y_values, initial=bound)), bound) * 1.02 + 1e-9
    else:
        y0, y1 = min(float(np.nanmin(y_values, initial=bound)), 0.0), bound
    region = dict(type="rect", xref="x", yref="y", x0=speed, x1=x_hi, y0=y0, y1=y1, layer="below",
                  fillcolor="rgba(21, 128, 61, 0.10)", line=dict(color="#15803D", width=1, dash="dash"))
    loss_text = f"{loss:g} nats" if y.startswith("kl") else f"{loss:.0%}"
    star = go.Scatter(x=[speed], y=[bound], mode="markers", name=f"paper: ~{speed:g}× at < {loss_text} loss",
                      marker=dict(symbol="star", size=18, color="#15803D"), meta={"role": "target"},
                      hovertemplate=(f"the paper's operating point: about {speed:g}× faster with under {loss_text} "
                                     f"quality loss; settings in the shaded region beat it<extra></extra>"))
    return [star], [region]


def task_accuracy_delta(df: pd.DataFrame, *, reference: str = "full", title: str | None = None,
                        presentation: bool = False, height: int | None = None) -> go.Figure:
    """Per-task accuracy minus full depth, in points (paper Fig. 5): grouped bars, x = task, one series
    per setting (`label` if present, else `strategy`).

    df: columns `task`, `strategy`, `accuracy` (fraction or percent), optional `label`, `chance`; the
    reference is the `reference` rows, else an `accuracy_full` column (as `d3.reports.sweep.task_frame` gives)."""
    need = {"task", "strategy", "accuracy"}
    if df.empty or not need <= set(df.columns):
        return empty_figure(f"Need columns {', '.join(sorted(need))} to compare accuracy per task.", title=title,
                            presentation=presentation, height=height)
    scale = 1.0 if df["accuracy"].max() > 1.0 else 100.0  # show percentage points either way
    by = "label" if "label" in df else "strategy"
    ref = df[df["strategy"] == reference].groupby("task")["accuracy"].mean() * scale
    if ref.empty and "accuracy_full" in df:  # `d3.reports.sweep.task_frame` carries the reference on every row
        ref = df.groupby("task")["accuracy_full"].mean() * scale
    if ref.empty:
        return empty_figure(f"No {reference!r} rows to compare against.", title=title, presentation=presentation,
                            height=height)
    chance = df.groupby("task")["chance"].first() * scale if "chance" in df else pd.Series(dtype=float)
    runs = df[df["strategy"] != reference]
    groups = list(dict.fromkeys(runs[by]))
    kinds = [str(runs.loc[runs[by] == g, "strategy"].iloc[0]) for g in groups]
    bars: list[go.Bar] = []
    for group, color in zip(groups, series_colors(kinds)):
        rows = runs[runs[by] == group].groupby("task")["accuracy"].mean() * scale
        rows = rows[rows.index.isin(ref.index)]
        delta = rows - ref[rows.index]
        hover = [_delta_hover(task, str(group), rows[task], ref[task], chance.get(task)) for task in rows.index]
        bars.append(go.Bar(x=list(rows.index), y=delta.to_numpy(), name=str(group), marker_color=color, text=hover,
                           hovertemplate="%{text}<extra></extra>", textposition="none",
                           meta={"role": "delta", "name": str(group)}))
    layout = dict(barmode="group", shapes=[guide_line(y=0.0, color="#111827", dash="solid", width=1)],
                  yaxis=dict(title=dict(text="accuracy − full depth (points)")), xaxis=dict(title=dict(text="task")))
    title = title if title is not None else "Accuracy change against full depth, per task (paper Fig. 5)"
    return make_figure(bars, layout, title=title, presentation=presentation, height=height or 480)


def _delta_hover(task: str, group: str, acc: float, ref: float, chance: float | None) -> str:
    parts = [task, f"{group}: {acc:.1f}% vs full depth {ref:.1f}% ({acc - ref:+.1f} points)"]
    if chance is not None and np.isfinite(chance):
        parts.append(f"chance level {chance:.1f}%")
        if ref - chance < 5:
            parts.append("full depth is near chance here, so the difference is mostly noise")
    return " · ".join(parts)


def paired_curves(curves: dict[str, Sequence[dict[str, float]]], *, x: str = "layers", x_title: str | None = None,
                  bound: float | None = 0.01, title: str | None = None, presentation: bool = False) -> go.Figure:
    """Accuracy difference from full depth (points, with its 95% interval as error bars) against `x`, one line per
    strategy. curves: name -> points with keys `x`, "diff", "low" and "high" (fractions: -0.02 is 2 points lost),
    each name's points drawn in the order given; bound: a dashed line at -bound (e.g. the 1-point criterion)."""
    if not any(curves.values()):
        return empty_figure("No paired results to draw yet.", title=title, presentation=presentation)
    names = list(curves)
    colors = series_colors(["d3" if n.startswith("d3 ") else n.split()[0] for n in names])
    data = []
    for name, color in zip(names, colors):
        pts = sorted(curves[name], key=lambda p: p[x])
        xs = [p[x] for p in pts]
        ys = np.array([100 * p["diff"] for p in pts])
        up = np.array([100 * p["high"] for p in pts]) - ys
        down = ys - np.array([100 * p["low"] for p in pts])
        hover = [f"{name}<br>{x}: {fmt(p[x])}<br>{100 * p['diff']:+.1f} points [{100 * p['low']:+.1f}, "
                 f"{100 * p['high']:+.1f}]" for p in pts]
        data.append(go.Scatter(x=xs, y=ys, mode="lines+markers", name=name, line=dict(color=color),
                               error_y=dict(type="data", symmetric=False, array=up, arrayminus=down, thickness=1),
                               hovertext=hover, hoverinfo="text", meta={"role": "curve", "name": name}))
    shapes = [guide_line(y=0.0, color="#111827", dash="solid", width=1)]
    if bound is not None:
        shapes.append(guide_line(y=-100 * bound))
    layout = {"xaxis": {"title": {"text": x_title or x}}, "shapes": shapes,
              "yaxis": {"title": {"text": "accuracy vs full, points (95%)"}}}
    return make_figure(data, layout, title=title, presentation=presentation)
