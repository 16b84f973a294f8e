"""The page's layout: the Live tab (prompt, scenarios, controls, the two panes, the views) and the Sweep tab.
Components go into one dict by name, the names the handlers' inputs and outputs use."""

from __future__ import annotations

from typing import Any, Callable

import gradio as gr
import pandas as pd

from d3.config import DROP_ORDERS, FILLS, default_core
from d3.data import example_prompts
from d3.models import ModelFacts
from d3.sweep import BUILTIN_PROMPTS
from explorer.controls import DECODINGS, DEFAULTS, STRATEGY_LABELS, default_attention_layer
from explorer.export import FIGURES
from explorer.pool import ModelPool
from explorer.scenarios import SCENARIOS
from explorer.session import HISTORY_COLUMNS
from explorer.sweep_tab import (
    SWEEP_DEFAULT,
    SWEEP_MAX_NEW_TOKENS,
    SWEEP_MENU,
    SWEEP_MIN_NEW_TOKENS,
    SWEEP_TABLE_COLUMNS,
    sweep_bounds_text,
)
from explorer.views import caps_html, status_html
from explorer.wording import EXPLAIN, INTRO, SWEEP_EXPLAIN, VIEWS


def _controls(pool: ModelPool, facts: ModelFacts, ui: dict[str, Any]) -> None:
    """The run controls: strategy, schedule, decoding, and the baselines' own settings."""
    caps, layers = pool.caps, facts.num_layers
    head, tail = default_core(layers)
    with gr.Row():
        ui["strategy"] = gr.Dropdown([(label, key) for key, label in STRATEGY_LABELS.items()], value=DEFAULTS.strategy,
                                     label="Strategy (against full depth)")
        ui["fill"] = gr.Dropdown(list(FILLS), value=DEFAULTS.fill, label="Fill for skipped layers' KV",
                                 info="copy · propagate · none (masked hole)")
        ui["drop_order"] = gr.Dropdown(list(DROP_ORDERS), value=DEFAULTS.drop_order, label="Drop order of flex layers",
                                       info="strided is not nested: filling matters")
        ui["decoding"] = gr.Radio(list(DECODINGS), value=DEFAULTS.decoding, label="Decoding")
    with gr.Row():
        ui["alpha"] = gr.Slider(0.8, 1.0, value=DEFAULTS.alpha, step=0.001, label="α (decay per token)",
                                info="token i runs floor(L·α^i) layers", elem_id="alpha")
        ui["core_head"] = gr.Slider(0, layers, value=head, step=1, label="Core head (first layers, always run)")
        ui["core_tail"] = gr.Slider(0, layers, value=tail, step=1, label="Core tail (last layers, always run)")
        ui["start"] = gr.Slider(0, caps.max_new_tokens, value=DEFAULTS.start, step=1, label="Start (tokens at full depth)")
    with gr.Row():
        ui["max_new_tokens"] = gr.Number(min(DEFAULTS.max_new_tokens, caps.max_new_tokens), label=f"Max new tokens (1–{caps.max_new_tokens})",
                                         elem_id="max-new-tokens")
        ui["temperature"] = gr.Slider(0.05, 2.0, value=DEFAULTS.temperature, step=0.05, label="Temperature (sampling only)")
        ui["seed"] = gr.Number(DEFAULTS.seed, label="Seed (sampling only)")
        ui["attention_layer"] = gr.Slider(0, layers - 1, value=default_attention_layer(layers), step=1,
                                          label="Attention layer to record (before generating)")
    with gr.Accordion("Baselines' settings", open=False):
        with gr.Row():
            ui["unified_ratio"] = gr.Number(DEFAULTS.unified_ratio, label="Unified skipping: target speedup r (keeps floor(L/r) layers)")
            ui["skipdecode_max"] = gr.Number(DEFAULTS.skipdecode_max, label="SkipDecode: max layers (0 = auto)")
            ui["skipdecode_min"] = gr.Number(DEFAULTS.skipdecode_min, label="SkipDecode: min layers (0 = auto)")
            ui["threshold"] = gr.Number(DEFAULTS.threshold, label="Early exit: confidence threshold (0, 1]")


