"""Depth against decoding step (Fig. 4): D3's decay curve, planned budgets and the layers tokens used."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from d3.config import D3Config, StrategyConfig, max_core_side, params
from d3.schedule import budgets
from d3.schedule import raw_decay as decay_at
from d3.trace import Trace
from viz.layout import (
    CORE_LINE,
    d3_label_extras,
    decode_plan,
    font_size,
    guide_line,
    make_figure,
    quoted,
    series_colors,
    short_label,
    shown_text,
    strategy_kind,
    strategy_label,
)


def raw_decay(cfg: D3Config, num_layers: int, steps: int) -> np.ndarray:
    """int [steps]: D3's formula before the core floor clamps it (`d3.schedule.raw_decay`)."""
    return np.array([decay_at(cfg.alpha, num_layers, i, cfg.start) for i in range(steps)], dtype=np.int64)


def usage_scatter(trace: Trace, *, name: str, color: str, mode: str = "markers", showlegend: bool = True) -> go.Scatter:
    """What each token of `trace` actually ran: layers_used [T] against step [T], with per-token hover."""
    used = trace.layers_used
    hover = [f"step {s.step}: token {quoted(shown_text(s))} ran {s.n_layers} of {trace.num_layers} layers"
             f" (planned {s.planned})" + (f", exited after layer {s.exit_layer}" if s.exit_layer is not None else "")
             for s in trace.steps]
    return go.Scatter(x=np.array([s.step for s in trace.steps]), y=used, mode=mode, name=name, text=hover,
                      hovertemplate="%{text}<extra>" + name + "</extra>", showlegend=showlegend,
                      marker=dict(color=color, size=7, opacity=0.85), line=dict(color=color, width=2),
                      meta={"role": "actual", "name": name, "strategy": strategy_kind(trace.strategy)})


FLOOR_LABEL_GAP = 4  # px between the plot's right edge and the core floor's label
FLOOR_LABEL_EM = 4.6  # the label's width in ems at most: "core floor" (4.2), or "14+15=29" (4.5) for a 30-layer model


def core_floor_text(head: int, tail: int) -> str:
    """The core floor's label, two short lines in the figure's right margin (assets/decay_preview.js writes the same
    while a slider moves)."""
    return f"core floor<br>{head}+{tail}={head + tail}"


def d3_guides(cfg: D3Config, num_layers: int) -> tuple[list[dict], list[dict]]:
    """(shapes, annotations): the core floor line and the decay start line, each with its label. Both are always
    there, hidden where they mark nothing (a zero core, start 0), and named, so that the page can move them while
    a slider moves without redrawing the figure (assets/decay_preview.js)."""
    head, tail = cfg.core(num_layers)
    floor = head + tail
    shapes = [dict(guide_line(y=floor, color=CORE_LINE, dash="dot"), name="core-floor", visible=floor > 0),
              dict(guide_line(x=cfg.start - 0.5), name="decay-start", visible=cfg.start > 0)]
    # In the right margin, at the end of the floor line: inside the plot every place along the line is one where the
    # layers a token used (markers at the floor) or another strategy's line can sit (decay_curve makes the room).
    notes = [dict(x=1, xref="paper", xanchor="left", xshift=FLOOR_LABEL_GAP, y=floor, yanchor="middle", align="left",
                  showarrow=False, name="core-floor", visible=floor > 0, text=core_floor_text(head, tail),
                  font=dict(color=CORE_LINE)),
             dict(x=cfg.start - 0.5, xanchor="left", y=0, yref="paper", yanchor="bottom", showarrow=False,
                  name="decay-start", visible=cfg.start > 0, text=f" decay starts at token {cfg.start}")]
    return shapes, notes


