"""Issue 43, item 2: one state for the controls and the run, in headless Chromium, typed as a person types. The walk's
failures D2-D5 and M2, each a sequence of moves followed by what the boxes, the sliders, the curve, the status line
and the engines say, and a count of the requests the page sends once it is idle (0).

The page serves tiny random Llamas under the embedded models' names and layer counts (SmolLM2's 30, Qwen2.5-Coder's
28: D4 and D5 do not depend on depth, the 28-layer model stands for itself only by its layer count and its first
load). No timed claims: every wait is a hang guard."""

from __future__ import annotations

import re

import pytest

from tests.apphelpers import serve_engines, tiny_engines
from tests.pagehelpers import Watched

pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]
playwright_api = pytest.importorskip("playwright.sync_api")

GUARD_MS = 120_000


@pytest.fixture(scope="module")
def engines():
    return tiny_engines({"smollm2-135m": 30, "qwen2.5-coder-1.5b": 28})


@pytest.fixture(scope="module")
def url(engines):
    with serve_engines(engines) as address:
        yield address


@pytest.fixture()
def watched(browser, url, engines):
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.set_default_timeout(GUARD_MS)
    page.goto(url)
    page.wait_for_selector("#generate")
    page.wait_for_selector("#plot-decay .js-plotly-plot .main-svg")
    yield Watched(page)
    page.close()
    for engine in engines.values():
        engine.delay = 0.0


def steps(engines) -> int:
    return sum(e.steps for e in engines.values())


def type_as_a_person(page, box: str, value: str) -> None:
    """A click into the box, everything selected, the value typed one key at a time."""
    field = page.locator(f"{box} input[type=number]")
    field.click()
    field.press("Control+A")
    field.press_sequentially(value, delay=60)


# The core as every part of the page shows it: the boxes, the sliders' ends, the curve's core floor and D3's line.
CORE_SHOWN = """() => {
  const slider = (id) => { const r = document.querySelector(`#${id} input[type=range]`);
    return {value: Number(document.querySelector(`#${id} input[type=number]`).value), max: Number(r.max),
            disabled: r.disabled}; };
  const gd = document.querySelector('#plot-decay .js-plotly-plot');
  const floor = ((gd && gd.layout.annotations) || []).find(a => a.name === 'core-floor');
  const planned = ((gd && gd.data) || []).find(t => (t.meta || {}).role === 'planned' && (t.meta || {}).strategy === 'd3');
  return {head: slider('core-head'), tail: slider('core-tail'), floor: floor ? floor.text : null,
          line: planned ? planned.name : null};
}"""
CORES = re.compile(r"core (\d+)\s*\+\s*(\d+)")


def cores_named(texts: list[str]) -> set[tuple[int, int]]:
    return {(int(h), int(t)) for text in texts for h, t in CORES.findall(text)}


def switch_model(page, name: str) -> None:
    page.locator("#model input").click()
    page.get_by_role("option", name=name, exact=True).click()


# ---------------------------------------------------------------- D2: one value for a core typed past its end


@pytest.mark.parametrize("how", ["typed", "pasted"])
def test_d2_a_core_head_typed_past_its_end_is_one_value_on_the_boxes_the_curve_and_the_run(watched, engines,
                                                                                           how) -> None:
    """Walk D2 (30 layers, a fresh page): Core head 99 showed 26+3 in the boxes with the tail slider greyed at
    maximum 1, the curve "core 26+1", and Generate ran 26+3 while the status named a third value. Typed one key at a
    time, or pasted (one input event: no valid "9" settles the core first, as on a busy page where the browser
    sends only the last of several key presses)."""
    page = watched.page
    if how == "typed":
        type_as_a_person(page, "#core-head", "99")
    else:
        field = page.locator("#core-head input[type=number]")
        field.click()
        field.fill("99")
    page.locator("#core-head input[type=number]").press("Tab")
    assert watched.settle() == 0
    shown = page.evaluate(CORE_SHOWN)
    assert shown["head"]["value"] == 26 and shown["tail"]["value"] == 3, shown
    assert shown["tail"]["max"] == 3 and not shown["tail"]["disabled"], shown  # the tail keeps its 3 (26 + 3 < 30)
    assert shown["head"]["max"] == 26, shown
    assert shown["floor"] == "core floor<br>26+3=29", shown
    assert shown["line"] is None or "core 26+3" in shown["line"], shown
    assert "99" in watched.status() and "26" in watched.status()  # said once: what was typed, what the slider shows
    page.fill("#max-new-tokens input", "4")
    assert watched.settle() == 0
    mark = watched.mark()
    page.click("#generate")
    watched.wait_status("Done.")
    said = watched.since(mark)  # every status line from the click to the end of the run
    assert cores_named(said) <= {(26, 3)}, said
    assert not any("99" in s for s in said), said  # the run says no other value than the one it ran
    assert "core 26+3" in page.inner_text("#d3-title"), page.inner_text("#d3-title")
    assert watched.settle() == 0


# ---------------------------------------------------------------- D3: Stop never starts a run


