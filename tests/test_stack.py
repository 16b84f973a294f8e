"""viz/stack.py: the animated layer stack, checked on the data in its frames (boxes, path, arrows, caption)."""

from __future__ import annotations

from pathlib import Path

import plotly
import plotly.graph_objects as go
import pytest

from d3.config import D3Config, GenerationConfig, TraceConfig
from d3.trace import RAN, TokenStep, Trace
from tests.figures import message
from viz.layout import CELL_COLORS, FILL_COLORS
from viz.stack import BOX_RIGHT, DETOUR_X, PATH_X, caption, fills, layer_stack

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


def frames(fig: go.Figure) -> list[go.Frame]:
    """The figure's animation frames, one per token: carried by the slider's steps (gradio drops `figure.frames`)."""
    return [go.Frame(step.args[0][0]) for step in fig.layout.sliders[0].steps]


def boxes(data) -> object:
    return next(t for t in data if (t.meta or {}).get("role") == "layer-boxes")


def role(data, name: str):
    return next(t for t in data if (t.meta or {}).get("role") == name)


def arrows(annotations) -> list:
    return [a for a in annotations if (a.name or "").startswith("copy ") and a.arrowhead and a.visible is not False]


def pairs(annotations) -> list[tuple[int, int]]:
    """(source, copied layer) of each copy arrow, as it names them."""
    return sorted(tuple(int(k) for k in a.name[len("copy "):].split("->")) for a in arrows(annotations))


def test_one_frame_per_token_with_play_pause_and_a_step_slider_on_the_scrubbed_token() -> None:
    fig = layer_stack(TRACE, 1)
    slider = fig.layout.sliders[0]
    assert len(slider.steps) == 3 and slider.active == 1
    assert all(s.method == "animate" for s in slider.steps)
    # Each frame moves the slider along while it plays.
    assert [frame.layout.sliders[0].active for frame in frames(fig)] == [0, 1, 2]
    play, pause = fig.layout.updatemenus[0].buttons
    played = [go.Frame(f) for f in play.args[0]]
    assert [f.layout.sliders[0].active for f in played] == [1, 2]  # from the token shown on
    assert play.args[1]["frame"]["duration"] > 0
    assert list(pause.args[0]) == [None]
    last = layer_stack(TRACE).layout.updatemenus[0].buttons[0]
    assert [f["layout"]["sliders"][0]["active"] for f in last.args[0]] == [0, 1, 2]  # the last shown: from the start
    # The figure as first drawn is the scrubbed token's frame; by default (streaming) the last one.
    assert list(boxes(fig.data).text) == list(boxes(frames(fig)[1].data).text)
    assert layer_stack(TRACE).layout.sliders[0].active == 2
    assert not fig.frames  # gradio's plot drops figure.frames: the steps and the button carry them


def test_without_animation_only_the_shown_token_is_drawn() -> None:
    still, animated = layer_stack(TRACE, 1, animate=False), layer_stack(TRACE, 1)
    assert not still.layout.sliders and not still.layout.updatemenus
    assert list(boxes(still.data).marker.color) == list(boxes(frames(animated)[1].data).marker.color)
    assert pairs(still.layout.annotations) == [(1, 2), (1, 3)]


@pytest.mark.parametrize("index", range(3))
def test_boxes_are_coloured_for_exactly_the_layers_that_ran(index: int) -> None:
    frame = frames(layer_stack(TRACE))[index]
    colors = list(boxes(frame.data).marker.color)
    ran = [k for k, c in enumerate(colors) if c == CELL_COLORS[RAN]]
    assert ran == list(TRACE.steps[index].layers_run)
    assert all(c != CELL_COLORS[RAN] for k, c in enumerate(colors) if k not in ran)


def test_the_path_goes_through_the_layers_that_ran_and_around_the_skipped_ones() -> None:
    path = role(frames(layer_stack(TRACE))[1].data, "path")
    assert list(path.y) == list(range(L))
    assert list(path.x) == [PATH_X, PATH_X, DETOUR_X, DETOUR_X, PATH_X, PATH_X]
    assert [k for k, size in enumerate(path.marker.size) if size > 0] == [0, 1, 4, 5]


def test_every_frame_sets_as_many_annotations_so_none_stays_behind() -> None:
    # plotly.js merges a frame's annotations into the shown ones item by item: a frame with fewer would leave the
    # previous token's arrows on screen.
    fig = layer_stack(TRACE, 1)
    counts = {len(frame.layout.annotations) for frame in frames(fig)}
    assert counts == {6}  # the caption, the line out of layer 1 and token 1's two arrows (lane, head): the most
    unused = [a for a in frames(fig)[2].layout.annotations if a.visible is False]
    assert len(unused) == 5 and all(a.visible is True for a in frames(fig)[1].layout.annotations)


