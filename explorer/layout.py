"""The page's layout: the Live tab (prompt, scenarios, controls, the two panes, the views) and the Sweep tab.
Components go into one dict by name, the names the handlers' inputs and outputs use."""

from __future__ import annotations

from typing import Any

import gradio as gr
import pandas as pd

from d3.config import DROP_ORDERS, FILLS, default_core, max_core_side
from d3.models import ModelFacts
from d3.research.data import example_prompts
from explorer import views
from explorer.controls import (
    ALPHA_STEP,
    CONTROLS,
    DECODINGS,
    DEFAULTS,
    GROWN,
    HELP,
    LABELS,
    OWN_FILL,
    PAGE_RANGES,
    STRATEGY_LABELS,
    default_attention_layer,
    model_defaults,
)
from explorer.export import figures
from explorer.pool import ModelPool
from explorer.scenarios import offered
from explorer.session import HISTORY_COLUMNS
from explorer.share import share_box
from explorer.sweep_tab import (
    SWEEP_DEFAULT,
    SWEEP_DEFAULT_TOKENS,
    SWEEP_MAX_NEW_TOKENS,
    SWEEP_MAX_PROMPTS,
    SWEEP_MAX_SETTINGS,
    SWEEP_MENU,
    SWEEP_MIN_NEW_TOKENS,
    SWEEP_PROMPT,
    SWEEP_TABLE_COLUMNS,
    sweep_bounds_text,
)
from explorer.ui import slider_range
from explorer.view_handlers import prompt_titles
from explorer.views import caps_html, decay, status_html, usage
from explorer.wording import INTRO, SWEEP_EXPLAIN


def _key_controls(pool: ModelPool, facts: ModelFacts, ui: dict[str, Any]) -> None:
    """The controls a lesson turns most: α, the core split and the length, beside the prompt."""
    layers = facts.num_layers
    head, tail = default_core(layers)
    alpha = CONTROLS["alpha"]
    ui["alpha"] = gr.Slider(*PAGE_RANGES["alpha"], value=model_defaults(pool.names[0]).alpha, step=ALPHA_STEP,
                            label=alpha.label, info=alpha.help, elem_id=alpha.elem_id)
    with gr.Row(elem_id="core-row"):
        # head + tail stays below L: each slider's maximum follows the other (wiring.bound_core)
        for name, other in (("core_head", tail), ("core_tail", head)):
            side = CONTROLS[name]
            ui[name] = gr.Slider(0, value=head if name == "core_head" else tail, step=1, label=side.label,
                                 elem_id=side.elem_id, info=side.help, min_width=120,
                                 **slider_range(max_core_side(other, layers)))
    ui["max_new_tokens"] = gr.Number(min(model_defaults(pool.names[0]).max_new_tokens, pool.caps.max_new_tokens), precision=0,
                                     label=LABELS["max_new_tokens"], elem_id="max-new-tokens",
                                     info=f"{HELP['max_new_tokens']} (1–{pool.caps.max_new_tokens} here)")


