"""viz/attention_overview.py: D3, full depth and their difference per head (or per layer), checked on the numbers."""

from __future__ import annotations

import numpy as np
import pytest

from d3.config import D3Config, FullConfig, GenerationConfig, TraceConfig
from d3.trace import PromptStats, TokenStep, Trace
from tests.figures import by_role, message, title_text
from viz.attention_overview import (
    attention_overview,
    compared_weights,
    divergence_grid,
    divergence_overview,
    js_divergence,
)

P, HEADS, L = 3, 2, 4
RNG = np.random.default_rng(0)


def weights(kv_len: int) -> np.ndarray:
    return RNG.dirichlet(np.ones(kv_len), size=HEADS).astype(np.float16)  # [heads, kv_len]


def run(name: str, tokens: list[int], skip_layer1_at: tuple[int, ...] = ()) -> Trace:
    """Attention recorded at layers 1 and 2; the token at each step in `skip_layer1_at` skipped layer 1."""
    steps = []
    for t, token in enumerate(tokens):
        ran = tuple(k for k in range(L) if not (k == 1 and t in skip_layer1_at))
        attention = {k: weights(P + t) for k in (1, 2) if k in ran}
        steps.append(TokenStep(step=t, token_id=token, text=f" t{token}", layers_run=ran,
                               filled=((1, "copy"),) if 1 not in ran else (), planned=len(ran), entropy=1.0,
                               wall_ms=1.0, attention=attention))
    return Trace(model="tiny", num_layers=L, strategy={"strategy": name, "alpha": 0.9}, prompt="p", core=(1, 1),
                 steps=tuple(steps), num_heads=HEADS, prompt_stats=PromptStats(tokens=("a", "b", "c")))


D3 = run("d3", [5, 6, 7, 9], skip_layer1_at=(2,))  # four tokens, the last one differs from full depth's
FULL = run("full", [5, 6, 7])  # three tokens: the overview compares three


def panels(fig, column: str) -> list:
    return [t for t in fig.data if (t.meta or {}).get("column") == column]


def expected(trace: Trace, layer: int, head: int, steps: int = 3) -> np.ndarray:
    """[steps, P + steps - 1] from the raw recorded arrays, NaN right of each token's keys and where it skipped."""
    out = np.full((steps, P + steps - 1), np.nan, dtype=np.float32)
    for t, s in enumerate(trace.steps[:steps]):
        if layer in s.attention:
            out[t, : P + t] = s.attention[layer][head]
    return out


def test_all_heads_of_one_layer_in_three_columns_over_the_positions_both_runs_reached() -> None:
    fig = attention_overview(D3, FULL, layer=1)
    for column, run_ in (("d3", D3), ("full", FULL)):
        drawn = panels(fig, column)
        assert len(drawn) == HEADS
        for head, heat in enumerate(drawn):
            np.testing.assert_array_equal(np.asarray(heat.z, dtype=np.float32), expected(run_, 1, head))
    assert [a.text for a in fig.layout.annotations] == ["D3", "full", "D3 − full"]
    assert "all heads of layer 1" in title_text(fig)


def test_the_difference_panel_is_d3_minus_full_on_a_symmetric_diverging_scale() -> None:
    fig = attention_overview(D3, FULL, layer=1)
    diffs = panels(fig, "difference")
    for head, heat in enumerate(diffs):
        want = expected(D3, 1, head) - expected(FULL, 1, head)
        np.testing.assert_allclose(np.asarray(heat.z, dtype=np.float32), want, equal_nan=True)
        assert heat.coloraxis == "coloraxis2"
        assert np.isnan(np.asarray(heat.z, dtype=np.float32)[2]).all()  # D3 skipped layer 1 at token 2
    scale = fig.layout.coloraxis2
    largest = max(np.nanmax(np.abs(np.asarray(h.z, dtype=np.float32))) for h in diffs)
    assert scale.cmin == -scale.cmax and scale.cmax == pytest.approx(largest)
    assert scale.colorscale[0][1] != scale.colorscale[-1][1]  # diverging: the two ends differ
    # D3 and full depth share one weight scale, from 0 to the largest weight shown.
    assert {h.coloraxis for h in panels(fig, "d3") + panels(fig, "full")} == {"coloraxis"}
    assert fig.layout.coloraxis.cmin == 0
    shown = np.concatenate([np.asarray(h.z, dtype=np.float32).ravel() for h in panels(fig, "d3") + panels(fig, "full")])
    assert fig.layout.coloraxis.cmax == pytest.approx(np.nanpercentile(shown, 99), rel=1e-3)