def d3_schedule_meta(cfg: D3Config, num_layers: int, steps: int, *, main: bool, short_names: bool = False) -> dict:
    """What a figure's D3 lines were drawn for, in its layout meta: enough for the page to redraw them from the
    sliders alone (the formula of `d3.schedule.d3_budget`), and to tell a figure drawn for other values.
    `short_names`: the lines are named without their settings (presentation mode), so the page keeps the names."""
    head, tail = cfg.core(num_layers)
    # The limits the browser checks a slider's values against, fed from the registry and the core rule (never
    # restated in the browser): α's range and the largest core (head + tail, d3.config.core_fits).
    alpha = params(D3Config)["alpha"]
    # Every number of D3's registry the curve was drawn for, and its default: the page's preview redraws from the
    # ones its formula knows, and leaves the curve to the server while another one is off its default.
    numbers = {k: p for k, p in params(D3Config).items() if p.checked and not p.choices}
    drawn = {k: getattr(cfg, k) for k in numbers} | {"core_head": head, "core_tail": tail}
    return dict(num_layers=num_layers, steps=steps, alpha=float(cfg.alpha), core_head=head, core_tail=tail,
                alpha_lo=alpha.lo, alpha_hi=alpha.hi, core_max=max_core_side(0, num_layers),
                start=cfg.start, main=main, label_core=cfg.core_head is not None or cfg.core_tail is not None,
                label_extra=d3_label_extras(cfg.to_dict()), short_names=short_names,
                fields=drawn, defaults={k: p.default for k, p in numbers.items() if k not in ("core_head", "core_tail")})


def _planned_line(cfg: StrategyConfig, num_layers: int, steps: int, *, name: str, color: str, width: float,
                  dash: str = "solid") -> go.Scatter:
    """The planned budget `budgets(cfg, L, steps)` [steps] as a step-wise line."""
    y = np.asarray(budgets(cfg, num_layers, steps), dtype=np.int64)
    return go.Scatter(x=np.arange(steps), y=y, mode="lines", name=name, line=dict(color=color, width=width,
                      dash=dash, shape="hv"), hovertemplate="step %{x}: planned %{y} of " + str(num_layers)
                      + " layers<extra>" + name + "</extra>", meta={"role": "planned", "name": name,
                                                                  "strategy": cfg.name})


FEW_STEPS = 12  # up to this many steps the decay curve's axis ticks every token


