"""viz/: figure builders checked on the data they draw, from synthetic traces built off real schedules."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import viz
from d3.config import (
    D3Config,
    EarlyExitConfig,
    FullConfig,
    GenerationConfig,
    SkipDecodeConfig,
    StrategyConfig,
    UnifiedConfig,
)
from d3.schedule import budgets, d3_budget, planned_grid
from d3.trace import FILL_CODES, FILLED_COPY, HOLE, RAN, SKIPPED, Comparison, TokenStep, Trace
from tests.figures import message, title_text
from tests.traces import WORDS, make_trace  # noqa: F401
from viz.depth import decay_curve
from viz.layout import CELL_COLORS, plot_text, readable_token

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")  # e.g. numpy's "mean of empty slice"

def make_comparison(full: Trace, skip: Trace, *, seed: int = 0) -> Comparison:
    rng = np.random.default_rng(seed)
    n = min(len(full.steps), len(skip.steps))
    grid = skip.grid()[:n]
    return Comparison(
        full=full, skip=skip,
        agree=np.array([a.token_id == b.token_id for a, b in zip(full.steps, skip.steps)]),
        kl_teacher=rng.exponential(0.01, n), kl_free=rng.exponential(0.05, len(skip.steps)),
        kv_error=rng.uniform(1e-4, 0.5, (n, full.num_layers)), filled_mask=np.isin(grid, list(FILL_CODES.values())),
        teacher_grid=grid)


@pytest.fixture(scope="module")
def d3_cfg() -> D3Config:
    return D3Config(alpha=0.9, start=3, core_head=2, core_tail=2)


@pytest.fixture(scope="module")
def d3_trace(d3_cfg: D3Config) -> Trace:
    return make_trace(d3_cfg, attention_layers=(0, 5), seed=1)


@pytest.fixture(scope="module")
def full_trace() -> Trace:
    return make_trace(FullConfig(), attention_layers=(0, 5), seed=2)


def by_role(fig, role: str) -> list:
    return [t for t in fig.data if isinstance(t.meta, dict) and t.meta.get("role") == role]


def one(fig, role: str, **match):
    found = [t for t in by_role(fig, role) if all(t.meta.get(k) == v for k, v in match.items())]
    assert len(found) == 1, f"expected one {role} trace matching {match}, found {len(found)}"
    return found[0]


def assert_hover(trace) -> None:
    """Every data trace explains itself on hover: per-point text, or a template."""
    text = trace.text if trace.text is not None else ()
    assert len(np.ravel(np.asarray(text, dtype=object))) or trace.hovertemplate, f"no hover on {trace.name}"


# -- import hygiene --------------------------------------------------------------------------------
def test_import_viz_pulls_in_no_torch_transformers_or_gradio() -> None:
    code = ("import sys, viz; bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'gradio')];"
            " print(bad); sys.exit(1 if bad else 0)")
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert result.returncode == 0, result.stdout + result.stderr


# -- text helpers ----------------------------------------------------------------------------------
def test_readable_token_makes_whitespace_visible_and_plot_text_escapes() -> None:
    assert readable_token("\n") == "⏎"
    assert readable_token(" the") == "␣the"
    assert readable_token("") == "∅"
    assert readable_token("\x07") == "\u2407"
    assert plot_text(" <br>&") == "␣&lt;br&gt;&amp;"


# -- layer grid --------------------------------------------------------------------------------------
def test_layer_grid_draws_the_trace_grid_with_token_labels_and_core_bands(d3_trace: Trace) -> None:
    fig = viz.layer_grid(d3_trace)
    heat = one(fig, "grid")
    z = np.asarray(heat.z)
    assert z.shape == (len(d3_trace.steps), d3_trace.num_layers)
    np.testing.assert_array_equal(z, d3_trace.grid())
    ticks = list(fig.layout.yaxis.ticktext)
    assert ticks == [plot_text(s.text) for s in d3_trace.steps]
    assert "⏎" in ticks and "␣&lt;b&gt;mat&lt;/b&gt;" in ticks
    lines = sorted(s.x0 for s in fig.layout.shapes if s.type == "line")
    head, tail = d3_trace.core
    assert lines == [head - 0.5, d3_trace.num_layers - tail - 0.5]
    assert fig.layout.coloraxis.showscale is False  # the colours are named in the legend, which wraps on a phone
    keys = [t for t in fig.data if (t.meta or {}).get("role") == "cell-legend"]
    assert [t.name for t in keys] == ["skipped", "ran", "filled (copy)", "filled (propagate)", "hole (masked)"]
    assert [t.marker.color for t in keys] == [CELL_COLORS[t.meta["code"]] for t in keys]


def test_layer_grid_hover_explains_each_cell(d3_trace: Trace) -> None:
    hover = np.asarray(one(viz.layer_grid(d3_trace), "grid").text, dtype=object)
    assert hover.shape == (len(d3_trace.steps), d3_trace.num_layers)
    step = d3_trace.steps[-1]
    skipped = [layer for layer in range(d3_trace.num_layers) if layer not in step.layers_run]
    source = max(layer for layer in step.layers_run if layer < skipped[0])
    cell = hover[-1, skipped[0]]
    assert f"(step {step.step})" in cell and f"layer {skipped[0]} (flex)" in cell
    assert f"skipped: KV filled by copying layer {source}" in cell
    assert "layer 0 (core) · ran" in hover[-1, 0]


def test_cell_hover_names_the_copy_source_the_decoder_recorded() -> None:
    """The hover reads the recorded source and works nothing out: here layer 3 was (say, on Gemma 3, by type) copied
    from layer 0, not from layer 2, the nearest lower layer that ran; with no record it names no layer."""
    from viz.grid import cell_hover

    codes = np.array([[RAN, FILLED_COPY, RAN, FILLED_COPY, SKIPPED]], dtype=np.int8)
    sources = np.array([[-1, 2, -1, 0, -1]])
    hover = cell_hover(codes, ["token 'a' (step 1)"], ["core", "flex", "flex", "flex", "core"], sources=sources)
    assert hover.shape == (1, 5)
    assert hover[0, 1].endswith("copying layer 2<br>(no lower layer of its type ran)")
    assert hover[0, 3].endswith("skipped: KV filled by copying layer 0")
    assert hover[0, 4] == "token 'a' (step 1)<br>layer 4 (core) · skipped: no KV entry written"
    assert cell_hover(codes, ["t"], ["flex"] * 5)[0, 3].endswith("skipped: KV filled by copy")


def test_layer_grid_max_tokens_truncates(d3_trace: Trace) -> None:
    z = np.asarray(one(viz.layer_grid(d3_trace, max_tokens=7), "grid").z)
    np.testing.assert_array_equal(z, d3_trace.grid()[:7])


def test_layer_grid_names_holes_and_propagated_fills() -> None:
    trace = make_trace(D3Config(alpha=0.8, fill="none"), steps=10)
    hover = np.asarray(one(viz.layer_grid(trace), "grid").text, dtype=object)
    assert HOLE in trace.grid() and any("hole" in h for h in hover.ravel())
    trace = make_trace(D3Config(alpha=0.8, fill="propagate"), steps=10)
    hover = np.asarray(one(viz.layer_grid(trace), "grid").text, dtype=object)
    assert any("propagate" in h for h in hover.ravel())


def test_planned_grid_figure_matches_the_schedule(d3_cfg: D3Config) -> None:
    fig = viz.planned_grid_figure(d3_cfg, 12, 30, layer_types=None)
    expected = np.where(np.array(planned_grid(d3_cfg, 12, 30)), RAN, SKIPPED)
    np.testing.assert_array_equal(np.asarray(one(fig, "grid").z), expected)
    assert "planned: skipped" in np.asarray(one(fig, "grid").text, dtype=object)[-1, 5]
    filled = viz.planned_grid_figure(d3_cfg, 12, 30, show_fill=True, layer_types=["full_attention"] * 12)
    np.testing.assert_array_equal(np.asarray(one(filled, "grid").z), np.where(expected == RAN, RAN, FILLED_COPY))


def test_planned_grid_figure_says_early_exit_is_only_an_upper_bound() -> None:
    fig = viz.planned_grid_figure(EarlyExitConfig(), 12, 10, layer_types=None)
    assert "upper bound" in fig.layout.title.text


def test_planned_grid_figure_rejects_a_config_that_does_not_fit() -> None:
    with pytest.raises(ValueError, match="core_head"):
        viz.planned_grid_figure(D3Config(core_head=8, core_tail=8), 12, 10, layer_types=None)


def test_fig1_panels_one_grid_per_strategy(d3_trace: Trace, full_trace: Trace) -> None:
    traces = {"full depth": full_trace, "SkipDecode": make_trace(SkipDecodeConfig(horizon=10)),
              "unified": make_trace(UnifiedConfig(ratio=2.0)), "D3": d3_trace}
    fig = viz.fig1_panels(traces)
    grids = by_role(fig, "grid")
    assert [g.meta["name"] for g in grids] == list(traces)
    for grid, trace in zip(grids, traces.values()):
        np.testing.assert_array_equal(np.asarray(grid.z), trace.grid())
        assert grid.coloraxis == "coloraxis"
    assert [g.xaxis for g in grids] == ["x", "x2", "x3", "x4"]


# -- decay curve -------------------------------------------------------------------------------------
def test_decay_curve_raw_formula_and_planned_budget(d3_cfg: D3Config, d3_trace: Trace) -> None:
    L, steps = 12, 40
    fig = viz.decay_curve(d3_cfg, L, steps, trace=d3_trace)
    raw = [math.floor(L * d3_cfg.alpha ** max(0, i - d3_cfg.start) + 1e-9) for i in range(steps)]
    np.testing.assert_array_equal(np.asarray(one(fig, "raw").y), raw)
    head, tail = d3_cfg.core(L)
    clamped = [min(L, max(r, head + tail, 1)) for r in raw]
    planned = np.asarray(by_role(fig, "planned")[0].y)
    np.testing.assert_array_equal(planned, clamped)
    np.testing.assert_array_equal(planned, [d3_budget(d3_cfg, L, i) for i in range(steps)])
    np.testing.assert_array_equal(planned, budgets(d3_cfg, L, steps))
    np.testing.assert_array_equal(np.asarray(by_role(fig, "actual")[0].y), d3_trace.layers_used)
    assert {(s.y0, s.y1) for s in fig.layout.shapes if s.y0 == s.y1} == {(head + tail, head + tail)}
    assert {s.x0 for s in fig.layout.shapes if s.x0 == s.x1} == {d3_cfg.start - 0.5}
    for trace in fig.data:
        assert_hover(trace)


def test_a_short_runs_decay_curve_ticks_whole_tokens_only() -> None:
    """A 4-token run on Qwen drew ticks at -0.5, 0.5, ... 3.5 under its tokens (docs/screenshots, issue 44.7): a step
    is a whole token, so a short run's axis ticks each token and a long one's is left to plotly."""
    for steps in (1, 4, 12):
        xaxis = viz.decay_curve(D3Config(alpha=0.99), 28, steps).layout.xaxis
        assert (xaxis.tick0, xaxis.dtick) == (0, 1), steps
    assert viz.decay_curve(D3Config(alpha=0.99), 28, 64).layout.xaxis.dtick is None


def test_decay_curve_says_what_its_d3_lines_were_drawn_for() -> None:
    """The layout meta and the named guides the page's browser-side preview moves (assets/decay_preview.js)."""
    cfg = D3Config(alpha=0.9, core_head=2, core_tail=1, start=4, drop_order="top_down", fill="none")
    fig = viz.decay_curve(cfg, 12, 30)
    assert fig.layout.meta["d3_schedule"] == dict(num_layers=12, steps=30, alpha=0.9, core_head=2, core_tail=1,
                                                  alpha_lo=0, alpha_hi=1, core_max=11,  # the registry's, the core rule's
                                                  start=4, main=True, label_core=True,
                                                  label_extra=["top-down", "fill none"], short_names=False,
                                                  fields=dict(alpha=0.9, core_head=2, core_tail=1, start=4),
                                                  defaults=dict(alpha=0.99, start=0))
    assert one(fig, "planned").meta["strategy"] == "d3"
    assert {(s.name, s.visible) for s in fig.layout.shapes} == {("core-floor", True), ("decay-start", True)}
    assert {(a.name, a.visible) for a in fig.layout.annotations} == {("core-floor", True), ("decay-start", True)}
    bare = viz.decay_curve(D3Config(alpha=0.9, core_head=0, core_tail=0), 12, 30)  # nothing to mark: hidden
    assert not any(s.visible for s in bare.layout.shapes) and not any(a.visible for a in bare.layout.annotations)
    other = viz.decay_curve(UnifiedConfig(ratio=2.0), 12, 30, others={"D3": cfg})  # D3 beside another strategy
    assert other.layout.meta["d3_schedule"]["main"] is False
    assert one(other, "planned", name="D3: planned").meta["strategy"] == "d3"
    assert viz.decay_curve(UnifiedConfig(ratio=2.0), 12, 30).layout.meta is None


