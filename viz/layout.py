"""The one shared look: colours, fonts, labels and small shape helpers every figure builder uses."""

from __future__ import annotations

import html
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from d3.config import STRATEGIES, StrategyConfig, strategy_from_dict
from d3.schedule import LayerPlan, plan
from d3.trace import CELL_NAMES, FILLED_COPY, FILLED_PROPAGATE, HOLE, RAN, SKIPPED

# -- colours --------------------------------------------------------------------------------
# Okabe-Ito based, so the states stay apart for colour-blind viewers and on a washed-out projector.
CELL_COLORS: dict[int, str] = {
    SKIPPED: "#E5E7EB",
    RAN: "#0072B2",
    FILLED_COPY: "#E69F00",
    FILLED_PROPAGATE: "#009E73",
    HOLE: "#D55E00",
}
CELL_CODES: tuple[int, ...] = (SKIPPED, RAN, FILLED_COPY, FILLED_PROPAGATE, HOLE)
FILL_COLORS: dict[str, str] = {"copy": CELL_COLORS[FILLED_COPY], "propagate": CELL_COLORS[FILLED_PROPAGATE],
                               "none": CELL_COLORS[HOLE]}

CORE_FILL = "rgba(106, 61, 154, 0.13)"  # translucent band behind core layers
CORE_LINE = "#6A3D9A"
FLEX_COLOR = "#D1D5DB"

STRATEGY_COLORS: dict[str, str] = {
    "full": "#444444",
    "d3": "#0072B2",
    "skipdecode": "#E69F00",
    "unified": "#009E73",
    "early_exit": "#CC79A7",
}
# Further series of a strategy already on the chart take these, in order.
EXTRA_COLORS: tuple[str, ...] = ("#56B4E9", "#D55E00", "#8C564B", "#F0E442", "#17BECF", "#7F7F7F", "#BCBD22", "#1F77B4")
SUBLAYER_COLORS: dict[str, str] = {"attn": "#0072B2", "mlp": "#D55E00"}
SUBLAYER_NAMES: dict[str, str] = {"attn": "attention", "mlp": "MLP"}
SEQUENTIAL = "YlGnBu"  # few -> many (layers used, attention weight, error)

# -- fonts ----------------------------------------------------------------------------------
FONT_FAMILY = "Inter, 'Helvetica Neue', Arial, sans-serif"
BASE_FONT = 16  # readable from the back of a room at the default size
PRESENTATION_SCALE = 1.4
MESSAGE_WIDTH = 36  # characters per line of a placeholder's message: fits a phone's plot box (about 320 px)


def font_size(presentation: bool = False, *, delta: int = 0) -> int:
    """The body font size (plus `delta`), scaled up for a projector when `presentation`."""
    size = BASE_FONT + delta
    return round(size * PRESENTATION_SCALE) if presentation else size


# A small template of our own: "plotly_white" is deep-copied into every figure that names it, which
# alone costs about 30 ms, too slow for figures redrawn on every slider move.
TEMPLATE = go.layout.Template(layout=dict(
    paper_bgcolor="white", plot_bgcolor="white", colorway=list(STRATEGY_COLORS.values()) + list(EXTRA_COLORS),
    xaxis=dict(gridcolor="#EEF0F3", zerolinecolor="#D1D5DB", linecolor="#9CA3AF", ticks="outside", automargin=True),
    yaxis=dict(gridcolor="#EEF0F3", zerolinecolor="#D1D5DB", linecolor="#9CA3AF", ticks="outside", automargin=True),
))


def base_layout(*, title: str | None = None, presentation: bool = False, height: int | None = None,
                width: int | None = None, legend: bool = True) -> dict[str, Any]:
    """Fonts, margins, background and legend shared by every figure, as a layout dict. A title of several lines
    makes the figure taller by what its lines take beyond a one-line title's margin, so that the plot keeps its
    height (a plot squeezed to nothing makes plotly fail to draw the figure)."""
    if height and title and "<br>" in title:
        height += title_margin(title, presentation) - title_margin("one line", presentation)
    return dict(
        template=TEMPLATE,
        font=dict(family=FONT_FAMILY, size=font_size(presentation), color="#1F2937"),
        title=dict(text=title or "", font=dict(size=font_size(presentation, delta=4)), x=0.01, xanchor="left",
                   **(title_at_top(presentation) if title and "<br>" in title else {})),
        hoverlabel=dict(font=dict(size=font_size(presentation, delta=-2), family=FONT_FAMILY)),
        margin=dict(l=70, r=30, t=title_margin(title, presentation), b=40),
        showlegend=legend,
        # Below everything, anchored to the figure rather than the plot, so it never covers axis titles.
        legend=dict(font=dict(size=font_size(presentation, delta=-2)), orientation="h", yref="container", y=0,
                    yanchor="bottom", x=0, xanchor="left"),
        height=height,
        width=width,
    )


