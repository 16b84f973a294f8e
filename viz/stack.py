"""The animated layer stack: for each generated token, the model's layers drawn bottom to top, the token's path up
through the layers that ran, and for each skipped layer where its key/value entry came from (as the trace recorded it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go

from d3.trace import RAN, SKIPPED, TokenStep, Trace
from viz.layout import (
    CELL_COLORS,
    FILL_COLORS,
    PANEL_TITLES,
    core_shapes,
    drawn_core,
    empty_figure,
    fit_title,
    font_size,
    layer_kinds,
    make_figure,
    quoted,
    readable_token,
    shown_text,
    wrap_message,
)

# x positions: the boxes span [0, 1]; the path detours left of them past skipped layers; fills sit in a lane right.
BOX_RIGHT = 1.0
PATH_X = 0.2  # left of the box labels, which sit at the right end of each box
DETOUR_X = -0.14
LANE_X = 1.08  # propagate / hole markers; copy arrows start one step further right
LANE_WIDTH = 0.75  # the copy arrows' lane, however many nest in it
PATH_COLOR = "#111827"
FRAME_MS = 700  # one token per 0.7 s while playing: slow enough to read the caption
CAPTION_LINES = 3  # room kept above the plot for a frame's caption
CAPTION_CHARS = 32  # per caption line: the plot, right of the layer labels, is about 290 px wide on a phone
FILL_PHRASES = {"copy": "copied", "propagate": "propagated", "none": "hole"}
HIDDEN = dict(visible=False, text="", showarrow=False, x=0, y=0, xref="paper", yref="paper", name="unused")
FILL_SYMBOLS = {"propagate": "circle-open-dot", "none": "x-thin-open", "copy": "diamond-open"}


@dataclass(frozen=True)
class Fill:
    """How one skipped layer's KV entry at this position was filled: how in copy/propagate/none; source is the
    layer copied from where the trace recorded it (None for propagate / none, or a trace that did not record it)."""

    layer: int
    how: str
    source: int | None = None


def fills(step: TokenStep) -> tuple[Fill, ...]:
    """The step's filled layers as the engine recorded them (`TokenStep.filled`: layer, how, source). The figure
    draws the recorded source and never works it out again."""
    return tuple(Fill(layer, how, source if how == "copy" else None) for layer, how, source in step.filled)


def caption(trace: Trace, index: int) -> str:
    """One line for token `index`: "token 12 ' blue': 27 of 30 layers ran, 3 filled by copy"."""
    step = trace.steps[index]
    counts = {how: sum(f.how == how for f in fills(step)) for how in ("copy", "propagate", "none")}
    parts = [f"{step.n_layers} of {trace.num_layers} layers ran"]
    parts += [f"{counts['copy']} filled by copy"] if counts["copy"] else []
    parts += [f"{counts['propagate']} by propagate"] if counts["propagate"] else []
    parts += [f"{counts['none']} left as holes"] if counts["none"] else []
    return f"token {index} {quoted(shown_text(step))}: " + ", ".join(parts)


def _box_label(cell: int, fill: Fill | None) -> str:
    if cell == RAN:
        return "ran"
    if fill is None:
        return "skipped"
    if fill.how == "copy":
        return f"copied from {fill.source}" if fill.source is not None else "copied"
    return {"propagate": "propagated", "none": "hole (masked)"}[fill.how]


def _box_hover(layer: int, kind: str, cell: int, fill: Fill | None) -> str:
    head = f"layer {layer} ({kind}) · "
    if cell == RAN:
        return head + "ran"
    if fill is None:
        return head + "skipped: no KV entry written"
    if fill.how == "copy":
        where = f"layer {fill.source}" if fill.source is not None else "another layer (source not recorded)"
        return head + f"skipped: KV entry copied from {where}"
    return head + {"propagate": "skipped: KV computed from the hidden state passed through unchanged (propagate)",
                   "none": "skipped: KV left empty and masked out of attention (hole)"}[fill.how]


def _nesting(copies: list[Fill]) -> dict[int, int]:
    """Lane slot (1 = nearest the boxes) per copied layer: within one source the shorter arrows sit inside the
    longer ones, so arrows from one source never cross."""
    slots: dict[int, int] = {}
    by_source: dict[int, list[Fill]] = {}
    for fill in copies:
        by_source.setdefault(fill.source, []).append(fill)
    for group in by_source.values():
        for slot, fill in enumerate(sorted(group, key=lambda f: abs(f.layer - f.source)), start=1):
            slots[fill.layer] = slot
    return slots


def _copies(step: TokenStep) -> list[Fill]:
    return [f for f in fills(step) if f.how == "copy" and f.source is not None]


def _arrows(step: TokenStep, slot_width: float) -> list[dict[str, Any]]:
    """One annotation arrow per copied layer whose source was recorded: tail at the source layer's height, head at
    the copied layer's, in the lane right of the boxes."""
    copies = _copies(step)
    slots = _nesting(copies)
    notes = []
    for source in sorted({f.source for f in copies}):  # a line out of the source box to its outermost arrow
        outer = LANE_X + slot_width * max(slots[f.layer] for f in copies if f.source == source)
        notes.append(dict(x=outer, y=source, ax=BOX_RIGHT, ay=source, xref="x", yref="y", axref="x", ayref="y",
                          text="", showarrow=True, arrowhead=0, arrowwidth=2.5, arrowcolor=FILL_COLORS["copy"],
                          name=f"copy source {source}", visible=True))
    for fill in copies:
        x = LANE_X + slot_width * slots[fill.layer]
        # up (or down) the lane from the source's height to the filled layer's, then into the filled box: the head
        # ends on the box it fills (it used to end in the lane, 85-150 px right of the box; issue 35)
        notes.append(dict(x=x, y=fill.layer, ax=x, ay=fill.source, xref="x", yref="y", axref="x", ayref="y",
                          text="", showarrow=True, arrowhead=0, arrowwidth=2.5, arrowcolor=FILL_COLORS["copy"],
                          name=f"lane {fill.source}->{fill.layer}", visible=True))
        notes.append(dict(x=BOX_RIGHT, y=fill.layer, ax=x, ay=fill.layer, xref="x", yref="y", axref="x", ayref="y",
                          text="", showarrow=True, arrowhead=2, arrowsize=1.1, arrowwidth=2.5,
                          arrowcolor=FILL_COLORS["copy"], standoff=0, startstandoff=0,
                          name=f"copy {fill.source}->{fill.layer}",
                          hovertext=f"layer {fill.layer}: KV entry copied from layer {fill.source}", visible=True))
    return notes