def test_in_presentation_mode_the_decay_legend_is_one_row_of_short_names_over_the_curve() -> None:
    """Short names (the D3 pane's title gives the settings; the page's preview keeps them: short_names), the
    unclamped formula on hover only, the legend in the top margin, and no axis title under the steps: the curve
    keeps its height on the first screen of a projector (tests/test_browser_moves.py measures it there)."""
    cfg = D3Config(alpha=0.9, core_head=2, core_tail=1)
    fig = viz.decay_curve(cfg, 12, 30, others={"SkipDecode (auto)": SkipDecodeConfig()}, presentation=True)
    shown = [t.name for t in fig.data if t.showlegend is not False]
    assert shown == ["D3: planned", "SkipDecode (auto)"]
    assert fig.layout.meta["d3_schedule"]["short_names"] is True
    assert (fig.layout.legend.yref, fig.layout.legend.y, fig.layout.legend.yanchor) == ("container", 1, "top")
    assert not fig.layout.xaxis.title.text
    plain = viz.decay_curve(cfg, 12, 30, others={"SkipDecode (auto)": SkipDecodeConfig()})
    assert [t.name for t in plain.data][:2] == ["floor(L·α^i), unclamped", "D3 (α=0.9, core 2+1): planned"]
    assert plain.layout.xaxis.title.text == "generated token (step i)"