# A title of several lines hangs from the top of the figure (plotly would centre its first line in the margin and
# hang the rest below it, so each further line would need twice its height). Plotly anchors the first line's
# baseline, not its top: the padding adds the line's ascent (about 0.9 em) to the gap wanted above it.
TITLE_GAP = 12  # px above a title of several lines
PANEL_TITLES = 30  # px between such a title and the plot: room for panel titles (or the grid's core/flex ribbon)


def title_at_top(presentation: bool) -> dict[str, Any]:
    """Title settings that hang a title of several lines from the top of the figure, TITLE_GAP px under its edge."""
    size = font_size(presentation, delta=4)
    return dict(y=1, yref="container", yanchor="top", pad=dict(t=TITLE_GAP + round(0.9 * size)))


def title_margin(title: str | None, presentation: bool) -> int:
    """The top margin for a title of one or more lines (a subtitle line after each "<br>"): a one-line title sits
    half way down 90 px; a longer one hangs from the top, each line as high as the title's (plotly spaces lines by
    the title's font, subtitles too: 1.3 em), with its descent and room for panel titles under it."""
    if not title:
        return 40
    lines = title.count("<br>") + 1
    if lines == 1:
        return 90
    size = font_size(presentation, delta=4)
    return TITLE_GAP + lines * round(1.3 * size) + round(1.25 * size) + PANEL_TITLES


def apply_layout(fig: go.Figure, *, title: str | None = None, presentation: bool = False,
                 height: int | None = None, width: int | None = None, legend: bool = True) -> go.Figure:
    """Apply `base_layout` to `fig` (keeping what the builder set, e.g. legend position); returns `fig`."""
    fig.update_layout(base_layout(title=title, presentation=presentation, height=height, width=width, legend=legend))
    # Subplot titles and notes are annotations; keep them in step with the font scale.
    if fig.layout.annotations:
        fig.update_annotations(font_size=font_size(presentation, delta=-1))
    return fig