def _more_controls(pool: ModelPool, facts: ModelFacts, ui: dict[str, Any]) -> None:
    """Everything else: strategy, fill, order, decoding, the baselines' own settings and the server's limits."""
    caps, layers = pool.caps, facts.num_layers
    ui["strategy"] = gr.Dropdown([(label, key) for key, label in STRATEGY_LABELS.items()], value=DEFAULTS.strategy,
                                 label="Strategy (against full depth)")
    with gr.Row():
        ui["drop_order"] = gr.Dropdown(list(DROP_ORDERS), value=model_defaults(pool.names[0]).drop_order, label=LABELS["drop_order"],
                                       info=HELP["drop_order"] + ". calibrated: measured on this model (the default; docs/drop_order.md). middle_out, the paper's literal "
                                       "reading, keeps 22.7% of SmolLM2's arithmetic at 29 layers (calibrated 75-79%, full 83%); "
                                       "strided is not nested: filling matters", min_width=140)
        ui["fill"] = gr.Dropdown([("the strategy's own", OWN_FILL), *((f, f) for f in FILLS)], value=DEFAULTS.fill,
                                 label=LABELS["fill"],
                                 info=HELP["fill"], min_width=140)
    order = CONTROLS["layer_order"]
    ui["layer_order"] = gr.Textbox(model_defaults(pool.names[0]).layer_order, label=order.label, info=order.help,
                                   elem_id=order.elem_id, max_lines=2,
                                   placeholder="e.g. 3, 4, 17, … (Which layers matter → Use this order)")
    ui["start"] = gr.Slider(0, caps.max_new_tokens, value=DEFAULTS.start, step=1, label=LABELS["start"], info=HELP["start"],
                            elem_id="start")
    ui["attention_layer"] = gr.Slider(0, value=default_attention_layer(layers, pool.names[0]), step=1,
                                      label=LABELS["attention_layer"],
                                      info="the layer whose attention a run records (set before generating)", **slider_range(layers - 1))
    with gr.Row():
        ui["decoding"] = gr.Radio(list(DECODINGS), value=DEFAULTS.decoding, label="Decoding", min_width=140)
        ui["chat_template"] = gr.Checkbox(facts.chat_template, label="Chat template (instruct models)", min_width=140)
    with gr.Row():
        ui["temperature"] = gr.Slider(*PAGE_RANGES["temperature"], value=DEFAULTS.temperature, step=0.05,
                                      label=LABELS["temperature"], info=HELP["temperature"] + " (sampling only)",
                                      min_width=140)
        ui["seed"] = gr.Number(DEFAULTS.seed, label=LABELS["seed"], info=HELP["seed"] + " (sampling only)",
                               min_width=100)
    _box(ui, "unified_ratio")
    with gr.Row():
        _box(ui, "skipdecode_max", " (0 = auto)", min_width=120)
        _box(ui, "skipdecode_min", " (0 = auto)", min_width=120)
    _box(ui, "threshold")
    for name in GROWN:  # a field added to D3's registry: a box of its own, from the control table
        _box(ui, name)
    gr.HTML(caps_html(pool.caps.describe(), pool.public))


def _box(ui: dict[str, Any], name: str, info: str = "", **kwargs: Any) -> None:
    """A control of the table as a plain box (a number, or a menu of its choices): its label, help and default."""
    c = CONTROLS[name]
    value = getattr(DEFAULTS, name)
    if c.param.choices:
        ui[name] = gr.Dropdown(list(c.param.choices), value=value, label=c.label, info=c.help + info,
                               elem_id=c.elem_id or None, **kwargs)
    else:
        ui[name] = gr.Number(value, label=c.label, info=c.help + info, elem_id=c.elem_id or None, **kwargs)


def _panes(ui: dict[str, Any]) -> None:
    with gr.Row(equal_height=False, elem_classes=["d3-panes"]):
        with gr.Column(elem_classes=["d3-pane"], min_width=260):
            ui["d3_title"] = gr.Markdown("### D3", elem_id="d3-title")
            ui["d3_tokens"] = gr.HTML(elem_classes=["d3-pane-tokens"], elem_id="d3-pane")
            ui["d3_counters"] = gr.HTML(elem_id="d3-counters")
        with gr.Column(elem_classes=["d3-pane"], min_width=260):
            gr.Markdown("### Full depth (every layer)", elem_id="full-title")
            ui["full_tokens"] = gr.HTML(elem_classes=["d3-pane-tokens"], elem_id="full-pane")
            ui["full_counters"] = gr.HTML(elem_id="full-counters")


def _view_tab(view: views.View, ui: dict[str, Any], facts: ModelFacts) -> None:
    """A view's tab: its own components above its plot (or its plots, `plot=False`), its empty state in the plot,
    and its explanation in a column on the right."""
    with gr.Tab(view.title, id=view.key) as ui[f"tab_{view.key}"]:
        with gr.Row():
            with gr.Column(scale=3):
                if view.controls is not None:
                    view.controls(ui, facts)
                if view.plot:
                    empty = views.empty(view.key) if view.empty is not None or view.draw is not None else None
                    ui[view.key] = gr.Plot(empty, show_label=False, elem_id=f"plot-{view.key}")
            with gr.Column(scale=1, min_width=240, elem_classes=["d3-explain"]) as column:
                gr.Markdown(view.explain)
        ui[f"explain_{view.key}"] = column