def test_decay_curve_overlays_other_strategies(d3_cfg: D3Config) -> None:
    others = {"SkipDecode": SkipDecodeConfig(horizon=20), "unified 2x": UnifiedConfig(ratio=2.0),
              "early exit": EarlyExitConfig()}
    exit_trace = make_trace(FullConfig(), steps=15).with_steps(
        [s for s in make_trace(FullConfig(), steps=15).steps])  # stands in for a run with data-dependent depth
    fig = viz.decay_curve(d3_cfg, 12, 50, others=others, others_traces={"early exit": exit_trace})
    for key in ("SkipDecode", "unified 2x"):
        line = one(fig, "planned", name=f"{key}: planned")
        np.testing.assert_array_equal(np.asarray(line.y), budgets(others[key], 12, 50))
    assert not [t for t in by_role(fig, "planned") if t.meta["name"].startswith("early exit")]
    used = one(fig, "actual", name="early exit: used")
    np.testing.assert_array_equal(np.asarray(used.y), exit_trace.layers_used)
    colors = [t.line.color for t in by_role(fig, "planned")]
    assert len(set(colors)) == len(colors)


def test_decay_curve_handles_512_steps(d3_cfg: D3Config) -> None:
    fig = viz.decay_curve(D3Config(alpha=0.995), 32, 512, others={"skip": SkipDecodeConfig()})
    assert len(one(fig, "raw").y) == 512
    np.testing.assert_array_equal(np.asarray(by_role(fig, "planned")[0].y), budgets(D3Config(alpha=0.995), 32, 512))


def test_layers_vs_step_one_line_per_run(d3_trace: Trace, full_trace: Trace) -> None:
    fig = viz.layers_vs_step({"full": full_trace, "d3": d3_trace})
    used = by_role(fig, "actual")
    assert len(used) == 2
    np.testing.assert_array_equal(np.asarray(used[0].y), full_trace.layers_used)
    np.testing.assert_array_equal(np.asarray(used[1].y), d3_trace.layers_used)
    assert "ran" in used[1].text[0]


# -- information flow ----------------------------------------------------------------------------------
def _decode_mean(trace: Trace, name: str) -> np.ndarray:
    """Mean over decode steps (step 0 is the prefill's last position) of one stat, NaN where never run."""
    return _nanmean(trace.stat(name)[1:])