def decay_curve(cfg: StrategyConfig, num_layers: int, steps: int, *, trace: Trace | None = None,
                others: dict[str, StrategyConfig] | None = None, others_traces: dict[str, Trace] | None = None,
                title: str | None = None, presentation: bool = False, height: int | None = None,
                box_height: bool = False) -> go.Figure:
    """Layers per step: the raw decay floor(L * alpha ** i) [steps] (dashed, D3 only), the planned budget
    `budgets(cfg)` [steps] with the core floor and the delayed start marked, the layers each token of
    `trace` used [T] (markers), other strategies' planned budgets (legend entries, drawn when clicked: the curve
    draws what the run uses), and the actual usage of `others_traces` (early exit has no plan, so only its trace can show it). Cheap enough for every
    slider move (about 15 ms for 512 steps with three other strategies). `box_height`: no height of its own, the
    figure takes its box's (a page sizes the box to its screen)."""
    cfg.check_layers(num_layers)
    others = others or {}
    others_traces = others_traces or {}
    kinds = [cfg.name, *(c.name for c in others.values()), *(strategy_kind(t.strategy) for k, t in others_traces.items()
                                                              if k not in others)]
    colors = series_colors(kinds)
    main_color = colors[0]
    # In presentation mode the legend names each line in a word or two ("D3: planned", "SkipDecode (auto)"; the D3
    # pane's title above the curve gives the settings, the dashed unclamped formula is named on hover only), so
    # that it takes one row instead of a row a line and the curve keeps its height on the first screen.
    label = short_label(cfg) if presentation else strategy_label(cfg)
    data: list[go.Scatter] = []  # collected, then one Figure(...) call: add_trace copies each trace
    shapes: list[dict] = []
    notes: list[dict] = []
    if isinstance(cfg, D3Config):
        data.append(go.Scatter(x=np.arange(steps), y=raw_decay(cfg, num_layers, steps), mode="lines",
                               name="floor(L·α^i), unclamped", showlegend=False, line=dict(color=main_color, dash="dash", width=1.5),
                               hovertemplate="step %{x}: the formula alone gives %{y} layers<extra></extra>",
                               meta={"role": "raw"}))
        shapes, notes = d3_guides(cfg, num_layers)
    d3 = cfg if isinstance(cfg, D3Config) else next((c for c in others.values() if isinstance(c, D3Config)), None)
    if not decode_plan(cfg, num_layers).dynamic:
        data.append(_planned_line(cfg, num_layers, steps, name=f"{label}: planned", color=main_color, width=3))
    if trace is not None:
        data.append(usage_scatter(trace, name=f"{label}: used", color=main_color))
    for (key, other), color in zip(others.items(), colors[1:]):
        if decode_plan(other, num_layers).dynamic:
            continue  # early exit decides while decoding: only its trace (below) can show it
        # What the run does not use is a legend entry to click, not a line: the curve shows the run's schedule.
        line = _planned_line(other, num_layers, steps, name=key if presentation else f"{key}: planned", color=color,
                             width=2)
        data.append(line.update(visible="legendonly"))
    other_colors = dict(zip(others, colors[1:]))
    extra_colors = iter(colors[1 + len(others):])
    for key, other_trace in others_traces.items():
        color = other_colors.get(key) or next(extra_colors)
        data.append(usage_scatter(other_trace, name=f"{key}: used", color=color, mode="lines+markers"))
    layout = dict(
        shapes=shapes, annotations=notes, hovermode="closest",
        # Presentation mode: the legend is one row over the curve, on the first screen with it.
        **({"legend": dict(yref="container", y=1, yanchor="top", x=0, xanchor="left")} if presentation else {}),
        # Room in the right margin for the core floor's label (d3_guides), none needed without it; in presentation
        # mode the top margin is the legend's row, and without a title (beside the panes) it is all but gone.
        margin=dict(**({"r": round(FLOOR_LABEL_EM * font_size(presentation, delta=-1)) + FLOOR_LABEL_GAP + 8}
                       if notes else {}), **({"t": 34} if presentation else {"t": 14} if title == "" else {})),
        # Presentation mode: no axis title under the steps (the legend over the curve says "D3: planned" per step),
        # so that the curve, its ticks and its legend keep a readable height on the first 1280x800 screen.
        # A step is a whole token: a short run ticks each one (plotly's own ticks fell on -0.5, 0.5, ... for 4).
        xaxis=dict(title=dict(text="" if presentation else "generated token (step i)"),
                   range=[-0.5, max(steps, 1) - 0.5], **({"tick0": 0, "dtick": 1} if steps <= FEW_STEPS else {})),
        # Short: the curve is kept low (it shares the first screen with the panes) and the title must fit its height.
        yaxis=dict(title=dict(text="layers run"), range=[0, num_layers + 1]))
    if d3 is not None:
        layout["meta"] = {"d3_schedule": d3_schedule_meta(d3, num_layers, steps, main=d3 is cfg,
                                                          short_names=presentation)}
    title = title if title is not None else f"Depth decay · {label} · L = {num_layers}"
    return make_figure(data, layout, title=title, presentation=presentation,
                       height=None if box_height else height or 460)


def layers_vs_step(traces: dict[str, Trace], *, show_planned: bool = True, title: str | None = None,
                   presentation: bool = False, height: int | None = None) -> go.Figure:
    """Layers used [T] against decoding step for several runs (paper Fig. 4), planned budgets dotted."""
    colors = series_colors([strategy_kind(t.strategy) for t in traces.values()])
    data: list[go.Scatter] = []
    num_layers = max((t.num_layers for t in traces.values()), default=1)
    for (key, trace), color in zip(traces.items(), colors):
        name = f"{key} (mean {trace.mean_layers:.1f}/{trace.num_layers})"
        data.append(usage_scatter(trace, name=name, color=color, mode="lines+markers"))
        if show_planned and trace.steps and not np.array_equal(trace.planned, trace.layers_used):
            data.append(go.Scatter(x=np.array([s.step for s in trace.steps]), y=trace.planned, mode="lines",
                                   name=f"{key}: planned", line=dict(color=color, dash="dot", width=1.5, shape="hv"),
                                   hovertemplate="step %{x}: planned %{y} layers<extra>" + key + "</extra>",
                                   meta={"role": "planned", "name": key}))
    layout = dict(xaxis=dict(title=dict(text="generated token (step)")),
                  yaxis=dict(title=dict(text="decoder layers run"), range=[0, num_layers + 1]),
                 )
    title = title if title is not None else "Layers used per decoding step (paper Fig. 4)"
    return make_figure(data, layout, title=title, presentation=presentation, height=height or 460)
