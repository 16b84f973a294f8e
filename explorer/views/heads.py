"""Attention overview: where D3 changes attention, one cell per layer and head (viz/attention_overview.py); a click on
a cell opens that head in the per-head view (explorer/views/attention.py)."""

from __future__ import annotations

from typing import Any

import gradio as gr

from explorer.controls import CONTROL_NAMES, takes_controls
from explorer.session import Session
from explorer.ui import ordered, user_errors
from explorer.views import Page, Shown, View, attention_view, waiting
from viz.attention_overview import divergence_overview

EXPLAIN = """**Where D3 changes attention**, every layer (across) and head (down) at once: each cell is the
Jensen-Shannon divergence, in bits, between the attention D3 gave and the attention full depth gave, averaged over the
tokens both runs read alike (up to the first divergence; after it the two runs read different texts). 0: the head
looks exactly where full depth's looks; 1: at keys full depth's never looks at. Grey: D3 skipped that layer on every
such token (or it was not recorded: a long prompt records only the layer chosen under *More controls*).

**Click a cell** to open that layer and head in *Attention: full depth vs D3*.

**What to look for:** the core layers at both ends stay pale until skipped layers below them change their input;
a dark column is a layer whose every head reads differently."""

CELL_OUTPUTS = ("attention_layer", "attention_head", "view_tabs", "attention")


def draw(shown: Shown, options) -> object:
    p = options.presentation
    if shown.d3 is None or shown.full is None or not shown.d3.steps:
        return waiting("Press Generate: every layer's and head's attention, D3 against full depth.", presentation=p)
    return divergence_overview(shown.d3, shown.full, presentation=p)


def controls(ui: dict, facts) -> None:
    # Written by assets/plot_click.js when a cell is clicked ("layer,head@stamp"): gr.Plot has no click event.
    ui["heads_cell"] = gr.Textbox(visible="hidden", elem_id="heads-cell", show_label=False)


def cell_of(value: Any) -> tuple[int, int]:
    """(layer, head) of a clicked cell's value "layer,head@stamp"; ValueError with a plain message otherwise."""
    text = str(value or "").partition("@")[0]
    try:
        layer, head = (int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"heads_cell={value!r} is not allowed: heads_cell must be 'layer,head'") from None
    return layer, head


@takes_controls
def open_head(session: Session | None, heads_cell: str, controls) -> tuple[Any, ...]:
    """A clicked cell of the overview: the per-head view set to its layer and head, opened."""
    s = session or Session()
    with user_errors():
        layer, head = cell_of(heads_cell)
        if s.d3 is not None:
            s.opened("attention")  # its tab opens now: drawn here, not again as stale
        figure = attention_view(s.d3, s.full, layer, head, presentation=controls.view.presentation)
    return ordered(CELL_OUTPUTS, attention_layer=layer, attention_head=head, view_tabs=gr.Tabs(selected="attention"),
                   attention=figure)


def wire(pool: Any, ui: dict[str, Any], page: Page) -> None:
    ui["heads_cell"].change(open_head, [ui["session"], ui["heads_cell"], *(ui[n] for n in CONTROL_NAMES)],
                            [ui[n] for n in CELL_OUTPUTS], api_name="open_head", queue=False, show_progress="hidden")


VIEW = View("heads", "Attention overview", EXPLAIN, needs="a run (every layer's attention is recorded)",
            position=45, draw=draw, after_run=True, controls=controls, wire=wire)