def _nanmean(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    count = np.isfinite(a).sum(axis=0)
    return np.where(count > 0, np.nansum(a, axis=0) / np.maximum(count, 1), np.nan)


def test_sublayer_flow_plots_the_nan_means_as_change(d3_trace: Trace, full_trace: Trace) -> None:
    fig = viz.sublayer_flow(d3_trace, compare=full_trace)
    flows = by_role(fig, "flow")
    assert len(flows) == 2 * 2 * 3  # metrics x sublayers x (prompt, trace, compare)
    for line in flows:
        sub, metric, source = line.meta["sublayer"], line.meta["metric"], line.meta["source"]
        name = f"{sub}_{metric}"
        if source.startswith("prompt"):
            expected = d3_trace.prompt_stats.stats[name].astype(np.float64)
        else:
            run = full_trace if "full depth" in source else d3_trace
            expected = _decode_mean(run, name)
        if metric == "cos":
            expected = 1.0 - expected
        np.testing.assert_allclose(np.asarray(line.y, dtype=np.float64), expected, rtol=1e-6)
        assert_hover(line)
    assert "1 − cos" in fig.layout.yaxis.title.text and "higher = more" in fig.layout.annotations[0].text
    assert sum(s.type == "rect" for s in fig.layout.shapes) == 4  # head and tail band in each subplot


def test_sublayer_flow_metric_switch_and_layers_that_never_ran() -> None:
    trace = make_trace(D3Config(alpha=0.5, core_head=1, core_tail=1), steps=8)
    trace = trace.with_steps(trace.steps[1:])  # step 0 always runs every layer
    never = [layer for layer in range(12) if all(layer not in s.layers_run for s in trace.steps)]
    assert never  # the middle of the stack is skipped by every token
    fig = viz.sublayer_flow(trace, metric="dist")
    line = one(fig, "flow", sublayer="mlp", metric="dist", source=f"generated, {viz.layout.strategy_label(trace.strategy)}")
    assert np.isnan(np.asarray(line.y, dtype=np.float64)[never]).all()
    assert "never ran" in line.text[never[0]]
    with pytest.raises(ValueError, match="metric"):
        viz.sublayer_flow(trace, metric="angle")


def test_sublayer_flow_without_stats_says_so() -> None:
    trace = make_trace(FullConfig(), steps=3)
    bare = Trace(model="m", num_layers=12, strategy={"strategy": "full"}, prompt="", core=(1, 1),
                 steps=tuple(TokenStep(step=s.step, token_id=1, text="a", layers_run=s.layers_run, filled=(),
                                       planned=12, entropy=0.0, wall_ms=1.0) for s in trace.steps))
    fig = viz.sublayer_flow(bare)
    assert "sublayer_stats" in message(fig)


def test_block_change_averages_per_trace_means(d3_cfg: D3Config) -> None:
    traces = [make_trace(FullConfig(), steps=10, seed=s) for s in range(4)]
    fig = viz.block_change(traces, metric="cos")
    line = one(fig, "flow", sublayer="attn", metric="cos")
    per_trace = np.stack([_decode_mean(t, "attn_cos") for t in traces])
    np.testing.assert_allclose(np.asarray(line.y), 1 - per_trace.mean(axis=0), rtol=1e-6)
    band = one(fig, "band", name="attention · mean over 4 traces")
    upper = np.asarray(band.y[:12])  # the band polygon runs along the upper edge first, then back along the lower
    np.testing.assert_allclose(upper - (1 - per_trace.mean(axis=0)), per_trace.std(axis=0, ddof=1), rtol=1e-5)
    sem = one(viz.block_change(traces, metric="cos", band="sem"), "band", name=band.meta["name"])
    assert np.ptp(sem.y) < np.ptp(band.y)  # sem = std / sqrt(4 traces)
    with pytest.raises(ValueError, match="band"):
        viz.block_change(traces, band="iqr")
    with pytest.raises(ValueError, match="source"):
        viz.block_change(traces, source="decode")
    frame = pd.concat([t.to_frame() for t in traces])
    from_frame = viz.block_change(frame, metric="dist")
    line = one(from_frame, "flow", sublayer="mlp", metric="dist")
    np.testing.assert_allclose(np.asarray(line.y), frame.groupby("layer")["mlp_dist"].mean().to_numpy(), rtol=1e-6)


# -- attention -----------------------------------------------------------------------------------------
def test_attention_map_rows_tokens_columns_keys(d3_trace: Trace, full_trace: Trace) -> None:
    fig = viz.attention_map(full_trace, 5, 1)
    heat = one(fig, "attention")
    z = np.asarray(heat.z, dtype=np.float64)
    T, P = len(full_trace.steps), len(full_trace.prompt_stats.tokens)
    assert z.shape == (T, P + T - 1)
    for t, step in enumerate(full_trace.steps):
        np.testing.assert_allclose(z[t, : P + t], step.attention[5][1].astype(np.float64))
        assert np.isnan(z[t, P + t:]).all()
    # key labels, thinned so they do not overlap (at most KEY_TICKS), each on its own column
    ticks = dict(zip(fig.layout.xaxis.tickvals, fig.layout.xaxis.ticktext))
    assert 2 <= len(ticks) <= viz.attention.KEY_TICKS and list(heat.x)[0] in ticks
    for value, text in ticks.items():
        k = list(heat.x).index(value)
        assert text == (full_trace.prompt_stats.tokens[k] if k < P else plot_text(full_trace.steps[k - P].text))
    # hover names the row and the column: the axes are self-explaining categories, one per row / column
    assert len(heat.x) == z.shape[1] and len(set(heat.x)) == z.shape[1] and len(heat.y) == T
    assert heat.x[0] == "key 0 'p0' (prompt)" and heat.x[P].endswith("(generated)")
    assert heat.y[3] == f"step 3 (producing {viz.layout.quoted(full_trace.steps[3].text)})"
    assert "%{y}" in heat.hovertemplate and "%{x}" in heat.hovertemplate and "%{z" in heat.hovertemplate


def test_attention_map_side_by_side_and_skipped_rows(d3_trace: Trace, full_trace: Trace) -> None:
    fig = viz.attention_map(d3_trace, 5, 0, compare=full_trace)
    maps = by_role(fig, "attention")
    assert [m.xaxis for m in maps] == ["x", "x2"] and maps[0].coloraxis == maps[1].coloraxis == "coloraxis"
    z = np.asarray(maps[1].z, dtype=np.float64)
    T, P = len(d3_trace.steps), len(d3_trace.prompt_stats.tokens)
    assert z.shape == np.asarray(maps[0].z).shape == (T, P + T - 1)  # same keys on both sides
    skipped = [t for t, s in enumerate(d3_trace.steps) if 5 not in s.layers_run]
    assert skipped and np.isnan(z[skipped]).all()
    assert "layer skipped" in maps[1].y[skipped[0]] and "skipped" not in maps[1].y[0]
    titles = [a.text for a in fig.layout.annotations]
    assert titles == ["full depth", "D3"]  # a word or two over each panel: side by side on a phone they are narrow
    assert "grey rows: D3 skipped layer 5" in title_text(fig)  # the note goes under the title, which wraps


def test_attention_map_takes_step_0_from_the_prompt_attention(full_trace: Trace) -> None:
    P = len(full_trace.prompt_stats.tokens)
    prompt_attention = np.random.default_rng(0).dirichlet(np.ones(P), size=(2, P)).astype(np.float16)  # [heads, P, P]
    steps = [replace(s, attention={}) if s.step == 0 else s for s in full_trace.steps]
    trace = full_trace.with_steps(steps, prompt_stats=replace(full_trace.prompt_stats, attention={5: prompt_attention}))
    z = np.asarray(one(viz.attention_map(trace, 5, 1), "attention").z, dtype=np.float64)
    np.testing.assert_allclose(z[0, :P], prompt_attention[1, -1].astype(np.float64))
    bare = full_trace.with_steps(steps)  # no prompt attention kept: row 0 is "not recorded", not "skipped"
    heat = one(viz.attention_map(bare, 5, 1), "attention")
    assert np.isnan(np.asarray(heat.z, dtype=np.float64)[0]).all() and "not recorded" in heat.y[0]


def test_attention_map_without_that_layer_is_an_annotated_figure(d3_trace: Trace) -> None:
    fig = viz.attention_map(d3_trace, 7, 0)
    assert not fig.data and "No attention was captured for layer 7" in message(fig)
    with pytest.raises(ValueError, match="head"):
        viz.attention_map(d3_trace, 5, 9)


# -- error propagation --------------------------------------------------------------------------------------
def _diverging_pair(cfg: StrategyConfig, at: int) -> tuple[Trace, Trace]:
    full = make_trace(FullConfig(), steps=20, seed=3)
    ids = full.token_ids
    ids = ids[:at] + [(i + 1) % len(WORDS) for i in ids[at:]]
    return full, make_trace(cfg, steps=20, token_ids=ids, seed=4)


def test_error_propagation_kl_lines_divergence_and_kv_heatmap(d3_cfg: D3Config) -> None:
    comp = make_comparison(*_diverging_pair(d3_cfg, at=6))
    fig = viz.error_propagation(comp)
    np.testing.assert_allclose(np.asarray(one(fig, "kl_teacher").y), comp.kl_teacher)
    np.testing.assert_allclose(np.asarray(one(fig, "kl_free").y), comp.kl_free)
    marker = one(fig, "divergence")
    assert list(marker.x) == [6] and comp.first_divergence == 6
    heat = one(fig, "kv_error")
    np.testing.assert_allclose(np.asarray(heat.z), np.log10(comp.kv_error).T)
    marked = {(int(t), int(layer)) for role in ("filled", "filled-unread")  # read later or never read: all filled
              for t, layer in zip(one(fig, role).x, one(fig, role).y)}
    t_idx, l_idx = np.nonzero(comp.filled_mask)
    assert marked == set(zip(t_idx.tolist(), l_idx.tolist()))
    assert "filled (copy)" in np.asarray(heat.text, dtype=object)[l_idx[0], t_idx[0]]
    assert {s.x0 for s in fig.layout.shapes if s.type == "line" and s.x0 == s.x1} == {6}


def test_error_propagation_without_divergence_or_kv(full_trace: Trace) -> None:
    comp = Comparison(full=full_trace, skip=full_trace, agree=np.ones(20, bool), kl_teacher=np.zeros(20),
                      kl_free=np.zeros(20), kv_error=np.zeros((0, 0)), filled_mask=np.zeros((0, 0), bool))
    fig = viz.error_propagation(comp)
    assert not by_role(fig, "divergence") and not by_role(fig, "kv_error")


def test_fill_strategies_compares_curves_and_means() -> None:
    comps = {fill: make_comparison(*_diverging_pair(D3Config(alpha=0.85, fill=fill), at=4 + k), seed=k)
             for k, fill in enumerate(("copy", "propagate", "none"))}
    fig = viz.fill_strategies(comps)
    for fill, comp in comps.items():
        np.testing.assert_allclose(np.asarray(one(fig, "kl_teacher", name=fill).y), comp.kl_teacher)
        np.testing.assert_allclose(np.asarray(one(fig, "kl_free", name=fill).y), comp.kl_free)
        np.testing.assert_allclose(one(fig, "kl_mean", name=fill).y, [comp.kl_teacher.mean(), comp.kl_free.mean()])
        assert one(fig, "agreement", name=fill).y == (pytest.approx(comp.agreement),)
    assert len({one(fig, "kl_teacher", name=f).line.color for f in comps}) == 3


# -- Pareto ----------------------------------------------------------------------------------------------
def _brute_front(points: np.ndarray, maximize: tuple[bool, bool]) -> set[int]:
    q = points * np.where(maximize, 1.0, -1.0)
    out = set()
    for i, p in enumerate(q):
        if not np.isfinite(p).all():
            continue
        dominated = any(np.isfinite(o).all() and (o >= p).all() and (o > p).any() for j, o in enumerate(q) if j != i)
        if not dominated:
            out.add(i)
    return out


@pytest.mark.parametrize("maximize", [(True, True), (True, False), (False, True)])
def test_pareto_front_is_exactly_the_non_dominated_points(maximize: tuple[bool, bool]) -> None:
    rng = np.random.default_rng(7)
    for trial in range(40):
        n = int(rng.integers(1, 40))
        points = rng.random((n, 2))
        if trial % 2:  # coarse grid: ties and exact duplicates
            points = np.round(points * 4) / 4
        if trial % 5 == 0:
            points[rng.integers(n)] = np.nan
        front = viz.pareto_front(points, maximize=maximize)
        assert set(front.tolist()) == _brute_front(points, maximize)
        assert len(front) == len(set(front.tolist()))
        assert np.all(np.diff(points[front, 0]) >= 0)


def test_pareto_front_empty_input() -> None:
    assert viz.pareto_front(np.zeros((0, 2))).tolist() == []


def test_pareto_draws_a_paired_interval_as_error_bars_and_none_without_one() -> None:
    df = pd.DataFrame({"strategy": ["full", "d3", "d3"], "label": ["full", "a", "b"], "measured_speedup": [1.0, 1.2, 1.4],
                       "agreement": [1.0, 0.8, 0.5], "agreement_low": [1.0, 0.7, 0.2], "agreement_high": [1.0, 0.9, 0.6]})
    fig = viz.pareto(df, y="agreement")
    d3 = next(t for t in fig.data if (t.meta or {}).get("name") == "d3")
    assert list(d3.error_y.array) == pytest.approx([0.1, 0.1]) and list(d3.error_y.arrayminus) == pytest.approx([0.1, 0.3])
    assert "[95%: 0.7 to 0.9]" in d3.text[0] or "[95%: 0.700 to 0.900]" in d3.text[0]
    bare = viz.pareto(df.drop(columns=["agreement_low", "agreement_high"]), y="agreement")
    assert all(t.error_y.array is None for t in bare.data if (t.meta or {}).get("role") == "points")


def _results() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = [{"strategy": "full", "label": "full depth", "measured_speedup": 1.0, "agreement": 1.0, "kl_teacher": 0.0,
             "ppl_ratio": 1.0, "accuracy": 0.5}]
    for strategy in ("d3", "skipdecode", "unified", "early_exit"):
        for k in range(5):
            rows.append({"strategy": strategy, "label": f"{strategy} #{k}", "measured_speedup": 1 + rng.random(),
                         "agreement": rng.uniform(0.5, 1.0), "kl_teacher": rng.uniform(0, 0.5),
                         "ppl_ratio": rng.uniform(1.0, 1.5), "accuracy": rng.uniform(0.3, 0.5)})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("metric", ["agreement", "kl_teacher", "ppl_ratio", "accuracy"])
def test_pareto_figure_front_line_through_exactly_the_non_dominated_rows(metric: str) -> None:
    df = _results()
    fig = viz.pareto(df, y=metric)
    higher = metric in ("agreement", "accuracy")
    expected = _brute_front(df[["measured_speedup", metric]].to_numpy(), (True, higher))
    front = one(fig, "front")
    assert set(front.meta["index"]) == expected
    got = set(zip(np.asarray(front.x), np.asarray(front.y)))
    assert got == {(df.measured_speedup[i], df[metric][i]) for i in expected}
    assert front.line.shape == "vh"
    points = by_role(fig, "points")
    assert [p.meta["name"] for p in points] == ["full", "d3", "skipdecode", "unified", "early_exit"]
    assert sum(len(p.x) for p in points) == len(df)
    assert all("on the Pareto front" in t or "dominated" in t for p in points for t in p.text)
    target = one(fig, "target")
    full_value = df[metric][0]
    bound = {"agreement": 0.99, "accuracy": full_value - 0.01, "kl_teacher": 0.01, "ppl_ratio": 1.01}[metric]
    assert target.x == (1.5,) and target.y[0] == pytest.approx(bound)


def test_pareto_needs_a_direction_for_unknown_metrics() -> None:
    df = _results().assign(score=1.0)
    with pytest.raises(ValueError, match="higher_is_better"):
        viz.pareto(df, y="score")
    assert one(viz.pareto(df, y="score", higher_is_better=True, target=None), "front")


def test_task_accuracy_delta_bars_are_differences_in_points() -> None:
    df = pd.DataFrame([
        {"task": "gsm8k", "strategy": "full", "accuracy": 0.40, "chance": 0.0},
        {"task": "word_sorting", "strategy": "full", "accuracy": 0.30, "chance": 0.28},
        {"task": "gsm8k", "strategy": "d3", "label": "D3 α=0.99", "accuracy": 0.38, "chance": 0.0},
        {"task": "word_sorting", "strategy": "d3", "label": "D3 α=0.99", "accuracy": 0.10, "chance": 0.28},
        {"task": "gsm8k", "strategy": "skipdecode", "label": "SkipDecode", "accuracy": 0.20, "chance": 0.0},
    ])
    fig = viz.task_accuracy_delta(df)
    d3 = one(fig, "delta", name="D3 α=0.99")
    assert list(d3.x) == ["gsm8k", "word_sorting"]
    np.testing.assert_allclose(d3.y, [-2.0, -20.0])
    assert "chance level 28.0%" in d3.text[1] and "near chance" in d3.text[1]
    np.testing.assert_allclose(one(fig, "delta", name="SkipDecode").y, [-20.0])
    # the report's long table: no full-depth rows, the reference on every row as accuracy_full
    runs = df[df.strategy != "full"].assign(accuracy_full=lambda d: d.task.map({"gsm8k": 0.40, "word_sorting": 0.30}))
    np.testing.assert_allclose(one(viz.task_accuracy_delta(runs), "delta", name="D3 α=0.99").y, [-2.0, -20.0])


# -- streaming pane ------------------------------------------------------------------------------------------
def test_token_html_escapes_and_marks_exactly_the_differing_positions(d3_cfg: D3Config) -> None:
    full, skip = _diverging_pair(d3_cfg, at=20)  # same ids everywhere, then change three
    ids = full.token_ids
    differ = [3, 7, 12]
    for i in differ:
        ids[i] = 99
    texts = [WORDS[i % len(WORDS)] for i in full.token_ids]
    texts[7] = "<script>alert(1)</script>"
    skip = make_trace(d3_cfg, steps=20, token_ids=ids, texts=texts)
    out = viz.token_html(skip, reference=full)
    assert "<script>" not in out and "&lt;script&gt;alert(1)&lt;/script&gt;" in out
    marked = [int(m) for m in re.findall(r'class="d3-tok d3-diff" data-step="(\d+)"', out)]
    assert marked == differ
    assert len(re.findall(r'class="d3-tok[ "]', out)) == 20
    assert out.count('class="d3-badge"') == 1
    assert out.index('class="d3-badge"') < out.index('data-step="3"') < out.index('data-step="4"')
    assert out.index('class="d3-badge"') > out.index('data-step="2"')
    assert "full depth picked" in out


def test_token_html_colours_by_layers_and_shows_newlines(d3_trace: Trace) -> None:
    out = viz.token_html(d3_trace)
    assert "d3-diff" not in out and "d3-badge" not in out
    assert "⏎\n" in out and 'class="d3-legend"' in out
    colours = dict(re.findall(r'data-layers="(\d+)" title="[^"]*" style="background:([^;]+);', out))
    assert len(colours) == len(set(d3_trace.layers_used.tolist())) >= 2
    assert len(set(colours.values())) == len(colours)  # different depths, different colours


def test_token_html_title_attribute_cannot_break_out() -> None:
    trace = make_trace(FullConfig(), steps=2, texts=['" onmouseover="x', "a"])
    out = viz.token_html(trace)
    assert '" onmouseover="x' not in out and "&quot; onmouseover=&quot;x" in out


def _timed(trace: Trace, ms: list[float]) -> Trace:
    return trace.with_steps([replace(s, wall_ms=m) for s, m in zip(trace.steps, ms)])


def test_counters_html_reports_speed_depth_and_agreement(d3_cfg: D3Config) -> None:
    from d3.trace import measured_speedup

    full, skip = _diverging_pair(d3_cfg, at=15)
    rng = np.random.default_rng(0)
    full = _timed(full, list(20 + rng.random(20)))
    skip = _timed(skip, list(10 + rng.random(20)))
    speedup = measured_speedup(skip, full)
    assert speedup.resolvable
    out = viz.counters_html(skip, reference=full, speedup=speedup)
    assert f"{speedup.ratio:.2f}×" in out and f"{skip.theoretical_speedup():.2f}×" in out
    assert f"{skip.mean_layers:.1f} / 12" in out and "15 / 20" in out and "first divergence at position 15" in out
    # tokens/s beside it agree with the ratio: the same steps, the same statistic
    d3_rate, full_rate = viz.step_rate(skip, full), viz.step_rate(full, skip)
    assert d3_rate / full_rate == pytest.approx(speedup.ratio)
    assert f"{d3_rate:.1f}" in out and f"{full_rate:.1f}" in viz.counters_html(full, paired=skip)
    assert "measured" not in viz.counters_html(full, paired=skip)  # the full-depth pane shows no speedup of its own


def test_a_speedup_a_run_cannot_resolve_is_said_so_with_the_theoretical_one(d3_cfg: D3Config) -> None:
    """Issue 24, item 5: two runs whose step times are the same up to noise show no measured ratio at all."""
    from d3.trace import measured_speedup

    full, skip = _diverging_pair(d3_cfg, at=15)
    rng = np.random.default_rng(1)
    noise = list(10 + 3 * rng.random(20))
    speedup = measured_speedup(_timed(skip, noise), _timed(full, noise[::-1]))
    assert not speedup.resolvable
    out = viz.counters_html(skip, reference=full, speedup=speedup)
    assert "too small" in out and f"theoretical {skip.theoretical_speedup():.2f}×" in out
    assert f"{speedup.ratio:.2f}×" not in out


# -- shared look and export ------------------------------------------------------------------------------------
def test_presentation_scales_fonts_up(d3_cfg: D3Config) -> None:
    normal = viz.decay_curve(d3_cfg, 12, 20)
    big = viz.decay_curve(d3_cfg, 12, 20, presentation=True)
    assert big.layout.font.size > normal.layout.font.size >= 14
    assert big.layout.title.font.size > normal.layout.title.font.size


def test_every_figure_explains_its_points(d3_trace: Trace, full_trace: Trace, d3_cfg: D3Config) -> None:
    comp = make_comparison(full_trace, d3_trace)
    figures = [viz.layer_grid(d3_trace), viz.planned_grid_figure(d3_cfg, 12, 10, layer_types=None), viz.decay_curve(d3_cfg, 12, 20),
               viz.sublayer_flow(d3_trace), viz.attention_map(d3_trace, 0, 0), viz.error_propagation(comp),
               viz.fill_strategies({"copy": comp}), viz.pareto(_results()), viz.layers_vs_step({"d3": d3_trace}),
               viz.block_change([d3_trace, full_trace])]
    for fig in figures:
        for trace in fig.data:
            if trace.hoverinfo == "skip":
                continue
            assert_hover(trace)


def test_to_html_is_standalone(d3_cfg: D3Config) -> None:
    page = viz.to_html(viz.decay_curve(d3_cfg, 12, 10))
    assert "<html>" in page and page.rstrip().endswith("</html>") and "plotly.js" in page.lower()
    assert len(page) > 1_000_000  # plotly.js is inlined, so the page works offline


def test_a_placeholder_message_is_wrapped_to_fit_a_phone() -> None:
    from viz.layout import MESSAGE_WIDTH, empty_figure, wrap_message

    said = "Cannot draw this schedule:<br>core_head + core_tail must be at most the model's 30 layers (got 20 + 12)"
    fig = empty_figure(said)
    text = fig.layout.annotations[0].text
    assert all(len(line) <= MESSAGE_WIDTH for line in text.split("<br>")), text
    assert message(fig) == said.replace("<br>", " ")  # only line breaks were added
    assert wrap_message("a-very-long-unbreakable-word-" * 3) == "a-very-long-unbreakable-word-" * 3  # never split


def test_on_gemma3_the_grid_hover_names_the_layer_the_decoder_copied_from(tiny_gemma) -> None:
    """Gemma 3 with fill copy: a skipped global layer copies a global layer, not the nearest lower layer that ran.
    The hover of the usage grid (and of the lens heatmap) names the layer the decoder recorded, in every copied
    cell; at least one of them is a cell where the nearest-lower rule the figures once re-derived would be wrong."""
    from d3.config import TRACE_OFF, GenerationConfig

    cfg = D3Config(alpha=0.8, core_head=1, core_tail=1, drop_order="strided", fill="copy")
    trace = tiny_gemma.generate("hello world", cfg, GenerationConfig(max_new_tokens=8, stop_at_eos=False), TRACE_OFF)
    assert trace.layer_types == tuple(tiny_gemma.adapter.layer_types)
    hover = np.asarray(one(viz.layer_grid(trace), "grid").text, dtype=object)  # [T, L]
    checked, would_have_been_wrong = 0, 0
    for t, step in enumerate(trace.steps):
        for layer, how, source in step.filled:
            if how != "copy":
                continue
            assert trace.layer_types[source] == trace.layer_types[layer]
            assert f"copying layer {source}" in hover[t, layer] and hover[t, layer].count("copying layer") == 1
            nearest_lower = max((r for r in step.layers_run if r < layer), default=None)
            would_have_been_wrong += nearest_lower is not None and nearest_lower != source
            checked += 1
    assert checked and would_have_been_wrong


def test_the_token_colours_tell_28_29_and_30_layers_apart() -> None:
    """Issue 24: at 28-29 of 30 layers every token was the same navy as 30. The scale spans the run's own range."""
    from plotly.colors import unlabel_rgb

    trace = make_trace(FullConfig(), num_layers=30, steps=3)
    trace = trace.with_steps([replace(s, layers_run=tuple(range(n))) for s, n in zip(trace.steps, (30, 29, 28))])
    out = viz.token_html(trace)
    colours = {n: re.search(rf'data-layers="{n}" [^>]*background:(rgb\([^)]*\))', out).group(1) for n in (28, 29, 30)}
    assert len(set(colours.values())) == 3
    light, dark = (np.array(unlabel_rgb(colours[n])) for n in (28, 30))
    assert np.abs(light - dark).sum() > 200  # far apart, not two shades of navy


def test_error_propagation_names_masked_holes_as_holes(tiny_engine) -> None:
    """Issue 24, item 9: with fill none the outlined cells are masked holes, which no later token reads; they were
    labelled "filled, read by later tokens". With fill copy the same cells are read copies."""
    from d3.compare import compare
    from d3.config import TRACE_OFF, GenerationConfig

    gen = GenerationConfig(max_new_tokens=8, stop_at_eos=False)
    names = {}
    for fill in ("none", "copy"):
        cfg = D3Config(alpha=0.8, core_head=1, core_tail=1, drop_order="strided", fill=fill)
        fig = viz.error_propagation(compare(tiny_engine, "hello world", cfg, gen, TRACE_OFF))
        names[fill] = [t.name for t in fig.data if (t.meta or {}).get("role") == "filled" and len(t.x)]
    assert names["none"] == ["hole (masked), its layer runs later"]
    assert names["copy"] == ["filled, read by later tokens"]


@pytest.mark.parametrize("alpha, tokens", [(0.95, 8), (0.9, 4), (0.8, 8)])
def test_error_propagation_with_fill_none_names_every_mark_a_hole_and_never_says_nested(tiny_engine, alpha,
                                                                                        tokens) -> None:
    """Issue 35, M6: strided with fill none: the legend said "filled, never read" and the subtitle "Nested drop
    order…"; the layer stack, for the same run, says "hole (masked)"."""
    from d3.compare import compare
    from d3.config import GenerationConfig

    cfg = D3Config(alpha=alpha, core_head=1, core_tail=1, drop_order="strided", fill="none")
    fig = viz.error_propagation(compare(tiny_engine, "the cat sat on", cfg,
                                        GenerationConfig(max_new_tokens=tokens, stop_at_eos=False)))
    marks = [t.name for t in fig.data if (t.meta or {}).get("role") in ("filled", "filled-unread") and len(t.x)]
    assert marks and all(name.startswith("hole (masked)") for name in marks), marks
    assert "Nested drop order" not in fig.layout.title.text


def test_an_answer_that_opens_with_line_breaks_starts_with_its_first_word() -> None:
    """Issue 24: on Gemma 3 the answer starts with two line breaks, so the pane showed only those; issue 35: then
    it began with two ⏎ marks. The white space before the first word is not drawn (a person reads an answer from
    its first word); those tokens stay in the pane, each a sliver of its colour whose tooltip says what it was, and
    a line break inside the answer shows its ⏎ and breaks the line."""
    trace = make_trace(FullConfig(), num_layers=12, steps=5)
    texts = ("\n", "\n", "Hi", " ", "\nthere")
    trace = trace.with_steps([replace(s, text=t) for s, t in zip(trace.steps, texts)])
    out = viz.token_html(trace)
    shown = re.findall(r'class="d3-tok"[^>]*>([^<]*)</span>', out)
    assert shown == ["", "", "Hi", " ", "⏎\nthere"]
    leading = re.findall(r'<span class="d3-tok" data-step="(\d)"[^>]*title="([^"]*)"[^>]*style="([^"]*)"', out)
    assert [step for step, tip, style in leading if "min-width" in style] == ["0", "1"]  # hoverable, in colour
    assert all("before the answer" in tip for step, tip, _ in leading if step in "01")

def test_paired_curves_draw_the_difference_in_points_with_asymmetric_interval_bars() -> None:
    from viz.results import paired_curves

    fig = paired_curves({"d3 a": [{"layers": 9.0, "diff": -0.02, "low": -0.05, "high": 0.01},
                                  {"layers": 8.0, "diff": -0.10, "low": -0.12, "high": -0.07}],
                         "unified": [{"layers": 8.5, "diff": -0.3, "low": -0.4, "high": -0.25}]})
    a, u = fig.data
    assert list(a.x) == [8.0, 9.0] and list(a.y) == pytest.approx([-10.0, -2.0])  # sorted by x, in points
    assert list(a.error_y.array) == pytest.approx([3.0, 3.0]) and list(a.error_y.arrayminus) == pytest.approx([2.0, 3.0])
    assert list(u.y) == pytest.approx([-30.0]) and a.line.color != u.line.color
    assert [s.y0 for s in fig.layout.shapes] == [0.0, -1.0]  # zero and the 1-point bound
    assert "No paired results" in paired_curves({}).layout.annotations[0].text


def test_the_usage_grid_labels_every_other_layer_and_thins_token_labels_in_presentation_mode(tiny_engine) -> None:
    from viz.grid import layer_grid
    from viz.stream import token_html

    trace = tiny_engine.generate("the cat sat", D3Config(alpha=0.9, core_head=1, core_tail=1),
                                 GenerationConfig(max_new_tokens=20, stop_at_eos=False))
    wide = trace.__class__(**{**trace.__dict__, "num_layers": 30})  # SmolLM2's 30 columns
    assert len(layer_grid(wide).layout.xaxis.tickvals) <= 16  # 30 labels at ~25 px each ran into each other
    rows = len(trace.steps)
    assert len(layer_grid(trace).layout.yaxis.tickvals) == rows
    assert len(layer_grid(trace, presentation=True).layout.yaxis.tickvals) <= (rows + 1) // 2
    full = tiny_engine.generate("the cat sat", D3Config(alpha=1.0, core_head=1, core_tail=1),
                                GenerationConfig(max_new_tokens=20, stop_at_eos=False))
    html = token_html(trace, reference=full)
    if "first divergence" in html:
        assert "white-space:nowrap\">first divergence ▸" in html  # the ▸ never wraps alone onto a line


@pytest.mark.parametrize("presentation", [False, True])
def test_the_core_floor_label_sits_clear_of_the_d3_line(presentation) -> None:
    """The label stands in the right margin at the floor line's end (issue 17 item 8): inside the plot the line,
    the markers of tokens that ran at the floor and other strategies' lines can all run through it."""
    from viz.depth import FLOOR_LABEL_EM

    fig = decay_curve(D3Config(alpha=0.9), 30, 64, presentation=presentation)
    note = next(a for a in fig.layout.annotations if "core floor" in a.text)
    assert (note.xref, note.x, note.xanchor, note.y) == ("paper", 1, "left", 6)  # right of the plot, at the floor
    assert note.text == "core floor<br>3+3=6"
    widest = max(len(line) for line in note.text.split("<br>"))  # "core floor" is 4.2 em wide in Arial
    assert fig.layout.margin.r >= FLOOR_LABEL_EM * note.font.size + note.xshift and FLOOR_LABEL_EM >= 0.42 * widest


@pytest.mark.parametrize("steps", [8, 16, 64, 128])
def test_the_planned_grids_labels_leave_room_for_each_other(d3_cfg: D3Config, steps: int) -> None:
    """Issue 35 (ugly list): the planned grid's step labels overlapped at 1280 and on a phone, and its layer labels
    on a phone. Each step label gets at least 22 px of plot (the figure less 300 px of title, axis and legend), at
    most 10 layers are labelled."""
    fig = viz.planned_grid_figure(d3_cfg, 30, steps, layer_types=None)
    plot_px = fig.layout.height - 300
    assert len(fig.layout.yaxis.tickvals) * 22 <= max(plot_px, 44)
    assert len(fig.layout.xaxis.tickvals) <= 10 and 0 in fig.layout.xaxis.tickvals


def test_the_counters_read_a_speedup_above_theory_as_a_timing_artefact_and_name_the_pace(d3_cfg: D3Config) -> None:
    """Issue 44, D7: "2.54× theoretical, 3.34× measured (2.17-5.13)" with no word; issue 40: one pace, named."""
    from d3.trace import measured_speedup

    full, skip = _diverging_pair(d3_cfg, at=15)
    rng = np.random.default_rng(0)
    full = _timed(full, list(40 + rng.random(20)))  # full depth's steps 4x as long: above any theoretical speedup
    skip = _timed(skip, list(10 + rng.random(20)))
    speedup = measured_speedup(skip, full)
    assert speedup.ratio > speedup.theoretical * 1.02
    out = viz.counters_html(skip, reference=full, speedup=speedup)
    assert "timing artefact" in out and f"above the theoretical {speedup.theoretical:.2f}×" in out
    assert "tokens/s while decoding" in out and "tokens / s" not in out
    slow = measured_speedup(_timed(skip, list(40 + rng.random(20))), _timed(full, list(10 + rng.random(20))))
    assert "slower than full depth" in viz.counters_html(skip, reference=full, speedup=slow)


def test_a_strategy_without_a_core_gets_no_core_band_and_is_named_as_itself(d3_trace: Trace) -> None:
    """Issue 44, D9: early exit's usage grid drew the purple "core layers (always run)" band over cells it drew as
    skipped, and its status said "16 D3 tokens… D3 wrote"."""
    from d3.config import EarlyExitConfig
    from explorer import views

    early = make_trace(EarlyExitConfig(min_layers=2), steps=16)
    for fig, cored in ((viz.layer_grid(early), False), (viz.layer_grid(d3_trace), True)):
        bands = [s for s in fig.layout.shapes if s.fillcolor == "rgba(124, 58, 237, 0.12)" or s.layer == "below"]
        assert bool(bands) == cored
        assert any(t.meta and t.meta.get("role") == "core-legend" for t in fig.data) == cored
    assert "(flex)" not in str(viz.layer_grid(early).data[0].text[0][0])
    full = make_trace(FullConfig(), steps=16, token_ids=[(i + 1) % 12 for i in early.token_ids])
    status = views.status_html(early, full, "done")
    assert "16 early exit tokens" in status and "early exit wrote" in status and "D3" not in status


def test_the_end_of_text_token_is_a_mark_in_the_pane_not_literal_text() -> None:
    """Issue 44, U4: the 28-layer model's full-depth pane ended in a literal `<|endoftext|>`."""
    trace = replace(make_trace(FullConfig(), steps=3, texts=["The", " sky", "<|endoftext|>"]), finish_reason="eos")
    out = viz.token_html(trace)
    stream = out.split('class="d3-stream"', 1)[1]
    assert "&lt;|endoftext|&gt;</span>" not in stream and "∎ end</span>" in stream
    assert "end-of-text token" in stream  # the tooltip still names it
    cut = viz.token_html(make_trace(FullConfig(), steps=3, texts=["The", " sky", " is"]))  # stopped at the length
    assert "∎ end" not in cut


def test_the_status_names_an_end_of_text_divergence_as_the_pane_marks_it_not_as_literal_text() -> None:
    """The walk on Qwen (issue 44): the full-depth pane ended in "∎ end" while the status said "D3 wrote ␣Q where
    full depth wrote <|endoftext|>", the special token as text the pane does not show."""
    from explorer import views

    texts = ["8", " times", "<|endoftext|>"]
    full = replace(make_trace(FullConfig(), steps=3, token_ids=[1, 2, 3], texts=texts), finish_reason="eos")
    d3 = make_trace(D3Config(alpha=0.9), steps=4, token_ids=[1, 2, 4, 5], texts=["8", " times", " Q", ":"])
    status = views.status_html(d3, full, "done")
    assert "endoftext" not in status
    assert "First divergence at token 2: D3 wrote <code>␣Q</code> where full depth ended (its end-of-text token, " \
           "∎ end)" in status
    early = replace(make_trace(D3Config(alpha=0.9), steps=3, token_ids=[1, 2, 3], texts=texts), finish_reason="eos")
    longer = make_trace(FullConfig(), steps=4, token_ids=[1, 2, 4, 5], texts=["8", " times", " Q", ":"])
    assert "D3 ended (its end-of-text token, ∎ end) where full depth wrote <code>␣Q</code>" in \
        views.status_html(early, longer, "done")