@pytest.mark.parametrize("box, value", [("#alpha", "0.97"), ("#core-tail", "5")])
def test_d3_a_typed_value_then_stop_starts_no_run(watched, engines, box, value) -> None:
    """Walk D3: α 0.97 typed, then Stop, started a full run at 0.97 two seconds later; Core tail 5 + Enter said
    "Ready: press Generate", Stop said "Nothing is running", and a run started 3 s later (the click on Stop took the
    focus from the box: gradio sends that as the slider's release)."""
    page = watched.page
    before = steps(engines)
    type_as_a_person(page, box, value)
    if box == "#core-tail":
        page.locator(f"{box} input[type=number]").press("Enter")
    assert watched.settle() == 0
    mark = watched.mark()
    page.click("#stop")
    watched.wait_status("Nothing is running")
    assert watched.settle() == 0
    said = watched.since(mark)
    assert steps(engines) == before, said  # no decoding step: nothing ran
    assert not any("Generating" in s or "Prefill" in s or "Done." in s or "new run is asked" in s for s in said), said
    assert "Nothing is running" in watched.status()
    assert float(page.input_value(f"{box} input[type=number]")) == float(value)  # the value stays, for Generate


def test_d3_a_typed_value_then_a_click_elsewhere_starts_no_run_and_generate_runs_it(watched, engines) -> None:
    page = watched.page
    before = steps(engines)
    type_as_a_person(page, "#alpha", "0.97")
    page.click("#prompt textarea")
    assert watched.settle() == 0
    assert steps(engines) == before
    page.fill("#max-new-tokens input", "4")
    page.click("#generate")
    watched.wait_status("Done.")
    assert "α=0.97" in page.inner_text("#d3-title")
    assert watched.settle() == 0


# ---------------------------------------------------------------- D4 / D5: "Stopped." only after Stop


def test_d4_generate_during_a_run_never_says_stopped_while_the_new_run_comes(watched, engines) -> None:
    """Walk D4 (28 layers): "Stopped." showed after Generate while the run asked for was still coming."""
    page = watched.page
    switch_model(page, "qwen2.5-coder-1.5b")
    watched.wait_status("qwen2.5-coder-1.5b")
    assert watched.settle() == 0
    engines["qwen2.5-coder-1.5b"].delay = 0.3  # the first run outlasts the second click (a hang guard)
    page.fill("#max-new-tokens input", "12")
    mark = watched.mark()
    page.click("#generate")
    page.wait_for_function("() => document.querySelectorAll('#d3-pane .d3-tok').length >= 2", timeout=GUARD_MS)
    page.fill("#max-new-tokens input", "4")
    page.click("#generate")
    watched.wait_status("Done.")
    said = watched.since(mark)
    assert not any("Stopped" in s for s in said), said
    assert watched.settle() == 0
    assert "Stopped" not in watched.status()


def test_d5_a_model_switch_says_the_model_never_stopped(watched, engines) -> None:
    """Walk D5: "Stopped." showed after a model switch when nothing the person asked for was running; a run that
    the switch stops leaves the panes of the new model empty."""
    page = watched.page
    engines["smollm2-135m"].delay = 0.3
    page.fill("#max-new-tokens input", "12")
    page.click("#generate")
    page.wait_for_function("() => document.querySelectorAll('#d3-pane .d3-tok').length >= 2", timeout=GUARD_MS)
    mark = watched.mark()
    switch_model(page, "qwen2.5-coder-1.5b")
    watched.wait_status("qwen2.5-coder-1.5b")
    assert watched.settle() == 0
    said = watched.since(mark)
    assert not any("Stopped" in s for s in said), said
    assert "qwen2.5-coder-1.5b" in watched.status() and "press Generate" in watched.status()
    assert page.evaluate("() => document.querySelectorAll('#d3-pane .d3-tok').length") == 0  # the old run's gone
    mark = watched.mark()
    switch_model(page, "smollm2-135m")  # nothing runs: the switch back says the model, nothing else
    watched.wait_status("smollm2-135m")
    assert watched.settle() == 0
    assert not any("Stopped" in s for s in watched.since(mark)), watched.since(mark)


# ---------------------------------------------------------------- M2: a core reset gives back the page's own order


def drag(page, slider: str, fraction: float) -> None:
    """Move a slider as a hand does: press on its track, move, let go."""
    box = page.locator(f"{slider} input[type=range]").bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.5, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * fraction, y, steps=5)
    page.mouse.up()


@pytest.mark.parametrize("wait", [True, False], ids=["settled", "at-once"])
def test_m2_a_core_reset_gives_back_the_pages_order_and_curve_every_time(watched, engines, wait) -> None:
    """Walk M2: the core reset gave back the page's order in one of two tries; in the other the curve stayed at
    core 3+7. Three tries on one page, the reset pressed once the drag settled, or at once."""
    page = watched.page
    page.get_by_role("button", name=re.compile(r"^More controls")).click()
    page.wait_for_selector("#layer-order textarea", state="visible")
    order = page.input_value("#layer-order textarea")
    for attempt in range(3):
        drag(page, "#core-tail", 0.3)
        if wait:
            watched.settle()
            assert page.input_value("#layer-order textarea") != order  # re-fitted to the new core
        page.locator("#core-tail button.reset-button").click()
        assert watched.settle() == 0
        shown = page.evaluate(CORE_SHOWN)
        assert shown["tail"]["value"] == 3 and shown["head"]["value"] == 3, (attempt, shown)
        assert shown["floor"] == "core floor<br>3+3=6", (attempt, shown)
        assert page.input_value("#layer-order textarea") == order, (attempt, watched.status())
