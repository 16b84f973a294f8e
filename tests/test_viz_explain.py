"""viz/lens.py and viz/scrub.py: the logit-lens heatmap and the token scrubber, checked on the data they draw."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from d3.config import D3Config, FullConfig
from d3.trace import FILLED_COPY, RAN, Trace, prediction_depth
from tests.figures import title_text
from tests.traces import make_trace
from viz.layout import CELL_COLORS
from viz.lens import has_lens, lens_arrays, logit_lens_heatmap
from viz.scrub import full_context_agrees, scrub_html, token_layers, topk_compare

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

L = 12


def with_lens(trace: Trace, seed: int = 0) -> Trace:
    """Give every step a lens: rank 0 from a random depth up (rank 3 below it), probabilities rising with depth."""
    rng = np.random.default_rng(seed)
    steps = []
    for s in trace.steps:
        settle = int(rng.integers(0, L))
        ran = set(s.layers_run)
        rank = tuple((0 if layer >= settle else 3) if layer in ran else -1 for layer in range(L))
        prob = tuple((layer + 1) / L if layer in ran else float("nan") for layer in range(L))
        lens = tuple((s.text if layer >= settle else " x") if layer in ran else "" for layer in range(L))
        steps.append(replace(s, lens_rank=rank, lens_prob=prob, logit_lens=lens))
    return trace.with_steps(steps)


@pytest.fixture(scope="module")
def d3_trace() -> Trace:
    return with_lens(make_trace(D3Config(alpha=0.8, core_head=2, core_tail=2), num_layers=L, steps=10))


@pytest.fixture(scope="module")
def full_trace() -> Trace:
    # Same tokens as the D3 trace up to position 6, different from there on.
    ids = [i % 12 for i in range(10)]
    ids[6] = 11 if ids[6] != 11 else 10
    return make_trace(FullConfig(), num_layers=L, steps=10, token_ids=ids)


def trace_by_role(fig, role: str):
    found = [t for t in fig.data if (t.meta or {}).get("role") == role]
    assert len(found) == 1, f"expected one {role} trace, got {len(found)}"
    return found[0]


# -- prediction depth -------------------------------------------------------------------------------
@pytest.mark.parametrize("row, expected", [
    ([3, 0, 2, 0, 0], 3),     # settles after the last miss
    ([0, 0, 0, 0, 0], 0),     # top-1 from the first layer
    ([0, -1, -1, 0, 0], 0),   # layers that did not run do not break the streak
    ([2, -1, 0, -1, 0], 2),   # the first layer of the streak is a layer that ran
    ([0, 0, 0, 0, 1], None),  # the last layer that ran does not rank it first: sampled
    ([-1, -1, -1, -1, -1], None),
])
def test_prediction_depth(row, expected):
    got = prediction_depth(np.array([row]))[0]
    assert (math.isnan(got) if expected is None else got == expected)


def test_lens_arrays_refuse_a_trace_without_lens():
    plain = make_trace(FullConfig(), num_layers=L, steps=3)
    assert not has_lens(plain)
    with pytest.raises(ValueError, match="logit_lens=True"):
        lens_arrays(plain)


# -- the heatmap -------------------------------------------------------------------------------------
def test_heatmap_draws_lens_probability_with_the_skip_mask_over_it(d3_trace):
    fig = logit_lens_heatmap(d3_trace)
    prob, rank = lens_arrays(d3_trace)
    skipped = (d3_trace.grid() != RAN)  # [T, L]
    assert skipped.any() and (~skipped).any()
    heat = trace_by_role(fig, "lens")
    z = np.array(heat.z, dtype=float)  # [L, T]
    assert z.shape == (L, len(d3_trace.steps))
    assert np.array_equal(np.isnan(z), skipped.T)
    assert np.allclose(z[~skipped.T], prob.T[~skipped.T])
    mask = np.array(trace_by_role(fig, "skip-mask").z, dtype=float)
    assert np.array_equal(np.isfinite(mask), skipped.T)
    hatch = trace_by_role(fig, "hatch")
    assert len(hatch.x) == skipped.sum()
    assert set(zip(hatch.x, hatch.y)) == {(d3_trace.steps[t].step, layer) for t, layer in zip(*np.nonzero(skipped))}
    assert heat.meta["token_axis"] == "x"


def test_heatmap_prediction_depth_line_and_hover(d3_trace):
    fig = logit_lens_heatmap(d3_trace)
    _, rank = lens_arrays(d3_trace)
    line = trace_by_role(fig, "prediction-depth")
    assert np.allclose(np.array(line.y, dtype=float), prediction_depth(rank), equal_nan=True)
    assert "mean prediction depth" in fig.layout.title.text
    hover = np.array(trace_by_role(fig, "lens").text)  # [L, T]
    t, layer = next((t, l) for t, s in enumerate(d3_trace.steps) for l in range(L) if s.cells(L)[l] == FILLED_COPY)
    source = d3_trace.steps[t].fill_sources(L)[layer]
    assert source >= 0 and f"copying layer {source}" in hover[layer, t]
    t, layer = 0, L - 1
    assert "lens top-1" in hover[layer, t] and f"rank {rank[t, layer] + 1}" in hover[layer, t]


def test_heatmap_marks_first_divergence_and_selected_token(d3_trace, full_trace):
    fig = logit_lens_heatmap(d3_trace, reference=full_trace, selected=4)
    lines = [s for s in fig.layout.shapes if s.type == "line" and s.yref == "y domain" and s.x0 == s.x1]
    assert [s.x0 for s in lines] == [5.5]  # the left edge of token 6
    assert any("first divergence" in a.text for a in fig.layout.annotations)
    rects = [s for s in fig.layout.shapes if s.name == "selected"]
    assert len(rects) == 1 and (rects[0].x0, rects[0].x1) == (3.5, 4.5)
    assert not [s for s in logit_lens_heatmap(d3_trace).layout.shapes if s.name == "selected"]


# -- the scrubber -------------------------------------------------------------------------------------
def test_token_layers_colours_and_labels_each_layer(d3_trace):
    index = len(d3_trace.steps) - 1
    step = d3_trace.steps[index]
    cells = step.cells(L)
    fig = token_layers(d3_trace, index)
    bars = trace_by_role(fig, "token-layers")
    assert list(bars.marker.color) == [CELL_COLORS[int(c)] for c in cells]
    for layer in range(L):
        if cells[layer] == FILLED_COPY:
            assert f"copied from layer {step.fill_sources(L)[layer]}" in bars.text[layer]
        elif cells[layer] == RAN:
            assert f"p = {step.lens_prob[layer]:.2f}" in bars.text[layer]
    assert f"{step.n_layers} of {L} layers ran" in fig.layout.title.text


def test_full_context_agrees_up_to_and_including_the_first_divergence(d3_trace, full_trace):
    assert [full_context_agrees(d3_trace, full_trace, i) for i in range(10)] == [True] * 7 + [False] * 3
    assert not full_context_agrees(d3_trace, None, 0)


def test_topk_compares_with_full_depth_only_where_the_context_agrees(d3_trace, full_trace):
    same = topk_compare(d3_trace, 6, full_trace)  # the first divergence: same context, different pick
    names = [t.name for t in same.data]
    assert names == ["D3", "full depth"]
    d3_bar, full_bar = same.data
    d3_probs = {tid: p for tid, _, p in d3_trace.steps[6].topk}
    ticks = list(same.layout.yaxis.ticktext)
    assert len(ticks) == len(d3_bar.x) == len(full_bar.x)
    assert sorted(p for p in d3_bar.x if p) == sorted(d3_probs.values())
    assert any(t.endswith("◀ D3") for t in ticks) and any(t.endswith("◀ full") for t in ticks)
    after = topk_compare(d3_trace, 8, full_trace)
    assert [t.name for t in after.data] == ["D3"]
    assert "different text from token 6" in title_text(after) and not after.layout.showlegend


def test_scrub_html_names_layers_fills_and_reference(d3_trace, full_trace):
    index = len(d3_trace.steps) - 1
    step = d3_trace.steps[index]
    card = scrub_html(d3_trace, index, full_trace)
    assert f'data-step="{step.step}"' in card
    assert f"Ran {step.n_layers} of {L} layers" in card
    copied = [(layer, source) for layer, how, source in step.filled if how == "copy"]
    assert copied and f"copied from layer {copied[0][1]}" in card
    assert "prediction depth" in card and "different text from token 6" in card
    assert "First divergence" in scrub_html(d3_trace, 6, full_trace)
    assert "the same token" in scrub_html(d3_trace, 2, full_trace)


def test_scrub_html_escapes_token_text():
    trace = make_trace(FullConfig(), num_layers=4, steps=7)  # WORDS[6] is " <b>mat</b>"
    card = scrub_html(trace, 6)
    assert "&lt;b&gt;mat" in card and "<b>mat" not in card
