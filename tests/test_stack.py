"""viz/stack.py: the animated layer stack, checked on the data in its frames (boxes, path, arrows, caption)."""

from __future__ import annotations

import pytest

from d3.config import D3Config, GenerationConfig, TraceConfig
from d3.trace import RAN, TokenStep, Trace
from viz.layout import CELL_COLORS, FILL_COLORS
from viz.stack import DETOUR_X, PATH_X, caption, fills, layer_stack
from tests.figures import message

L = 6
CORE = (1, 1)


def step(i: int, text: str, ran: tuple[int, ...], filled: tuple = ()) -> TokenStep:
    return TokenStep(step=i, token_id=i, text=text, layers_run=ran, filled=filled, planned=len(ran), entropy=1.0,
                     wall_ms=1.0)


def make_trace(*steps: TokenStep) -> Trace:
    return Trace(model="tiny", num_layers=L, strategy={"strategy": "d3", "alpha": 0.9}, prompt="p", core=CORE,
                 steps=tuple(steps))


# Three tokens: full depth; layers 2-3 copied from 1 (source recorded); layer 3 propagated and 4 a hole.
TRACE = make_trace(
    step(0, "The", tuple(range(L))),
    step(1, " blue", (0, 1, 4, 5), ((2, "copy", 1), (3, "copy", 1))),
    step(2, "<b>", (0, 1, 2, 5), ((3, "propagate", None), (4, "none", None))),
)


def boxes(data) -> object:
    return next(t for t in data if (t.meta or {}).get("role") == "layer-boxes")


def role(data, name: str):
    return next(t for t in data if (t.meta or {}).get("role") == name)


def arrows(annotations) -> list:
    return [a for a in annotations if (a.name or "").startswith("copy ") and a.arrowhead]


def test_one_frame_per_token_with_play_pause_and_a_step_slider_on_the_scrubbed_token() -> None:
    fig = layer_stack(TRACE, 1)
    assert [f.name for f in fig.frames] == ["0", "1", "2"]
    slider = fig.layout.sliders[0]
    assert slider.active == 1
    assert [list(s.args[0]) for s in slider.steps] == [["0"], ["1"], ["2"]]
    assert all(s.method == "animate" for s in slider.steps)
    play, pause = fig.layout.updatemenus[0].buttons
    assert play.args[0] is None and play.args[1]["fromcurrent"] and play.args[1]["frame"]["duration"] > 0
    assert list(pause.args[0]) == [None]
    # The figure as first drawn is the scrubbed token's frame; by default (streaming) the last one.
    assert list(boxes(fig.data).text) == list(boxes(fig.frames[1].data).text)
    assert layer_stack(TRACE).layout.sliders[0].active == 2


def test_without_animation_only_the_shown_token_is_drawn() -> None:
    still, animated = layer_stack(TRACE, 1, animate=False), layer_stack(TRACE, 1)
    assert not still.frames and not still.layout.sliders and not still.layout.updatemenus
    assert list(boxes(still.data).marker.color) == list(boxes(animated.frames[1].data).marker.color)
    assert sorted((a.ay, a.y) for a in arrows(still.layout.annotations)) == [(1, 2), (1, 3)]


@pytest.mark.parametrize("index", range(3))
def test_boxes_are_coloured_for_exactly_the_layers_that_ran(index: int) -> None:
    frame = layer_stack(TRACE).frames[index]
    colors = list(boxes(frame.data).marker.color)
    ran = [k for k, c in enumerate(colors) if c == CELL_COLORS[RAN]]
    assert ran == list(TRACE.steps[index].layers_run)
    assert all(c != CELL_COLORS[RAN] for k, c in enumerate(colors) if k not in ran)


def test_the_path_goes_through_the_layers_that_ran_and_around_the_skipped_ones() -> None:
    path = role(layer_stack(TRACE).frames[1].data, "path")
    assert list(path.y) == list(range(L))
    assert list(path.x) == [PATH_X, PATH_X, DETOUR_X, DETOUR_X, PATH_X, PATH_X]
    assert [k for k, size in enumerate(path.marker.size) if size > 0] == [0, 1, 4, 5]


def test_each_copied_layer_gets_an_arrow_from_its_recorded_source() -> None:
    fig = layer_stack(TRACE, 1)
    drawn = sorted((a.ay, a.y) for a in arrows(fig.frames[1].layout.annotations))
    assert drawn == [(1, 2), (1, 3)]  # tail at the source layer, head at the copied layer
    assert all(a.arrowcolor == FILL_COLORS["copy"] for a in arrows(fig.frames[1].layout.annotations))
    assert sorted((a.ay, a.y) for a in arrows(fig.layout.annotations)) == drawn  # the first drawn frame too
    # Within one source the shorter arrow sits nearer the boxes, so they never cross.
    inner, outer = sorted(arrows(fig.frames[1].layout.annotations), key=lambda a: a.y)
    assert inner.x < outer.x
    labels = list(boxes(fig.frames[1].data).text)
    assert labels[2:4] == ["copied from 1", "copied from 1"]