def _path(cells: np.ndarray, presentation: bool) -> dict[str, Any]:
    """The token's hidden state going up: through the middle of each layer that ran, around the skipped ones."""
    layers = np.arange(len(cells))
    ran = cells == RAN
    return dict(type="scatter", x=np.where(ran, PATH_X, DETOUR_X).tolist(), y=layers.tolist(), mode="lines+markers",
                hoverinfo="skip",
                line=dict(color=PATH_COLOR, width=3 if presentation else 2.5),
                marker=dict(size=np.where(ran, 9 if presentation else 7, 0).tolist(), color=PATH_COLOR),
                showlegend=False, meta={"role": "path"})


def _markers(step: TokenStep, presentation: bool) -> dict[str, Any]:
    """A marker in the lane for each filled layer without an arrow: propagate (a dot in a ring: the entry made from
    the layer's own passed-through input), a hole (a cross), a copy whose source the trace did not record."""
    marks = [f for f in fills(step) if f.how != "copy" or f.source is None]
    return dict(type="scatter", x=[LANE_X] * len(marks), y=[f.layer for f in marks], mode="markers", showlegend=False,
                marker=dict(symbol=[FILL_SYMBOLS[f.how] for f in marks], color=[FILL_COLORS[f.how] for f in marks],
                            size=14 if presentation else 11, line=dict(width=2.5)),
                hovertext=[f"layer {f.layer}: {FILL_PHRASES[f.how]}" for f in marks],
                hovertemplate="%{hovertext}<extra></extra>", meta={"role": "fill-markers"})


