"""What the page says matches what ran (issue 44), read in headless Chromium as a person reads it: one count per run
in the status line, each strategy named as itself (early exit is not "D3", and gets no core band), a view drawn after
a run that says so while Generate runs, presentation mode's small print a room can read, and the layer stack on a
1280x800 screen. One server per module on a tiny random Llama with SmolLM2's 30 layers, named as the embedded model
so the page shows what it shows for it."""

from __future__ import annotations

import pytest

from explorer.caps import Caps
from explorer.page import build_demo
from tests.apphelpers import CountingEngine, serve
from tests.pagehelpers import DESKTOP, TIMEOUT_MS, click_tab, open_page, show_tab, wait_for_status
from tests.tiny import tiny_llama, tiny_tokenizer

pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]
playwright_api = pytest.importorskip("playwright.sync_api")

MODEL = "smollm2-135m"
WIDE = {"width": 1920, "height": 1080}
STATUS = "() => document.querySelector('#status').innerText"


@pytest.fixture(scope="module")
def engine():
    return CountingEngine(tiny_llama(30), tiny_tokenizer(), name=MODEL)


@pytest.fixture(scope="module")
def url(engine):
    demo = build_demo(lambda name: engine, model_names=(MODEL,), public=False, caps=Caps(max_new_tokens=64))
    with serve(demo) as address:
        yield address


def present(page) -> None:
    page.locator("#presentation input").click()
    page.wait_for_function("() => document.querySelector('.d3-present') !== null")


def _run(page, tokens: int) -> None:
    """Generate `tokens` new tokens, as a person does, and wait for the run to end."""
    page.fill("#max-new-tokens input", str(tokens))
    page.click("#generate")
    wait_for_status(page, "Done.")


def test_the_status_gives_one_count_over_the_tokens_both_runs_wrote(browser, url) -> None:
    """Item 1: "24 D3 tokens, 19 full-depth tokens, 18/19 agree" became one sentence of one count."""
    page = open_page(browser, url, DESKTOP)
    try:
        _run(page, 12)
        status = page.evaluate(STATUS)
        assert "12 D3 tokens, 12 full-depth tokens" in status and " of the 12 tokens both wrote agree" in status
        counters = page.inner_text("#d3-counters")
        assert "tokens/s while decoding" in counters and "tokens / s" not in counters  # one pace, named
    finally:
        page.close()


def test_early_exit_is_named_as_itself_and_gets_no_core_band(browser, url) -> None:
    """Item 3, D9: "16 D3 tokens… D3 wrote" for an early-exit run, whose usage grid drew the core band over cells
    drawn as skipped, and whose decay curve drew D3's planned line once a slider moved."""
    page = open_page(browser, url + "?strategy=early_exit&max_new_tokens=10", DESKTOP)
    try:
        page.click("#generate")
        wait_for_status(page, "Done.")
        status = page.evaluate(STATUS)
        assert "10 early exit tokens" in status and "D3" not in status, status
        assert page.inner_text("#d3-title").strip().startswith("early exit")
        show_tab(page, "usage")
        grid = page.evaluate("""() => { const gd = document.querySelector('#plot-usage .js-plotly-plot');
          return {core: gd.data.some(t => t.meta && t.meta.role === 'core-legend'),
                  legend: Array.from(gd.querySelectorAll('.legendtext')).map(t => t.textContent)}; }""")
        assert not grid["core"] and not any("core" in name for name in grid["legend"]), grid
        d3_line = """() => { const t = document.querySelector('#plot-decay .js-plotly-plot').data
          .find(t => t.meta && t.meta.role === 'planned' && t.meta.strategy === 'd3'); return t ? t.visible : null; }"""
        assert page.evaluate(d3_line) == "legendonly"
        box = page.locator("#alpha input[type=range]").bounding_box()  # a person drags α (the browser redraws)
        y = box["y"] + box["height"] / 2
        page.mouse.move(box["x"] + box["width"] * 0.95, y)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.4, y, steps=5)
        page.wait_for_timeout(300)
        assert page.evaluate(d3_line) == "legendonly"  # still a legend entry: not this run's plan
        page.mouse.up()
    finally:
        page.close()


def test_a_view_drawn_after_the_run_says_so_while_generate_runs(browser, url, engine) -> None:
    """U3: the attention overview said "Press Generate to record" while Generate was running."""
    page = open_page(browser, url, DESKTOP)
    engine.delay = 0.3
    try:
        click_tab(page, "heads")
        page.fill("#max-new-tokens input", "30")
        page.click("#generate")
        page.wait_for_function("() => document.querySelector('#status').innerText.includes('Generating')")
        page.wait_for_function("() => (document.querySelector('#plot-heads')?.textContent || '').replace(/\\s+/g, ' ')"
                               ".includes('this view is drawn when')", timeout=TIMEOUT_MS)
        assert "Press Generate" not in page.inner_text("#plot-heads")
        page.click("#stop")
        wait_for_status(page, "Stopped.")
    finally:
        engine.delay = 0.0
        page.close()


SMALL_PRINT = """() => ({info: Math.min(...Array.from(document.querySelectorAll('.info-text'))
    .filter(e => e.offsetParent !== null).map(e => parseFloat(getComputedStyle(e).fontSize))),
  legend: Math.min(...Array.from(document.querySelectorAll('.d3-legend'))
    .filter(e => e.offsetParent !== null).map(e => parseFloat(getComputedStyle(e).fontSize)))})"""


@pytest.mark.parametrize("viewport", [WIDE, DESKTOP], ids=["1920x1080", "1280x800"])
def test_presentation_mode_draws_the_small_print_a_room_can_read(browser, url, viewport) -> None:
    """U6: in presentation mode the sliders' help lines stayed about 9-12 px and the pane legend about 12 px."""
    page = open_page(browser, url, viewport)
    try:
        _run(page, 8)
        present(page)
        page.wait_for_timeout(300)
        sizes = page.evaluate(SMALL_PRINT)
        assert sizes["info"] >= 15 and sizes["legend"] >= 14, sizes
    finally:
        page.close()


def test_the_layer_stack_fits_a_1280x800_screen_for_30_layers(browser, url) -> None:
    """Item 6: the stack was 1,021 px tall at 1280x800 for 30 layers, so a class saw half of it."""
    page = open_page(browser, url, DESKTOP)
    try:
        _run(page, 8)
        show_tab(page, "stack")
        page.locator("#plot-stack").scroll_into_view_if_needed()
        page.evaluate("() => document.querySelector('#plot-stack').scrollIntoView({block: 'start'})")
        drawn = page.evaluate("""() => { const r = document.querySelector('#plot-stack .main-svg').getBoundingClientRect();
          return {height: r.height, top: r.top, bottom: r.bottom}; }""")
        assert drawn["height"] <= DESKTOP["height"] - 60 and drawn["bottom"] <= DESKTOP["height"], drawn
        ticks = page.evaluate("() => document.querySelector('#plot-stack .js-plotly-plot').layout.yaxis.ticktext")
        assert "29 core" in ticks or "28 core" in ticks  # D3's core named on its layers
    finally:
        page.close()