def _tabs(pool: ModelPool, facts: ModelFacts, ui: dict[str, Any]) -> None:
    with gr.Tabs(elem_id="views") as ui["view_tabs"]:
        for view in views.registry():
            if view.tab:
                _view_tab(view, ui, facts)
        with gr.Tab("Run history", id="history"):
            gr.Markdown("Every run of this session: compare scenarios here (only you see your runs).")
            # Wrapped, in the box's width (assets/style.css): a row is read whole, never scrolled sideways.
            ui["history"] = gr.Dataframe(pd.DataFrame(columns=HISTORY_COLUMNS), interactive=False, wrap=True,
                                         elem_id="history", elem_classes=["d3-history"])
        with gr.Tab("Export", id="export"):
            with gr.Row():
                ui["export_trace"] = gr.Button("Download traces (JSON + CSV)")
                ui["figure"] = gr.Dropdown([(views.titles()[k], k) for k in figures()], value=usage.KEY,
                                           label="Figure to export")
                ui["export_figure"] = gr.Button("Download figure (HTML + plotly.min.js: keep both in one folder)")
            ui["files"] = gr.File(label="Files", file_count="multiple", interactive=False)


def _sweep_tab(pool: ModelPool, ui: dict[str, Any]) -> None:
    with gr.Tab("Sweep", id="sweep"):
        gr.Markdown(SWEEP_EXPLAIN)
        gr.Markdown(f"*{sweep_bounds_text()}*")
        with gr.Row():
            with gr.Column(scale=3):
                ui["sweep_prompts"] = gr.Textbox(
                    SWEEP_PROMPT, lines=2, max_lines=6,
                    label=f"{LABELS['sweep_prompts']} (one per line, at most {SWEEP_MAX_PROMPTS})")
                ui["sweep_settings"] = gr.CheckboxGroup(
                    [(c.label, k) for k, c in SWEEP_MENU.items()], value=list(SWEEP_DEFAULT),
                    label=f"{LABELS['sweep_settings']} (at most {SWEEP_MAX_SETTINGS})")
            with gr.Column(scale=1, min_width=220):
                top = min(SWEEP_MAX_NEW_TOKENS, max(pool.caps.max_new_tokens, SWEEP_MIN_NEW_TOKENS))
                ui["sweep_tokens"] = gr.Slider(SWEEP_MIN_NEW_TOKENS, top, value=min(SWEEP_DEFAULT_TOKENS, top), step=1,
                                               label=f"{LABELS['sweep_tokens']} (at most {top})", elem_id="sweep-tokens")
                ui["sweep_run"] = gr.Button("Run sweep", variant="primary", elem_id="sweep-run")
                ui["sweep_export"] = gr.Button("Download results (CSV)")
        ui["sweep_note"] = gr.Markdown(elem_id="sweep-note")
        ui["sweep_pareto"] = gr.Plot(show_label=False, elem_id="plot-sweep")
        # written by assets/plot_click.js when a point of the Pareto view is clicked
        ui["sweep_point"] = gr.Textbox(visible="hidden", elem_id="sweep-point", show_label=False)
        ui["sweep_table"] = gr.Dataframe(pd.DataFrame(columns=SWEEP_TABLE_COLUMNS), interactive=False,
                                         label="Results (click a row, or a point above, to load it into the controls)")
        ui["sweep_file"] = gr.File(label="Sweep CSV", interactive=False)