def make_figure(data: list, layout: dict[str, Any], *, title: str | None = None, presentation: bool = False,
                height: int | None = None, width: int | None = None, legend: bool = True) -> go.Figure:
    """A figure built in one call from traces and a layout merged over `base_layout`: cheaper than
    `add_trace` + `update_layout`, for figures redrawn on every slider move."""
    merged = _merge(base_layout(title=title, presentation=presentation, height=height, width=width, legend=legend), layout)
    for note in merged.get("annotations", ()):
        note.setdefault("font", {}).setdefault("size", font_size(presentation, delta=-1))
    return go.Figure(data=data, layout=merged)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Nested dict merge: values in `over` win, dicts merge key by key."""
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def wrap_message(message: str, width: int = MESSAGE_WIDTH) -> str:
    """`message` with its lines (plotly's "<br>") wrapped at word boundaries to at most `width` characters."""
    return "<br>".join("<br>".join(textwrap.wrap(line, width, break_long_words=False, break_on_hyphens=False)) or line
                       for line in message.split("<br>"))


# A title fits the narrowest box a figure gets: a phone's (about 320 px) or the token scrubber's (about 310 px beside
# the layers at 1280 px). Presentation mode scales fonts and boxes alike (1.4x; the scrubber's box is 440 px there),
# so the same counts fit both. About 0.55 em per character: 28 at the title's size, 40 at a subtitle's (70%).
TITLE_CHARS = 28
SUBTITLE_CHARS = 40


def fit_title(head: str, *notes: str | tuple[str, str]) -> str:
    """A figure title that plotly draws inside a narrow box: `head` (wrapped at TITLE_CHARS) and each note wrapped
    into smaller subtitle lines (SUBTITLE_CHARS), one "<sub>" per line; a note given as (text, colour) is drawn in
    that colour. Plotly never wraps a title: one wider than the figure is cut at its right edge. Notes are plain
    text (plotly's escapes allowed, no tags)."""
    lines = wrap_message(head, TITLE_CHARS).split("<br>")
    for note in notes:
        text, color = note if isinstance(note, tuple) else (note, None)
        for line in wrap_message(text, SUBTITLE_CHARS).split("<br>"):
            lines.append(f"<sub><span style='color:{color}'>{line}</span></sub>" if color else f"<sub>{line}</sub>")
    return "<br>".join(lines)


def empty_figure(message: str, *, title: str | None = None, presentation: bool = False,
                 height: int | None = None) -> go.Figure:
    """A blank figure carrying a plain-language `message` where a chart cannot be drawn, in lines short enough
    for a phone's box (plotly clips an annotation wider than its plot rather than wrap it)."""
    note = dict(text=wrap_message(message), x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                font=dict(size=font_size(presentation, delta=2)))
    layout = dict(annotations=[note], xaxis=dict(visible=False), yaxis=dict(visible=False))
    return make_figure([], layout, title=title, presentation=presentation, height=height or 320, legend=False)


def to_html(fig: go.Figure, *, plotlyjs: str | bool = True) -> str:
    """A whole HTML page of the figure: plotly.js inlined (True, works offline, about 4.6 MB), or loaded from
    `plotlyjs`, a script path or URL (e.g. "plotly.min.js" beside the page, written once by the caller)."""
    return fig.to_html(include_plotlyjs=plotlyjs, full_html=True)


# -- colours for series ------------------------------------------------------------------------
def series_colors(kinds: Sequence[str]) -> list[str]:
    """One colour per series: the first series of a strategy kind gets that strategy's colour,
    later ones of the same kind (or unknown kinds) the next unused extra colour."""
    seen: set[str] = set()
    extra = iter(EXTRA_COLORS * (1 + len(kinds) // len(EXTRA_COLORS)))
    out = []
    for kind in kinds:
        if kind in STRATEGY_COLORS and kind not in seen:
            out.append(STRATEGY_COLORS[kind])
        else:
            out.append(next(extra))
        seen.add(kind)
    return out


# -- text -----------------------------------------------------------------------------------
_WHITESPACE_GLYPHS = {"\n": "⏎", "\t": "⇥", "\r": "␍", " ": "␣"}


def readable_token(text: str) -> str:
    """Token text with whitespace and control characters made visible ("\\n" -> "⏎", " " -> "␣")."""
    if text == "":
        return "∅"
    out = []
    for ch in text:
        if ch in _WHITESPACE_GLYPHS:
            out.append(_WHITESPACE_GLYPHS[ch])
        elif ord(ch) < 32:
            out.append(chr(0x2400 + ord(ch)))  # the Unicode "control pictures" block
        else:
            out.append(ch)
    return "".join(out)


def shown_text(step: Any) -> str:
    """A token's text as a view shows it: its text, or where it holds only part of a multi-byte character (its
    text is then "" or what comes before that part), the token on its own with those bytes written out
    (`TokenStep.piece`: "<0xF0><0x9F>"), never U+FFFD or the empty token's ∅."""
    return getattr(step, "piece", "") or step.text


def plot_text(text: str) -> str:
    """Token text safe for plotly labels: whitespace made visible, then &, < and > escaped, because
    plotly reads label text as a small subset of HTML (a token "<br>" would otherwise break the line)."""
    return html.escape(readable_token(text), quote=False)


def quoted(text: str) -> str:
    """A token for hover text: readable, escaped, in quotes."""
    return f"'{plot_text(text)}'"


def strategy_label(strategy: Mapping[str, Any] | StrategyConfig) -> str:
    """A short human name for a strategy config or its dict form, e.g. "D3 (α=0.99, start 8)": the config's own
    `describe()` (the fields that differ from its defaults)."""
    return as_config(strategy).describe() if _known(strategy) else strategy_kind(strategy)


SHORT_LABELS = {name: cls.short for name, cls in STRATEGIES.items()}


def short_label(strategy: Mapping[str, Any] | StrategyConfig) -> str:
    """A strategy's name in a word or two ("D3", "full depth"), for labels with little room (a panel's title)."""
    kind = strategy_kind(strategy)
    return SHORT_LABELS.get(kind, kind)


def d3_label_extras(strategy: Mapping[str, Any]) -> list[str]:
    """The last parts of D3's label, which no slider moves: its drop order and its fill, where not the defaults
    (the page's client-side decay preview rebuilds the rest of the label from the sliders)."""
    return [part for part in as_config(strategy).parts() if not part.startswith(("α=", "start ", "core "))]


def as_config(strategy: Mapping[str, Any] | StrategyConfig) -> StrategyConfig:
    """The strategy config of a config or its dict form (a trace read back from JSON holds the dict)."""
    return strategy if isinstance(strategy, StrategyConfig) else strategy_from_dict(dict(strategy))


def _known(strategy: Mapping[str, Any] | StrategyConfig) -> bool:
    if isinstance(strategy, StrategyConfig):
        return True
    try:
        as_config(strategy)
    except (ValueError, TypeError):
        return False
    return True


def strategy_kind(strategy: Mapping[str, Any] | StrategyConfig) -> str:
    """The registry name ("d3", "full", ...) of a strategy config or its dict form."""
    if isinstance(strategy, StrategyConfig):
        return strategy.name
    return str(strategy.get("strategy", "?"))


# -- layers: core vs flex --------------------------------------------------------------------
def display_core(strategy: StrategyConfig, num_layers: int) -> tuple[int, int]:
    """The (head, tail) core split to draw over a strategy's layers: D3's own; (0, 0) for a strategy that has no core
    (early exit, SkipDecode, Unified, full depth), over whose skipped cells a band saying "always run" would be false."""
    core = getattr(strategy, "core", None)
    return core(num_layers) if callable(core) else (0, 0)


def drawn_core(trace: Any) -> tuple[int, int]:
    """The core split to draw over a run's layers (`display_core` of the trace's strategy): its recorded `core`
    where the strategy has one (D3), else (0, 0)."""
    return tuple(trace.core) if strategy_kind(trace.strategy) == "d3" else (0, 0)


def decode_plan(strategy: StrategyConfig, num_layers: int) -> LayerPlan:
    """The plan of a token past the first (step 0 comes out of the full-depth prefill for every
    strategy), e.g. to ask whether a strategy decides its depth while decoding (`dynamic`)."""
    return plan(strategy, num_layers, 1)


def layer_kinds(num_layers: int, core: tuple[int, int]) -> list[str]:
    """"core" or "flex" per layer: the first `head` and last `tail` layers are core."""
    head, tail = core
    return ["core" if layer < head or layer >= num_layers - tail else "flex" for layer in range(num_layers)]


def core_shapes(num_layers: int, core: tuple[int, int], *, axis: str = "x", xref: str = "x",
                yref: str = "y", strip: bool = False) -> list[dict[str, Any]]:
    """Layout shapes marking the core bands: a translucent band over each core block and a line at
    each core/flex boundary. `axis` is the axis that carries layer indices ("x" or "y"); the other
    axis spans its whole domain. `strip` adds a solid core/flex ribbon just above the plot, for
    heatmaps that would hide the translucent bands."""
    head, tail = core
    bands = [(-0.5, head - 0.5)] if head > 0 else []
    if tail > 0:
        bands.append((num_layers - tail - 0.5, num_layers - 0.5))
    boundaries = sorted({edge for lo, hi in bands for edge in (lo, hi) if -0.5 < edge < num_layers - 0.5})
    shapes = []
    for lo, hi in bands:
        shapes.append(_span("rect", axis, lo, hi, xref, yref, fillcolor=CORE_FILL, line=dict(width=0), layer="below"))
    for edge in boundaries:
        shapes.append(_span("line", axis, edge, edge, xref, yref, line=dict(color=CORE_LINE, width=2, dash="dot")))
    if strip and axis == "x":
        ribbon = dict(type="rect", xref=xref, yref=f"{yref} domain", y0=1.01, y1=1.035, line=dict(width=0))
        shapes.append(dict(ribbon, x0=-0.5, x1=num_layers - 0.5, fillcolor=FLEX_COLOR))
        shapes += [dict(ribbon, x0=lo, x1=hi, fillcolor=CORE_LINE) for lo, hi in bands]
    return shapes


def _span(kind: str, axis: str, lo: float, hi: float, xref: str, yref: str, **style: Any) -> dict[str, Any]:
    """A rect/line from lo to hi along `axis`, across the full domain of the other axis."""
    if axis == "x":
        return dict(type=kind, xref=xref, yref=f"{yref} domain", x0=lo, x1=hi, y0=0, y1=1, **style)
    return dict(type=kind, xref=f"{xref} domain", yref=yref, y0=lo, y1=hi, x0=0, x1=1, **style)


def guide_line(*, x: float | None = None, y: float | None = None, xref: str = "x", yref: str = "y",
               color: str = "#6B7280", dash: str = "dash", width: float = 1.5) -> dict[str, Any]:
    """A vertical (x given) or horizontal (y given) reference line across the subplot, as a shape.
    Shapes are much cheaper than `add_vline`, which matters for figures redrawn on every slider move."""
    line = dict(color=color, dash=dash, width=width)
    if x is not None:
        return dict(type="line", xref=xref, yref=f"{yref} domain", x0=x, x1=x, y0=0, y1=1, line=line)
    return dict(type="line", xref=f"{xref} domain", yref=yref, x0=0, x1=1, y0=y, y1=y, line=line)


def core_legend_entry(*, showlegend: bool = True) -> go.Scatter:
    """An invisible trace that puts "core layers" with its band colour into the legend."""
    return go.Scatter(x=[None], y=[None], mode="markers", name="core layers (always run)", showlegend=showlegend,
                      legendrank=2000,
                      marker=dict(symbol="square", size=14, color=CORE_FILL, line=dict(color=CORE_LINE, width=2)),
                      hoverinfo="skip", meta={"role": "core-legend"})


def axis_ref(index: int) -> tuple[str, str]:
    """("x", "y") for the first subplot, ("x2", "y2") for the second, and so on."""
    suffix = "" if index <= 1 else str(index)
    return f"x{suffix}", f"y{suffix}"


def panels(count: int, *, titles: Sequence[str] | None = None, spacing: float = 0.04) -> dict[str, Any]:
    """Layout for `count` side-by-side panels (xaxis/yaxis, xaxis2/yaxis2, ...) with titles above them:
    a plain dict, so a builder fills in the axes and makes the figure in one call (`make_subplots`
    plus per-panel updates costs tens of ms, too slow for slider moves)."""
    width = (1 - spacing * (count - 1)) / count
    layout: dict[str, Any] = {"annotations": []}
    for i in range(count):
        x0 = i * (width + spacing)
        xref, yref = axis_ref(i + 1)
        layout["xaxis" + xref[1:]] = dict(domain=[x0, x0 + width], anchor=yref)
        layout["yaxis" + yref[1:]] = dict(anchor=xref)
        if titles:
            layout["annotations"].append(dict(text=titles[i], x=x0 + width / 2, xref="paper", xanchor="center", y=1,
                                              yref="paper", yanchor="bottom", showarrow=False, yshift=4))
    return layout


def tick_subset(n: int, max_ticks: int) -> np.ndarray:
    """Evenly spaced indices in [0, n) to label when there are too many to label them all."""
    if n <= max_ticks:
        return np.arange(n)
    stride = int(np.ceil(n / max_ticks))
    return np.arange(0, n, stride)


def nanmean_count(values: np.ndarray, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(mean over finite entries, count of finite entries) along `axis`; NaN mean where count is 0,
    without numpy's "mean of empty slice" warning."""
    values = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(values)
    count = finite.sum(axis=axis)
    total = np.where(finite, values, 0.0).sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    return mean, count


def fmt(value: float | None, digits: int = 3) -> str:
    """A number for hover text: "—" for missing, compact otherwise."""
    if value is None or not np.isfinite(value):
        return "—"
    return f"{value:.{digits}g}"


def cell_names() -> list[str]:
    """Names of the cell states in code order, for legends and colour bars."""
    return [CELL_NAMES[code] for code in CELL_CODES]