def test_rows_where_d3_skipped_the_layer_are_grey_in_its_panels() -> None:
    fig = attention_overview(D3, FULL, layer=1)
    grey = [t for t in fig.data if (t.meta or {}).get("role") == "skipped-rows"]
    assert len(grey) == 2 * HEADS  # the D3 panel and the difference panel of each head
    for heat in grey:
        z = np.asarray(heat.z, dtype=np.float32)
        assert np.isfinite(z).all(axis=1).tolist() == [False, False, True]
    assert {t.xaxis for t in grey} == {t.xaxis for t in panels(fig, "d3") + panels(fig, "difference")}
    assert "grey rows: D3 skipped the layer" in title_text(fig)


def test_one_head_across_the_recorded_layers() -> None:
    fig = attention_overview(D3, FULL, head=1)
    for column, run_ in (("d3", D3), ("full", FULL)):
        drawn = panels(fig, column)
        assert len(drawn) == 2  # layers 1 and 2 were recorded
        for layer, heat in zip((1, 2), drawn):
            np.testing.assert_array_equal(np.asarray(heat.z, dtype=np.float32), expected(run_, layer, 1))
    assert fig.layout.yaxis.title.text == "layer 1" and fig.layout.yaxis4.title.text == "layer 2"


def test_the_first_divergence_is_marked() -> None:
    d3 = run("d3", [5, 8, 7])
    fig = attention_overview(d3, FULL, layer=2)
    assert {s.y0 for s in fig.layout.shapes if s.line.dash == "dash"} == {0.5}
    assert "texts differ from token 1" in title_text(fig)
    assert not [s for s in attention_overview(D3, FULL, layer=2).layout.shapes if s.line.dash == "dash"]


def test_long_runs_are_cut_to_max_tokens() -> None:
    fig = attention_overview(D3, FULL, layer=2, max_tokens=2)
    for column, run_ in (("d3", D3), ("full", FULL)):
        for head, heat in enumerate(panels(fig, column)):
            np.testing.assert_array_equal(np.asarray(heat.z, dtype=np.float32), expected(run_, 2, head, steps=2))
    assert "the first 2 of 3 tokens" in title_text(fig)
    d3 = run("d3", [5, 6, 8])  # differs at token 2, past the rows shown: no line
    assert not [s for s in attention_overview(d3, FULL, layer=2, max_tokens=2).layout.shapes if s.line.dash == "dash"]
    with pytest.raises(ValueError, match="max_tokens=0 .* >= 1"):
        attention_overview(D3, FULL, layer=2, max_tokens=0)


def test_presentation_mode_has_larger_text() -> None:
    plain, big = attention_overview(D3, FULL, layer=1), attention_overview(D3, FULL, layer=1, presentation=True)
    assert big.layout.annotations[0].font.size > plain.layout.annotations[0].font.size
    assert big.layout.xaxis.tickfont.size > plain.layout.xaxis.tickfont.size
    assert big.layout.height > plain.layout.height


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="choose one: layer"):
        attention_overview(D3, FULL, layer=1, head=0)
    with pytest.raises(ValueError, match="choose one: layer"):
        attention_overview(D3, FULL)
    with pytest.raises(ValueError, match=r"head=2 .* \[0, 1\]"):
        attention_overview(D3, FULL, head=2)
    with pytest.raises(ValueError, match="same prompt"):
        attention_overview(D3, Trace.from_dict(dict(FULL.to_dict(), prompt="other")), layer=1)
    assert "No attention of full depth was captured for layer 3" in message(attention_overview(D3, FULL, layer=3))