def test_each_copied_layer_gets_an_arrow_from_its_recorded_source() -> None:
    fig = layer_stack(TRACE, 1)
    drawn = pairs(frames(fig)[1].layout.annotations)
    assert drawn == [(1, 2), (1, 3)]  # tail at the source layer, head at the copied layer
    assert all(a.arrowcolor == FILL_COLORS["copy"] for a in arrows(frames(fig)[1].layout.annotations))
    assert pairs(fig.layout.annotations) == drawn  # the first drawn frame too
    # Within one source the shorter arrow sits nearer the boxes, so they never cross.
    inner, outer = sorted(arrows(frames(fig)[1].layout.annotations), key=lambda a: a.y)
    assert inner.ax < outer.ax
    labels = list(boxes(frames(fig)[1].data).text)
    assert labels[2:4] == ["copied from 1", "copied from 1"]


def test_each_copy_arrow_ends_on_the_box_it_fills() -> None:
    """Issue 35: the arrows ended 85-150 px right of the boxes they fill, in their lane. The head now ends on the
    filled box's right edge, at its height, coming in from the lane where the line from the source runs."""
    fig = layer_stack(TRACE, 1)
    for frame in (frames(fig)[1], fig):
        heads = arrows(frame.layout.annotations)
        assert heads and all(a.x == BOX_RIGHT and a.ay == a.y and a.ax > BOX_RIGHT and not a.standoff for a in heads)
        lanes = {a.name[len("lane "):]: a for a in frame.layout.annotations if (a.name or "").startswith("lane ")}
        for head in heads:  # the lane runs from the source's height to the filled layer's, where the head starts
            lane = lanes[head.name[len("copy "):]]
            source, layer = (int(k) for k in head.name[len("copy "):].split("->"))
            assert (lane.ax, lane.ay, lane.x, lane.y) == (head.ax, source, head.ax, layer)


def test_the_source_is_drawn_as_recorded_never_worked_out_again() -> None:
    # Layer 3 copied from layer 5 (the recorded source, not the nearest lower layer that ran): the arrow points down.
    trace = make_trace(step(0, "a", (0, 1, 2, 5), ((3, "copy", 5), (4, "copy", 2))))
    drawn = pairs(frames(layer_stack(trace))[0].layout.annotations)
    assert drawn == [(2, 4), (5, 3)]


def test_a_trace_without_sources_draws_no_copy_arrow_but_marks_the_copies() -> None:
    trace = make_trace(step(0, "a", (0, 1, 4, 5), ((2, "copy"), (3, "copy"))))  # today's (layer, how) shape
    assert [f.source for f in fills(trace.steps[0])] == [None, None]
    frame = frames(layer_stack(trace))[0]
    assert arrows(frame.layout.annotations) == []
    markers = role(frame.data, "fill-markers")
    assert list(markers.y) == [2, 3] and list(markers.marker.color) == [FILL_COLORS["copy"]] * 2
    assert list(boxes(frame.data).text)[2:4] == ["copied", "copied"]


def test_propagate_and_holes_get_markers_in_their_colours() -> None:
    frame = frames(layer_stack(TRACE))[2]
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
    for i, frame in enumerate(frames(fig)):
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
    frame = frames(layer_stack(saved))[0]
    assert [k for k, c in enumerate(boxes(frame.data).marker.color) if c == CELL_COLORS[RAN]] == [0, 1, 5]


def test_a_real_run_on_the_tiny_model(tiny_engine) -> None:
    trace = tiny_engine.generate("hello world", D3Config(alpha=0.7, core_head=1, core_tail=1),
                                 GenerationConfig(max_new_tokens=5, stop_at_eos=False), TraceConfig(attention_layers=(2,)))
    fig = layer_stack(trace, 2)
    assert len(frames(fig)) == len(trace.steps) == 5
    assert any(s.filled for s in trace.steps)  # the decay skipped something to draw
    for s, frame in zip(trace.steps, frames(fig)):
        colors = list(boxes(frame.data).marker.color)
        assert [k for k, c in enumerate(colors) if c == CELL_COLORS[RAN]] == list(s.layers_run)
        sourced = sorted((f.source, f.layer) for f in fills(s) if f.how == "copy" and f.source is not None)
        assert pairs(frame.layout.annotations) == sourced


CHROMIUM = Path("/usr/bin/chromium")
SHOWN = """() => { const gd = document.getElementById('stack');
    return {active: gd.layout.sliders[0].active,
            ran: gd.data[0].marker.color.filter(c => c === 'RAN_COLOR').length,
            arrows: gd.layout.annotations.filter(a => (a.name || '').startsWith('copy ') && a.arrowhead
                                                      && a.visible !== false).map(a => a.name.slice(5).split('->').map(Number)),
            caption: gd.layout.annotations.find(a => a.name === 'caption').text}; }""".replace("RAN_COLOR", CELL_COLORS[RAN])


