"""Figures for D3 Explorer: pure functions, a Trace (or Comparison, or DataFrame) in, a plotly Figure out.

Imports neither torch, transformers nor gradio, so every view can be rebuilt from a saved trace.
"""

from viz.attention import attention_map
from viz.depth import decay_curve, layers_vs_step
from viz.errors import error_propagation, fill_strategies
from viz.flow import block_change, sublayer_flow
from viz.grid import fig1_panels, layer_grid, planned_grid_figure
from viz.layout import apply_layout, readable_token, to_html
from viz.results import pareto, pareto_front, task_accuracy_delta
from viz.stream import counters_html, step_rate, token_html

__all__ = [
    "apply_layout", "attention_map", "block_change", "counters_html", "decay_curve", "error_propagation",
    "fig1_panels", "fill_strategies", "layer_grid", "layers_vs_step", "pareto", "pareto_front",
    "planned_grid_figure", "readable_token", "step_rate", "sublayer_flow", "task_accuracy_delta", "to_html", "token_html",
]