def test_the_source_is_drawn_as_recorded_never_worked_out_again() -> None:
    # Layer 3 copied from layer 5 (the recorded source, not the nearest lower layer that ran): the arrow points down.
    trace = make_trace(step(0, "a", (0, 1, 2, 5), ((3, "copy", 5), (4, "copy", 2))))
    drawn = sorted((a.ay, a.y) for a in arrows(layer_stack(trace).frames[0].layout.annotations))
    assert drawn == [(2, 4), (5, 3)]


def test_a_trace_without_sources_draws_no_copy_arrow_but_marks_the_copies() -> None:
    trace = make_trace(step(0, "a", (0, 1, 4, 5), ((2, "copy"), (3, "copy"))))  # today's (layer, how) shape
    assert [f.source for f in fills(trace.steps[0])] == [None, None]
    frame = layer_stack(trace).frames[0]
    assert arrows(frame.layout.annotations) == []
    markers = role(frame.data, "fill-markers")
    assert list(markers.y) == [2, 3] and list(markers.marker.color) == [FILL_COLORS["copy"]] * 2
    assert list(boxes(frame.data).text)[2:4] == ["copied", "copied"]


def test_propagate_and_holes_get_markers_in_their_colours() -> None:
    frame = layer_stack(TRACE).frames[2]
    markers = role(frame.data, "fill-markers")
    assert list(markers.y) == [3, 4]
    assert list(markers.marker.color) == [FILL_COLORS["propagate"], FILL_COLORS["none"]]
    assert list(markers.hovertext) == ["layer 3: propagated", "layer 4: hole"]
    assert arrows(frame.layout.annotations) == []
    assert list(boxes(frame.data).text)[3:5] == ["propagated", "hole (masked)"]


def test_each_frame_has_its_caption() -> None:
    assert caption(TRACE, 0) == "token 0 'The': 6 of 6 layers ran"
    assert caption(TRACE, 1) == "token 1 '␣blue': 4 of 6 layers ran, 2 filled by copy"
    assert caption(TRACE, 2) == "token 2 '&lt;b&gt;': 4 of 6 layers ran, 1 by propagate, 1 left as holes"
    fig = layer_stack(TRACE)
    for i, frame in enumerate(fig.frames):
        note = next(a for a in frame.layout.annotations if a.name == "caption")
        assert note.text.replace("<br>", " ") == caption(TRACE, i)


def test_core_layers_are_banded_and_labelled() -> None:
    fig = layer_stack(TRACE)
    bands = [(s.y0, s.y1) for s in fig.layout.shapes if s.type == "rect"]
    assert bands == [(-0.5, CORE[0] - 0.5), (L - CORE[1] - 0.5, L - 0.5)]
    assert list(fig.layout.yaxis.ticktext) == ["0 core", "1 flex", "2 flex", "3 flex", "4 flex", "5 core"]


def test_presentation_mode_has_larger_text_and_the_figure_keeps_to_its_box() -> None:
    plain, big = layer_stack(TRACE), layer_stack(TRACE, presentation=True)
    assert big.layout.yaxis.tickfont.size > plain.layout.yaxis.tickfont.size
    assert boxes(big.data).insidetextfont.size > boxes(plain.data).insidetextfont.size
    assert plain.layout.width is None  # takes its box's width: a phone's 390 px too
    thirty = Trace(model="m", num_layers=30, strategy={"strategy": "full"}, prompt="p", core=(3, 3),
                   steps=(step(0, "a", tuple(range(30))),))
    assert 480 <= layer_stack(thirty).layout.height <= 1100


def test_bad_input_and_no_tokens() -> None:
    with pytest.raises(ValueError, match=r"token=3 .* \[0, 2\]"):
        layer_stack(TRACE, 3)
    assert "No tokens yet" in message(layer_stack(make_trace()))


def test_a_saved_trace_in_todays_shape_reads_back() -> None:
    saved = Trace.from_dict(TRACE.with_steps([step(0, "a", (0, 1, 5), ((2, "copy"), (3, "copy"), (4, "copy")))])
                            .to_dict())
    frame = layer_stack(saved).frames[0]
    assert [k for k, c in enumerate(boxes(frame.data).marker.color) if c == CELL_COLORS[RAN]] == [0, 1, 5]


def test_a_real_run_on_the_tiny_model(tiny_engine) -> None:
    trace = tiny_engine.generate("hello world", D3Config(alpha=0.7, core_head=1, core_tail=1),
                                 GenerationConfig(max_new_tokens=5, stop_at_eos=False), TraceConfig(attention_layers=(2,)))
    fig = layer_stack(trace, 2)
    assert len(fig.frames) == len(trace.steps) == 5
    assert any(s.filled for s in trace.steps)  # the decay skipped something to draw
    for s, frame in zip(trace.steps, fig.frames):
        colors = list(boxes(frame.data).marker.color)
        assert [k for k, c in enumerate(colors) if c == CELL_COLORS[RAN]] == list(s.layers_run)
        sourced = sorted((f.source, f.layer) for f in fills(s) if f.how == "copy" and f.source is not None)
        assert sorted((a.ay, a.y) for a in arrows(frame.layout.annotations)) == sourced