def _panes(ui: dict[str, Any]) -> None:
    with gr.Row(equal_height=False):
        with gr.Column(elem_classes=["d3-pane"]):
            ui["d3_title"] = gr.Markdown("### D3", elem_id="d3-title")
            ui["d3_tokens"] = gr.HTML(elem_classes=["d3-pane-tokens"], elem_id="d3-pane")
            ui["d3_counters"] = gr.HTML(elem_id="d3-counters")
        with gr.Column(elem_classes=["d3-pane"]):
            gr.Markdown("### Full depth (every layer, the reference)")
            ui["full_tokens"] = gr.HTML(elem_classes=["d3-pane-tokens"], elem_id="full-pane")
            ui["full_counters"] = gr.HTML(elem_id="full-counters")


def _view_tab(key: str, ui: dict[str, Any], extra: Callable[[], None] | None = None) -> None:
    with gr.Tab(VIEWS[key], id=key):
        with gr.Row():
            with gr.Column(scale=3):
                if extra is not None:
                    extra()
                ui[key] = gr.Plot(show_label=False, elem_id=f"plot-{key}")
            with gr.Column(scale=1, min_width=240, elem_classes=["d3-explain"]) as column:
                gr.Markdown(EXPLAIN[key])
        ui[f"explain_{key}"] = column


def _tabs(pool: ModelPool, facts: ModelFacts, ui: dict[str, Any]) -> None:
    def flow_extra() -> None:
        ui["metric"] = gr.Radio([("both", "both"), ("1 − cosine", "cos"), ("relative distance", "dist")],
                                value=DEFAULTS.metric, label="Measure of change")

    def attention_extra() -> None:
        ui["attention_head"] = gr.Slider(0, max(facts.num_heads - 1, 0), value=DEFAULTS.attention_head, step=1, label="Head")

    def errors_extra() -> None:
        ui["log_kl"] = gr.Checkbox(DEFAULTS.log_kl, label="Log scale for KL")

    def fills_extra() -> None:
        ui["fills_button"] = gr.Button("Compare fills (copy · propagate · none)", elem_id="fills-button")

    with gr.Tabs():
        _view_tab("usage", ui)
        _view_tab("decay", ui)
        _view_tab("planned", ui)
        _view_tab("flow", ui, flow_extra)
        _view_tab("attention", ui, attention_extra)
        _view_tab("errors", ui, errors_extra)
        _view_tab("fills", ui, fills_extra)
        with gr.Tab("Run history", id="history"):
            gr.Markdown("Every run of this session: compare scenarios here (only you see your runs).")
            ui["history"] = gr.Dataframe(pd.DataFrame(columns=HISTORY_COLUMNS), interactive=False)
        with gr.Tab("Export", id="export"):
            with gr.Row():
                ui["export_trace"] = gr.Button("Download traces (JSON + CSV)")
                ui["figure"] = gr.Dropdown([(VIEWS[k], k) for k in FIGURES], value="usage",
                                           label="Figure to export")
                ui["export_figure"] = gr.Button("Download figure (standalone HTML)")
            ui["files"] = gr.File(label="Files", file_count="multiple", interactive=False)


