"""Which layers matter: each flex layer's single-drop effect and the greedy removal curve (numbers in, a figure out)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from viz.layout import CORE_LINE, make_figure

CALIBRATED_COLOR = "#009E73"  # Okabe-Ito green: the measured order
IN_USE_COLOR = "#D55E00"  # vermillion: the order the controls run now
BAR_COLOR = "#56B4E9"
KL_COLOR = "#6B7280"


def _pct(values: Sequence[float]) -> list[float]:
    return [100.0 * v for v in values]


def layer_importance(single: Mapping[int, float], single_kl: Mapping[int, float], order: Sequence[int],
                     curve: Sequence[float], *, full: float = 1.0, in_use: Sequence[int] | None = None,
                     in_use_name: str = "", in_use_curve: Sequence[float] = (), presentation: bool = False,
                     height: int | None = None) -> go.Figure:
    """Top: each flex layer's agreement with full depth when it alone is dropped (bars, %), KL beside (dots, right
    axis), the calibrated order's rank on each bar. Bottom: agreement after dropping the first k layers of the
    calibrated order (`curve`, len K) and of the order in use (`in_use_curve`).

    single / single_kl: layer -> share kept top-1 / mean KL; order: the calibrated order (a permutation of the
    flex layers); in_use: the order the controls run (its first dropped layers are outlined)."""
    layers = sorted(single)
    rank = {layer: k + 1 for k, layer in enumerate(order)}
    first_in_use = set(list(in_use or ())[:3])
    hover = [f"drop layer {x} alone: {100 * single[x]:.1f}% of full depth's tokens kept, KL {single_kl.get(x, 0):.3f}"
             f"<br>calibrated order: dropped #{rank.get(x, '?')}" for x in layers]
    bars = go.Bar(x=layers, y=_pct([single[x] for x in layers]), name="kept top-1 when dropped alone",
                  marker=dict(color=BAR_COLOR, line=dict(color=[IN_USE_COLOR if x in first_in_use else BAR_COLOR
                                                                  for x in layers], width=3)),
                  text=[f"#{rank.get(x, '')}" for x in layers], textposition="inside", insidetextanchor="end",
                  hovertext=hover, hoverinfo="text", xaxis="x", yaxis="y", meta={"role": "single"})
    kl = go.Scatter(x=layers, y=[single_kl.get(x, 0.0) for x in layers], mode="markers", name="KL when dropped alone",
                    marker=dict(color=KL_COLOR, size=8, symbol="diamond"), xaxis="x", yaxis="y3",
                    hovertemplate="layer %{x}: KL %{y:.3f}<extra></extra>", meta={"role": "single-kl"})
    k = list(range(0, len(curve) + 1))
    steps = [go.Scatter(x=k, y=_pct([full, *curve]), mode="lines+markers", name="calibrated (greedy) order",
                        line=dict(color=CALIBRATED_COLOR, width=3), xaxis="x2", yaxis="y2",
                        text=["", *(f"drop {x}" for x in order[:len(curve)])],
                        hovertemplate="%{text}: %{y:.1f}% kept after %{x} dropped<extra>calibrated</extra>",
                        meta={"role": "curve"})]
    if in_use_curve:
        kk = list(range(0, len(in_use_curve) + 1))
        steps.append(go.Scatter(x=kk, y=_pct([full, *in_use_curve]), mode="lines+markers",
                                name=f"order in use ({in_use_name})" if in_use_name else "order in use",
                                line=dict(color=IN_USE_COLOR, width=2.5, dash="dash"), xaxis="x2", yaxis="y2",
                                text=["", *(f"drop {x}" for x in list(in_use or ())[:len(in_use_curve)])],
                                hovertemplate="%{text}: %{y:.1f}% kept after %{x} dropped<extra>in use</extra>",
                                meta={"role": "in-use-curve"}))
    small = presentation
    layout = dict(
        hovermode="closest", bargap=0.15,
        xaxis=dict(title=dict(text="flex layer dropped alone"), domain=[0, 0.92], anchor="y", dtick=1 if len(layers) <= 16 else 2),
        yaxis=dict(title=dict(text="tokens kept (%)"), domain=[0.6, 1], range=[0, 105]),
        yaxis3=dict(title=dict(text="KL"), overlaying="y", side="right", anchor="x", showgrid=False, rangemode="tozero",
                    color=KL_COLOR),
        xaxis2=dict(title=dict(text="layers dropped (first k of the order)"), domain=[0, 0.92], anchor="y2", dtick=1 if len(curve) <= 16 else 2),
        yaxis2=dict(title=dict(text="tokens kept (%)"), domain=[0, 0.4], range=[0, 105]),
        shapes=[dict(type="line", xref="x2", yref="y2", x0=0, x1=max(len(curve), 1), y0=100 * full, y1=100 * full,
                     line=dict(color=CORE_LINE, dash="dot", width=1))],
        margin=dict(b=110 if not small else 140),
    )
    return make_figure([bars, kl, *steps], layout, presentation=presentation, height=height or (640 if presentation else 560))
