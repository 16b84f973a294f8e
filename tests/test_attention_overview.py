"""viz/attention_overview.py: D3, full depth and their difference per head (or per layer), checked on the numbers."""

from __future__ import annotations

import numpy as np
import pytest

from d3.config import D3Config, FullConfig, GenerationConfig, TraceConfig
from d3.trace import PromptStats, TokenStep, Trace
from viz.attention_overview import attention_overview, compared_weights
from tests.figures import message, title_text

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