def test_a_real_run_on_the_tiny_model(tiny_engine) -> None:
    gen, trace_cfg = GenerationConfig(max_new_tokens=8, stop_at_eos=False), TraceConfig(attention_layers=(4,))
    d3 = tiny_engine.generate("hello world", D3Config(alpha=0.9, core_head=1, core_tail=1), gen, trace_cfg)
    full = tiny_engine.generate("hello world", FullConfig(), gen, trace_cfg)
    fig = attention_overview(d3, full, layer=4)
    heads = full.num_heads
    assert heads > 0 and len(panels(fig, "difference")) == heads
    skipped = [t for t, s in enumerate(d3.steps) if 4 not in s.layers_run]
    assert skipped  # the decay dropped layer 4 for the last tokens: their rows are grey
    for head, heat in enumerate(panels(fig, "difference")):
        mine, theirs = compared_weights(d3, full, 4, head)
        assert mine.shape == (8, theirs.shape[1]) and np.isfinite(theirs).any()
        z = np.asarray(heat.z, dtype=np.float32)
        assert (np.abs(z[np.isfinite(z)]) > 1e-3).sum() > 10  # skipped layers below changed what layer 4 attends to
        np.testing.assert_allclose(z, mine - theirs, equal_nan=True)
        assert all(np.isnan(z[t]).all() for t in skipped)


# ---------------------------------------------------------------- where D3 changes attention: layers x heads


def rows_run(name: str, tokens: list[int], rows: dict[int, dict[int, list[list[float]]]], layers: int = 3) -> Trace:
    """A run with explicit attention rows: rows[step][layer] = [heads][keys] (a layer absent at a step: skipped)."""
    steps = []
    for t, token in enumerate(tokens):
        recorded = {k: np.asarray(v, dtype=np.float16) for k, v in rows.get(t, {}).items()}
        ran = tuple(k for k in range(layers) if t == 0 or k in recorded or k == 0)
        steps.append(TokenStep(step=t, token_id=token, text=f" t{token}", layers_run=ran, filled=(), planned=len(ran),
                               entropy=1.0, wall_ms=1.0, attention=recorded))
    return Trace(model="tiny", num_layers=layers, strategy={"strategy": name, "alpha": 0.9}, prompt="p", core=(1, 1),
                 steps=tuple(steps), num_heads=2, prompt_stats=PromptStats(tokens=("a", "b")))


# Two prompt tokens, three layers, two heads. Step 1 sees 3 keys, step 2 sees 4. Layer 2: D3 skipped it at step 1.
FULL_ROWS = {1: {0: [[.5, .5, 0], [.2, .3, .5]], 1: [[1, 0, 0], [.25, .25, .5]], 2: [[.5, .5, 0], [1, 0, 0]]},
             2: {0: [[.25, .25, .25, .25], [0, 0, 0, 1]], 1: [[0, 0, 0, 1], [.25, .25, .25, .25]],
                 2: [[0, 0, .5, .5], [1, 0, 0, 0]]}}
D3_ROWS = {1: {0: [[0, .5, .5], [.2, .3, .5]], 1: [[0, 1, 0], [.25, .25, .5]]},
           2: {0: [[.25, .25, .25, .25], [0, 0, 1, 0]], 1: [[0, 0, 0, 1], [.25, .25, .25, .25]],
               2: [[0, .5, .5, 0], [1, 0, 0, 0]]}}


def test_the_divergence_grid_is_the_mean_js_divergence_per_layer_and_head_by_hand() -> None:
    """JS([.5,.5,0], [0,.5,.5]) = 0.5 bit (m = [.25,.5,.25]: each side's KL to m is 0.5 bit); disjoint rows: 1 bit;
    identical rows: 0. A layer D3 skipped at a step is averaged over the steps where it ran."""
    full = rows_run("full", [5, 6, 7], FULL_ROWS)
    d3 = rows_run("d3", [5, 6, 7], D3_ROWS)
    grid, counted = divergence_grid(d3, full)
    assert grid.shape == (3, 2)  # layers x heads
    want = np.array([[(0.5 + 0.0) / 2, (0.0 + 1.0) / 2],   # layer 0: head 0 differs at step 1, head 1 at step 2
                     [(1.0 + 0.0) / 2, 0.0],                 # layer 1: head 0 disjoint at step 1
                     [0.5, 0.0]])                            # layer 2: step 2 only ([0,0,.5,.5] vs [0,.5,.5,0])
    np.testing.assert_allclose(grid, want, atol=1e-6)
    assert counted.tolist() == [2, 2, 1]
    fig = divergence_overview(d3, full)
    heat = by_role(fig, "attention-divergence")[0]
    np.testing.assert_allclose(np.asarray(heat.z, dtype=float), want.T, atol=1e-6)  # heads down, layers across
    assert list(heat.x) == [0, 1, 2] and list(heat.y) == [0, 1]
    assert np.asarray(heat.customdata).tolist()[1][2] == [2, 1]  # each cell carries (layer, head) for the click
    assert fig.layout.coloraxis.cmin == 0 and fig.layout.coloraxis.cmax == pytest.approx(want.max())