def _prompt_and_run(pool: ModelPool, ui: dict[str, Any]) -> None:
    """Prompt, example and model pickers, Generate and Stop, then the one-click scenarios."""
    prompts = example_prompts()
    ui["prompt"] = gr.Textbox(prompts[0].prompt, label="Prompt", lines=2, max_lines=10, elem_id="prompt")
    with gr.Row(elem_id="model-row"):  # the model's name is longer than an example's title: it gets more room
        ui["example"] = gr.Dropdown(list(prompt_titles()), value=prompts[0].title, label="Example prompt",
                                    min_width=110, scale=4, elem_id="example")
        ui["model"] = gr.Dropdown(list(pool.names), value=pool.names[0], label="Model", min_width=130, scale=5,
                                  elem_id="model", allow_custom_value=not pool.public)
    with gr.Row(elem_id="run-row"):
        ui["generate"] = gr.Button("Generate", variant="primary", elem_id="generate", min_width=100)
        ui["stop"] = gr.Button("Stop", variant="stop", elem_id="stop", min_width=80)
    with gr.Group(elem_classes=["d3-scenarios"]):
        gr.Markdown("**Scenarios**: one click sets the controls and runs.")
        with gr.Row():
            for key, scenario in offered(pool.names).items():
                ui[f"scenario_{key}"] = gr.Button(scenario.title, size="sm", variant="secondary",
                                                  elem_id=f"scenario-{key}", min_width=120)
    ui["scenario_text"] = gr.Markdown(elem_id="scenario-text", elem_classes=["d3-scenario-text"])


def _live_tab(pool: ModelPool, facts: ModelFacts, ui: dict[str, Any]) -> None:
    """Controls on the left; on the right, what a run shows first: the status, both panes and the decay curve
    (on one 1280x800 screen), then the other views."""
    # On a phone the two columns stack: the prompt and Generate, then the results, then the other controls
    # (assets/style.css reorders them), so that a run is seen without scrolling past every control.
    with gr.Row(equal_height=False, elem_classes=["d3-live"]):
        with gr.Column(scale=1, min_width=300, elem_classes=["d3-side"]):
            with gr.Accordion("What is D3? (read me first)", open=False, elem_id="intro"):
                gr.Markdown(INTRO)
            _prompt_and_run(pool, ui)
            _key_controls(pool, facts, ui)
            share_box(ui)
            with gr.Accordion("More controls", open=False, elem_id="more-controls"):
                _more_controls(pool, facts, ui)
        with gr.Column(scale=3, min_width=320, elem_classes=["d3-main"]):
            ui["status"] = gr.HTML(status_html(None, None, "Ready: press Generate."), elem_id="status")
            ui["run_state"] = gr.HTML(visible="hidden", elem_id="run-state")  # holds runs' progress and error badges
            # what let go of a slider (a pointer, or a box left): written by the release's js (wiring.RELEASE_JS)
            ui["release_how"] = gr.Textbox(visible="hidden", elem_id="release-how", show_label=False)
            # A scenario's findings (each run's numbers and text) under the status line, where the class looks.
            ui["scenario_finding"] = gr.Markdown(elem_id="scenario-finding", elem_classes=["d3-finding"])
            _panes(ui)
            ui[decay.KEY] = gr.Plot(show_label=False, elem_id="plot-decay")
            with gr.Accordion("How to read the decay curve", open=False) as ui["explain_decay"]:
                gr.Markdown(decay.VIEW.explain)
            _tabs(pool, facts, ui)


def build_layout(pool: ModelPool, facts: ModelFacts) -> dict[str, Any]:
    ui: dict[str, Any] = {"session": gr.State(None, time_to_live=pool.caps.session_ttl_s),
                          "sweep_results": gr.State(None, time_to_live=pool.caps.session_ttl_s)}
    with gr.Column(elem_classes=["d3-root"]) as root:
        ui["root"] = root
        with gr.Row(elem_classes=["d3-title"], equal_height=True):
            gr.Markdown("# D3 Explorer: depth decay decoding, live")
            ui["presentation"] = gr.Checkbox(DEFAULTS.presentation, label="Presentation mode (big fonts)",
                                             elem_id="presentation", scale=0, min_width=200, container=False)
        with gr.Tabs(elem_id="modes") as ui["modes"]:
            with gr.Tab("Live: D3 vs full depth", id="live"):
                _live_tab(pool, facts, ui)
            _sweep_tab(pool, ui)
    return ui