@pytest.mark.browser
def test_play_and_step_work_in_chromium_as_gradio_draws_the_figure(tmp_path) -> None:
    """Gradio's plot draws `Plotly.react(div, data, layout)` (no figure.frames): play, pause and the slider still
    work, and a token with fewer fills leaves none of the previous token's arrows behind."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    trace = make_trace(*(step(i, f" w{i}", (0, 1, 4, 5), ((2, "copy", 1), (3, "copy", 1))) if i % 2 else
                         step(i, f" w{i}", tuple(range(L))) for i in range(8)))
    fig = layer_stack(trace, 1)
    page_file = tmp_path / "stack.html"
    plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    page_file.write_text(f"<html><head><meta charset='utf-8'><script src='{plotly_js.as_uri()}'></script></head><body>"
                         f"<div id='stack' style='width:390px;height:700px'></div><script>const fig = {fig.to_json()};"
                         "Plotly.react('stack', fig.data, fig.layout);</script></body></html>", encoding="utf-8")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 390, "height": 800})
        page.goto(page_file.as_uri())
        page.wait_for_function("() => document.getElementById('stack').layout")
        shown = page.evaluate(SHOWN)
        assert shown["active"] == 1 and shown["ran"] == 4 and sorted(shown["arrows"]) == [[1, 2], [1, 3]]
        page.get_by_text("▶ play").click()  # one token per 0.7 s, from token 1
        page.wait_for_function("() => document.getElementById('stack').layout.sliders[0].active >= 2", timeout=10_000)
        page.get_by_text("❚❚ pause").click()
        page.wait_for_timeout(1500)
        paused = page.evaluate(SHOWN)
        page.wait_for_timeout(1500)
        assert page.evaluate(SHOWN) == paused  # pause holds
        i = paused["active"]
        assert paused["caption"].replace("<br>", " ") == caption(trace, i)
        assert paused["ran"] == len(trace.steps[i].layers_run)
        assert sorted(paused["arrows"]) == ([[1, 2], [1, 3]] if i % 2 else [])
        rail = page.locator(".slider-rail-rect").bounding_box()  # step: a click on the slider's first tick
        page.mouse.click(rail["x"] + 2, rail["y"] + rail["height"] / 2)
        # the slider marks the tick at once and the frame's caption follows with the animation: wait for both
        page.wait_for_function(f"() => {{ const s = ({SHOWN})(); return s.active === 0 && s.caption.startsWith('token 0 '); }}")
        first = page.evaluate(SHOWN)
        assert first["ran"] == L and first["arrows"] == [] and first["caption"].startswith("token 0 ")
        browser.close()


@pytest.mark.browser
@pytest.mark.parametrize("width, presentation", [(643, False), (1380, True)])
def test_the_sliders_last_token_label_is_not_cut_at_the_figures_right_edge(tmp_path, width, presentation) -> None:
    """The screenshots (issue 44.7) showed "7 ␣becaus" for SmolLM2's last token and "3 ␣blu" for Qwen's in
    presentation mode: the last label is centred on the slider's last tick, at the plot's right edge, and half of it
    lay outside the figure. Every step label lies inside the figure at the layer stack's widths on the page."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    words = ["The", " sky", " looks", " blue", " during", " the", " day", " because"]
    trace = make_trace(*(step(i, w, tuple(range(L))) for i, w in enumerate(words)))
    fig = layer_stack(trace, presentation=presentation)
    page_file = tmp_path / "stack.html"
    plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    page_file.write_text(f"<html><head><meta charset='utf-8'><script src='{plotly_js.as_uri()}'></script></head>"
                         f"<body style='margin:0'><div id='stack' style='width:{width}px;height:700px'></div><script>"
                         f"const fig = {fig.to_json()}; Plotly.react('stack', fig.data, fig.layout);</script></body>"
                         "</html>", encoding="utf-8")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": width + 40, "height": 800})
        page.goto(page_file.as_uri())
        page.wait_for_selector(".slider-label")
        right = page.evaluate("() => document.querySelector('#stack .main-svg').getBoundingClientRect().right")
        labels = page.evaluate("() => Array.from(document.querySelectorAll('#stack .slider-label'))"
                               ".map(t => [t.textContent, t.getBoundingClientRect().right])")
        browser.close()
    assert [t for t, _ in labels][-1].startswith("7 "), labels
    assert all(edge <= right for _, edge in labels), (right, labels)