def test_the_divergence_is_averaged_over_the_tokens_both_runs_read_alike() -> None:
    """After the texts differ the two runs attend over different tokens: those steps are left out, and said."""
    full = rows_run("full", [5, 6, 7], FULL_ROWS)
    d3 = rows_run("d3", [5, 9, 7], D3_ROWS)  # differs at token 1: step 1 still read the same text, step 2 not
    grid, counted = divergence_grid(d3, full)
    assert counted.tolist() == [1, 1, 0]
    np.testing.assert_allclose(grid[:2], [[0.5, 0.0], [1.0, 0.0]], atol=1e-6)
    assert np.isnan(grid[2]).all()  # D3 skipped layer 2 on the one step compared: grey, not 0
    fig = divergence_overview(d3, full)
    grey = np.asarray(by_role(fig, "skipped-cells")[0].z, dtype=float)
    assert np.isfinite(grey).tolist() == [[False, False, True], [False, False, True]]
    assert "mean of token 1" in title_text(fig)


def test_the_overview_title_is_short_and_the_figure_fits_a_1280x800_screen() -> None:
    fig = divergence_overview(D3, FULL)
    head = fig.layout.title.text.split("<br>")[0]
    assert head == "Where D3 changes attention" and "<sub>" not in head  # one line: it does not wrap
    assert len(fig.layout.title.text.split("<br>")) == 3  # the head and two short notes
    assert fig.layout.height <= 500 and divergence_overview(D3, FULL, presentation=True).layout.height <= 600
    assert "tokens 1–2" in title_text(fig) and "click" in title_text(fig)


def test_the_overview_of_a_real_run_records_every_layer(tiny_engine) -> None:
    gen = GenerationConfig(max_new_tokens=8, stop_at_eos=False)
    trace_cfg = TraceConfig(attention_layers=tuple(range(tiny_engine.num_layers)))
    d3 = tiny_engine.generate("hello world", D3Config(alpha=0.9, core_head=1, core_tail=1), gen, trace_cfg)
    full = tiny_engine.generate("hello world", FullConfig(), gen, trace_cfg)
    grid, counted = divergence_grid(d3, full)
    assert grid.shape == (tiny_engine.num_layers, full.num_heads)
    assert counted[0] > 0 and np.nanmax(grid) > 1e-4  # skipped layers changed what later layers attend to
    assert np.nanmin(grid) >= 0 and np.nanmax(grid) <= 1
    assert grid[0].max() < 1e-3  # layer 0 reads the same input in both runs: the same attention


def test_the_overviews_colour_bar_lies_under_the_plot_so_the_cells_get_the_width() -> None:
    """Looked at on a phone (390x844): with the colour bar at the side, 30 layers had 6 px each. The bar lies under
    the plot, across, and the right margin is a plain one."""
    for presentation in (False, True):
        fig = divergence_overview(D3, FULL, presentation=presentation)
        bar = fig.layout.coloraxis.colorbar
        assert bar.orientation == "h" and bar.yref == "container" and bar.y == 0
        assert fig.layout.margin.r <= 30 and fig.layout.margin.b >= 4 * (22 if presentation else 16) - 10


def test_js_divergence_normalises_each_row_and_counts_zero_weights_as_nothing() -> None:
    """Half of each row's weight on a shared key: 0.5 bit, whatever scale (float16 rows sum to 1 only roughly);
    the same row twice: 0; rows on disjoint keys: 1 bit, the most there is."""
    assert js_divergence(np.array([1, 1, 0], dtype=np.float16), np.array([0, 2, 2])) == pytest.approx(0.5)
    assert js_divergence(np.array([.2, .3, .5]), np.array([.2, .3, .5])) == pytest.approx(0.0, abs=1e-12)
    assert js_divergence(np.array([1, 0]), np.array([0, 1])) == pytest.approx(1.0)