def _sweep_tab(pool: ModelPool, ui: dict[str, Any]) -> None:
    with gr.Tab("Sweep", id="sweep"):
        gr.Markdown(SWEEP_EXPLAIN)
        gr.Markdown(f"*{sweep_bounds_text()}*")
        with gr.Row():
            with gr.Column(scale=3):
                ui["sweep_prompts"] = gr.Textbox(BUILTIN_PROMPTS[0], lines=2, max_lines=6,
                                                 label="Prompts (one per line, at most 2)")
                ui["sweep_settings"] = gr.CheckboxGroup([(c.label, k) for k, c in SWEEP_MENU.items()],
                                                        value=list(SWEEP_DEFAULT), label="Settings (at most 4)")
            with gr.Column(scale=1, min_width=220):
                top = min(SWEEP_MAX_NEW_TOKENS, max(pool.caps.max_new_tokens, SWEEP_MIN_NEW_TOKENS))
                ui["sweep_tokens"] = gr.Slider(SWEEP_MIN_NEW_TOKENS, top, value=min(16, top), step=1,
                                               label=f"New tokens per run (at most {top})", elem_id="sweep-tokens")
                ui["sweep_run"] = gr.Button("Run sweep", variant="primary", elem_id="sweep-run")
                ui["sweep_export"] = gr.Button("Download results (CSV)")
        ui["sweep_note"] = gr.Markdown(elem_id="sweep-note")
        ui["sweep_pareto"] = gr.Plot(show_label=False, elem_id="plot-sweep")
        # written by assets/sweep_click.js when a point of the Pareto view is clicked
        ui["sweep_point"] = gr.Textbox(visible="hidden", elem_id="sweep-point", show_label=False)
        ui["sweep_table"] = gr.Dataframe(pd.DataFrame(columns=SWEEP_TABLE_COLUMNS), interactive=False,
                                         label="Results (click a row, or a point above, to load it into the controls)")
        ui["sweep_file"] = gr.File(label="Sweep CSV", interactive=False)


def _header(pool: ModelPool, facts: ModelFacts, ui: dict[str, Any]) -> None:
    prompts = example_prompts()
    with gr.Row():
        with gr.Column(scale=3):
            ui["prompt"] = gr.Textbox(prompts[0].prompt, label="Prompt", lines=3, max_lines=12,
                                      elem_id="prompt")
            with gr.Row():
                ui["example"] = gr.Dropdown([p.title for p in prompts], value=prompts[0].title,
                                            label="Example prompts")
                ui["model"] = gr.Dropdown(list(pool.names), value=pool.names[0], label="Model",
                                          allow_custom_value=not pool.public)
                ui["chat_template"] = gr.Checkbox(facts.chat_template, label="Chat template (instruct models)")
        with gr.Column(scale=1, min_width=220):
            ui["generate"] = gr.Button("Generate", variant="primary", elem_id="generate")
            ui["stop"] = gr.Button("Stop", variant="stop", elem_id="stop")
            ui["presentation"] = gr.Checkbox(DEFAULTS.presentation, label="Presentation mode (big fonts, one view per tab)")
            gr.HTML(caps_html(pool.caps.describe(), pool.public))
    gr.Markdown("**Scenarios**: one click sets the controls and runs.")
    with gr.Row():
        for key, scenario in SCENARIOS.items():
            ui[f"scenario_{key}"] = gr.Button(scenario.title, size="sm", elem_id=f"scenario-{key}")
    ui["scenario_text"] = gr.Markdown()


def build_layout(pool: ModelPool, facts: ModelFacts) -> dict[str, Any]:
    ui: dict[str, Any] = {"session": gr.State(None, time_to_live=pool.caps.session_ttl_s),
                          "sweep_results": gr.State(None, time_to_live=pool.caps.session_ttl_s)}
    with gr.Column(elem_classes=["d3-root"]) as root:
        ui["root"] = root
        gr.Markdown("# D3 Explorer: depth decay decoding, live")
        gr.Markdown(INTRO)
        with gr.Tabs(elem_id="modes") as ui["modes"]:
            with gr.Tab("Live: D3 vs full depth", id="live"):
                _header(pool, facts, ui)
                with gr.Accordion("Controls", open=True):
                    _controls(pool, facts, ui)
                ui["status"] = gr.HTML(status_html(None, None, "Ready: press Generate."), elem_id="status")
                _panes(ui)
                _tabs(pool, facts, ui)
            _sweep_tab(pool, ui)
    return ui