def _frame(trace: Trace, index: int, slot_width: float, presentation: bool) -> tuple[list[dict], list[dict]]:
    """The traces (boxes, path, markers) and annotations (caption, arrows) of token `index`, as plain JSON-ready dicts:
    frames travel inside the slider's steps, which plotly does not validate or convert (and validating a plotly
    object per frame would cost about as much again as building it)."""
    step = trace.steps[index]
    num_layers = trace.num_layers
    cells = step.cells(num_layers)
    by_layer = {f.layer: f for f in fills(step)}
    kinds = layer_kinds(num_layers, drawn_core(trace))
    labels = [_box_label(int(cells[k]), by_layer.get(k)) for k in range(num_layers)]
    colors = [CELL_COLORS[RAN] if c == RAN else CELL_COLORS[SKIPPED] for c in cells]
    edges = [CELL_COLORS[RAN] if c == RAN else FILL_COLORS.get(by_layer[k].how, "#9CA3AF") if k in by_layer
             else "#9CA3AF" for k, c in enumerate(cells)]
    boxes = dict(type="bar", y=list(range(num_layers)), x=[BOX_RIGHT] * num_layers, base=0, orientation="h",
                 width=0.82, marker=dict(color=colors, line=dict(color=edges, width=2)), text=labels,
                 textposition="inside", insidetextanchor="end", textangle=0, cliponaxis=False,
                 insidetextfont=dict(color=["#FFFFFF" if c == RAN else "#374151" for c in cells],
                                     size=font_size(presentation, delta=-4)),
                 hovertext=[_box_hover(k, kinds[k], int(cells[k]), by_layer.get(k)) for k in range(num_layers)],
                 hovertemplate="%{hovertext}<extra></extra>", showlegend=False,
                 meta={"role": "layer-boxes", "step": step.step})
    note = dict(text=wrap_message(caption(trace, index), CAPTION_CHARS), x=0, y=1, xref="paper",
                yref="paper", xanchor="left", yanchor="bottom", yshift=6, showarrow=False, align="left",
                font=dict(size=font_size(presentation, delta=-1)), name="caption", visible=True)
    return [boxes, _path(cells, presentation), _markers(step, presentation)], [note, *_arrows(step, slot_width)]


def _token_frames(built: dict[int, tuple[list[dict], list[dict]]]) -> list[dict[str, Any]]:
    """One animation frame per token, as plotly frame objects (plain dicts) that the slider and the play button carry
    themselves: gradio's plot draws a figure with `Plotly.react(data, layout)` and drops `figure.frames`, so frames
    registered by name would leave play and the slider dead on the page. Each frame moves the slider with it, and
    sets as many annotations as the busiest one: plotly.js merges a frame's annotations into the shown ones item by
    item, so a token with fewer arrows hides the rest rather than leave the previous token's on screen."""
    most = max(len(notes) for _, notes in built.values())
    return [dict(data=data, traces=[0, 1, 2],
                 layout=dict(annotations=notes + [HIDDEN] * (most - len(notes)), sliders=[dict(active=i)]))
            for i, (data, notes) in sorted(built.items())]


STEP = dict(mode="immediate", frame=dict(duration=0, redraw=True), transition=dict(duration=0))
PLAY = dict(mode="immediate", frame=dict(duration=FRAME_MS, redraw=True), transition=dict(duration=0))


def _slider(trace: Trace, frames: list[dict[str, Any]], index: int, presentation: bool) -> dict[str, Any]:
    """A step control: one step per token, on `index`; labels only where few enough to read (the current one always
    shows above it)."""
    few = len(trace.steps) <= 12
    steps = [dict(method="animate", label=f"{i} {readable_token(shown_text(s))[:12]}", args=[[frames[i]], STEP])
             for i, s in enumerate(trace.steps)]
    label_px = font_size(presentation, delta=-5)
    # The last label is centred on the last tick, at the plot's right edge: the rail ends half its width earlier, so
    # that it is not cut ("7 ␣becaus" on SmolLM2 at 1280x800; a character is at most ~0.6 em wide).
    right = round(0.6 * label_px * len(steps[-1]["label"]) / 2) if few else 0
    return dict(active=index, steps=steps, x=0.0, len=1.0, y=0, yanchor="top", pad=dict(t=50, b=0, r=right),
                currentvalue=dict(prefix="token ", font=dict(size=font_size(presentation, delta=-2), color="#1F2937")),
                font=dict(size=label_px, color="#374151" if few else "rgba(0,0,0,0)"),
                ticklen=4 if few else 2)


def _buttons(frames: list[dict[str, Any]], index: int, presentation: bool) -> dict[str, Any]:
    """Play (one token per FRAME_MS, from the token shown to the last; from the first when the last is shown) and
    pause."""
    play = dict(label="▶ play", method="animate", args=[frames[index if index < len(frames) - 1 else 0:], PLAY])
    pause = dict(label="❚❚ pause", method="animate",
                 args=[[None], dict(frame=dict(duration=0, redraw=False), mode="immediate", transition=dict(duration=0))])
    return dict(type="buttons", direction="left", buttons=[play, pause], x=0, xanchor="left", y=0, yanchor="top",
                pad=dict(t=8, r=8), showactive=False, font=dict(size=font_size(presentation, delta=-2)))


STACK_CHROME_PX = 230  # px of the stack's figure that is not rows: title, caption, margins
STACK_MAX_PX = 700  # the whole stack on a 1280x800 screen (its 30 layers were 1,021 px tall: half of it seen)


def stack_height(num_layers: int, controls: int = 0) -> int:
    """The stack's figure height: 22 px a layer up to STACK_MAX_PX, rows lower beyond it (30 layers at ~12 px)."""
    return int(np.clip(22 * num_layers + STACK_CHROME_PX + controls, 380, STACK_MAX_PX))


def layer_stack(trace: Trace, index: int | None = None, *, animate: bool = True, title: str | None = None,
                presentation: bool = False, height: int | None = None) -> go.Figure:
    """The layer stack of `trace` showing token `index` (default: the last, e.g. while streaming): with `animate`,
    one animation frame per generated token (`_token_frames`, carried by the step slider, on `index`, and the play
    button; pause stops); without, token `index` alone (cheap enough to redraw on every streamed token).

    Per token: layers 0..L-1 as boxes bottom to top (ran in colour, skipped grey, edged in their fill's colour), the
    token's path as a line through the layers that ran and around the skipped ones, an arrow from the source layer
    for each copied KV entry whose source the trace recorded, a marker for propagate / a hole, core layers banded,
    and a caption (`caption`)."""
    if not trace.steps:
        return empty_figure("No tokens yet: the layer stack shows each generated token's path once a run starts.",
                            title=title, presentation=presentation, height=height)
    index = len(trace.steps) - 1 if index is None else index
    if not 0 <= index < len(trace.steps):
        raise ValueError(f"token={index} is not allowed: token must be in [0, {len(trace.steps) - 1}]")
    # One lane width for every frame, so that the picture does not jump while it plays.
    slots = max(3, max(max(_nesting(_copies(s)).values(), default=0) for s in trace.steps))
    slot_width = LANE_WIDTH / slots
    shown = range(len(trace.steps)) if animate else [index]
    built = {i: _frame(trace, i, slot_width, presentation) for i in shown}  # token -> (traces, annotations)
    num_layers = trace.num_layers
    core = drawn_core(trace)
    kinds = layer_kinds(num_layers, core) if sum(core) else [""] * num_layers  # no core: no "flex" either
    controls = (120 if presentation else 100) if animate else 0
    fig_height = height or stack_height(num_layers, controls)
    # Layer labels a little apart: every layer where a row is taller than its label, else every other one.
    tick_px = font_size(presentation, delta=-4)
    every = 1 if (fig_height - STACK_CHROME_PX - controls) / num_layers >= tick_px + 2 else 2
    ticks = list(range(0, num_layers, every))
    title = title if title is not None else fit_title("Layer stack", "each token's path up through the layers")
    layout = dict(
        xaxis=dict(visible=False, range=[DETOUR_X - 0.08, LANE_X + slot_width * slots + 0.06], fixedrange=True),
        yaxis=dict(tickmode="array", tickvals=ticks, range=[-0.6, num_layers - 0.4], fixedrange=True,
                   ticktext=[f"{k} {kinds[k]}".strip() for k in ticks], showgrid=False, zeroline=False,
                   tickfont=dict(size=tick_px), title=dict(text="layer")),
        shapes=core_shapes(num_layers, drawn_core(trace), axis="y"), bargap=0.1, annotations=built[index][1],
        # Box labels at their font size even where a box is a little lower than the text (30 layers on a projector):
        # plotly would otherwise shrink each label to its box.
        uniformtext=dict(minsize=font_size(presentation, delta=-4), mode="show"),
        margin=dict(b=(150 if presentation else 130) if animate else 30, r=10, l=10),
    )
    if animate:
        frames = _token_frames(built)
        layout.update(sliders=[_slider(trace, frames, index, presentation)],
                      updatemenus=[_buttons(frames, index, presentation)])
    fig = make_figure(built[index][0], layout, title=title, presentation=presentation, legend=False, height=fig_height)
    caption_px = CAPTION_LINES * round(1.3 * font_size(presentation, delta=-1)) + 8
    fig.update_layout(margin_t=fig.layout.margin.t + caption_px - PANEL_TITLES)
    return fig
