"""The page explains one token at a time, in headless Chromium: the logit lens, the token scrubber (slider and Play),
a shared link opening the same run, and hover linking between the token panes and the layer grid. A tiny random
Llama with SmolLM2's 30 layers. Their handlers are tested in tests/test_explain.py and tests/test_share.py."""

from __future__ import annotations

import time
from urllib.parse import parse_qsl, urlsplit

import pytest

from d3.trace import RAN
from tests.pagehelpers import (
    ARTIFACTS,
    DESKTOP,
    PHONE,
    PRESENTATION,
    TIMEOUT_MS,
    assert_plots_fit,
    generate,
    open_view,
    wait_for_status,
)
from viz.layout import CELL_COLORS

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]
LAYERS = 30


ENGINE_LAYERS = LAYERS  # the conftest `engine` fixture's layer count for this module


# ---------------------------------------------------------------- in the browser

playwright_api = pytest.importorskip("playwright.sync_api")


def shot(page, name: str, selector: str | None = None) -> None:
    """The screen as a person sees it, scrolled so that `selector` is at its top."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    if selector:
        page.evaluate("(s) => document.querySelector(s).scrollIntoView({block: 'start'})", selector)
        time.sleep(0.3)
    page.screenshot(path=str(ARTIFACTS / name))


PLOT = "(id) => document.querySelector(`#${id} .js-plotly-plot`)"
ROLES = f"(id) => (({PLOT})(id)?._fullData || []).map(t => t.meta && t.meta.role)"
LENS_SHAPE = f"""() => {{ const t = ({PLOT})('plot-lens')._fullData.find(d => d.meta && d.meta.role === 'lens');
  return {{rows: t.z.length, cols: t.z[0].length, x: t.x.length}}; }}"""
TOKENS = "(id) => document.querySelectorAll(`#${id} .d3-tok`).length"


def lens_ready(page) -> None:
    page.wait_for_function(f"() => ({ROLES})('plot-lens').includes('prediction-depth')")


def in_presentation(page, plot: str, view: str, screenshot: str, anchor: str) -> None:
    """Switch presentation mode on: `plot` grows its fonts, every plot still fills its box; a screenshot."""
    page.get_by_label(PRESENTATION).check()
    page.wait_for_selector(".d3-present")
    page.wait_for_function(f"() => ({PLOT})('{plot}').layout.font.size > 14")
    assert_plots_fit(page, f"presentation, {view}")
    shot(page, screenshot, anchor)


def test_the_logit_lens_tab_shows_every_token_over_every_layer(page) -> None:
    generate(page, 12)
    open_view(page, "Logit lens")
    lens_ready(page)
    shape = page.evaluate(LENS_SHAPE)
    tokens = page.evaluate(TOKENS, "d3-pane")
    assert shape == {"rows": LAYERS, "cols": tokens, "x": tokens}  # one column per D3 token, one row per layer
    assert {"skip-mask", "prediction-depth"} <= set(page.evaluate(ROLES, "plot-lens"))
    assert_plots_fit(page, "Logit lens")
    shot(page, "explains_lens_desktop.png", "#plot-lens")
    in_presentation(page, "plot-lens", "Logit lens", "explains_lens_presentation.png", "#plot-lens")


# The placeholder message of a plot: its text (plotly's lines joined) and whether it sits inside the plot's box.
MESSAGE = """(id) => { const box = document.getElementById(id).getBoundingClientRect();
  const notes = Array.from(document.querySelectorAll(`#${id} .annotation`)).filter(a => a.getBoundingClientRect().width > 0);
  return notes.map(a => { const r = a.getBoundingClientRect();
    return {text: Array.from(a.querySelectorAll('tspan.line')).map(t => t.textContent).join(' ') || a.textContent,
            inside: r.left >= box.left - 1 && r.right <= box.right + 1}; }); }"""


@pytest.mark.parametrize("page", [DESKTOP, PHONE], indirect=True, ids=["desktop", "phone"])
def test_switched_off_the_lens_is_not_recorded_and_the_view_says_how_to_get_it(page) -> None:
    open_view(page, "Logit lens")
    page.get_by_label("Record the logit lens while generating").uncheck()
    generate(page, 6)
    page.wait_for_function("() => document.querySelector('#plot-lens')?.textContent.includes('recorded without')")
    notes = page.evaluate(MESSAGE, "plot-lens")
    assert len(notes) == 1 and notes[0]["inside"], notes  # shown once, and not cut off by the plot's edge
    assert notes[0]["text"].startswith("This run was recorded without the logit lens.")
    assert page.evaluate("() => document.querySelectorAll('#d3-pane .d3-tok').length") == 6  # the run went on


SCRUB_STEP = f"""() => {{ const t = (({PLOT})('plot-scrub')?._fullData || []).find(d => d.meta && d.meta.role === 'token-layers');
  return t ? t.meta.step : null; }}"""
SCRUB_RAN = f"""(ran) => {{ const t = ({PLOT})('plot-scrub')._fullData.find(d => d.meta && d.meta.role === 'token-layers');
  return {{bars: t.y.length, ran: t.marker.color.filter(c => c === ran).length}}; }}"""
TOPK_NAMES = f"""() => (({PLOT})('plot-scrub-topk')?._fullData || []).filter(d => d.meta && d.meta.role === 'topk')
  .map(d => d.name)"""


def scrub_to(page, k: int) -> None:
    box = "#scrub-index input[type=number]"
    page.fill(box, str(k))
    page.press(box, "Enter")
    page.wait_for_function(f"(k) => ({SCRUB_STEP})() === k", arg=k)


def test_the_scrubber_shows_token_k_and_play_moves_on(page) -> None:
    generate(page, 12)
    open_view(page, "Token scrubber")
    page.wait_for_function(f"() => ({SCRUB_STEP})() !== null")
    scrub_to(page, 5)
    layers = page.evaluate("() => Number(document.querySelector('#d3-pane .d3-tok[data-step=\"5\"]').dataset.layers)")
    assert page.evaluate(SCRUB_RAN, CELL_COLORS[RAN]) == {"bars": LAYERS, "ran": layers}
    assert "Token 5 of" in page.inner_text("#scrub-card")
    scrub_to(page, 0)  # nothing written before the first token: full depth's top 5 is comparable
    page.wait_for_function(f"() => ({TOPK_NAMES})().length === 2")
    assert sorted(page.evaluate(TOPK_NAMES)) == ["D3", "full depth"]
    assert_plots_fit(page, "Token scrubber")
    shot(page, "explains_scrubber_desktop.png", "#scrub-index")
    in_presentation(page, "plot-scrub", "Token scrubber", "explains_scrubber_presentation.png", "#scrub-index")
    page.get_by_label(PRESENTATION).uncheck()
    scrub_to(page, 2)
    page.click("#scrub-play")
    page.wait_for_function(f"() => ({SCRUB_STEP})() >= 4", timeout=20_000)  # Play steps on by itself
    page.click("#scrub-play")  # pause
    page.wait_for_function("() => document.querySelector('#scrub-play').innerText.includes('Play')")
    time.sleep(0.5)
    paused = page.evaluate(SCRUB_STEP)
    time.sleep(2.0)
    assert page.evaluate(SCRUB_STEP) == paused


def test_a_shared_link_opens_with_the_same_prompt_and_controls(page, browser, url) -> None:
    page.fill("#prompt textarea", "a lesson about skipping & layers?")
    for sel, value in (("#alpha", "0.93"), ("#core-head", "2"), ("#core-tail", "5")):
        page.fill(f"{sel} input[type=number]", value)
        page.press(f"{sel} input[type=number]", "Enter")
    page.fill("#max-new-tokens input", "20")
    page.press("#max-new-tokens input", "Tab")
    page.get_by_label(PRESENTATION).check()
    page.wait_for_selector(".d3-present")
    time.sleep(0.5)
    page.click("#share")
    page.wait_for_selector("#share-url")
    page.wait_for_function("() => (document.querySelector('#share-url input, #share-url textarea')?.value || '')"
                           ".startsWith('http')")
    link = page.input_value("#share-url input, #share-url textarea")
    query = dict(parse_qsl(urlsplit(link).query))
    assert query["alpha"] == "0.93" and query["prompt"] == "a lesson about skipping & layers?"
    fresh = browser.new_page(viewport=DESKTOP)
    try:
        fresh.set_default_timeout(TIMEOUT_MS)
        fresh.goto(link)
        wait_for_status(fresh, "Settings loaded from the link")
        assert fresh.input_value("#prompt textarea") == "a lesson about skipping & layers?"
        for sel, value in (("#alpha", 0.93), ("#core-head", 2), ("#core-tail", 5)):
            assert float(fresh.input_value(f"{sel} input[type=number]")) == value, sel
        assert float(fresh.input_value("#max-new-tokens input")) == 20
        fresh.wait_for_selector(".d3-present")  # presentation mode came with the link
        assert "Ready" not in fresh.inner_text("#status")  # nothing ran: the status says the link was read
    finally:
        fresh.close()
    page.goto(url + "?alpha=7")
    wait_for_status(page, "this link's settings were not loaded")
    assert "alpha" in page.inner_text("#status")


HOT_BAND = """(k) => { const b = document.querySelector(`#plot-usage .d3-row-hot[data-step="${k}"]`);
  if (!b) return null; const gd = document.querySelector('#plot-usage .js-plotly-plot');
  const ya = gd._fullLayout.yaxis, r = b.getBoundingClientRect(), g = gd.getBoundingClientRect();
  return {center: r.top + r.height / 2 - g.top, row: ya._offset + ya.l2p(k)}; }"""
ROW_POINT = """(k) => { const gd = document.querySelector('#plot-usage .js-plotly-plot');
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, g = gd.getBoundingClientRect();
  return {x: g.left + xa._offset + xa.l2p(15), y: g.top + ya._offset + ya.l2p(k)}; }"""


def test_hovering_a_token_lights_its_grid_row_and_a_grid_row_lights_its_token(page) -> None:
    generate(page, 12)
    open_view(page, "Per-token layer usage")
    page.wait_for_function(f"() => ({ROLES})('plot-usage').includes('grid')")
    page.evaluate("() => window.scrollTo(0, document.querySelector('#d3-pane').getBoundingClientRect().top"
                  " + window.scrollY - 10)")  # the pane at the top and the grid's first rows below it
    page.hover('#d3-pane .d3-tok[data-step="3"]')
    page.wait_for_function(f"() => ({HOT_BAND})(3) !== null")
    band = page.evaluate(HOT_BAND, 3)
    assert abs(band["center"] - band["row"]) <= 2  # the band sits on token 3's row
    hot = page.evaluate("() => Array.from(document.querySelectorAll('.d3-tok-hot')).map(s => s.closest('#d3-pane, #full-pane').id)")
    assert sorted(hot) == ["d3-pane", "full-pane"]  # the same position lights in both panes
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "explains_hover_token_to_grid.png"))  # no scrolling: the hover stays
    page.locator("#plot-usage").scroll_into_view_if_needed()
    point = page.evaluate(ROW_POINT, 7)
    page.mouse.move(point["x"], point["y"])
    page.wait_for_selector('#d3-pane .d3-tok.d3-tok-hot[data-step="7"]')
    assert page.evaluate("() => document.querySelectorAll('.d3-tok-hot[data-step=\"3\"]').length") == 0
    assert page.evaluate(HOT_BAND, 7) is not None
    page.screenshot(path=str(ARTIFACTS / "explains_hover_grid_to_token.png"))


@pytest.mark.parametrize("page", [PHONE], indirect=True)
def test_on_a_phone_the_lens_and_the_scrubber_fit(page) -> None:
    generate(page, 12)
    open_view(page, "Logit lens")
    lens_ready(page)
    assert_plots_fit(page, "phone, Logit lens")
    title = page.evaluate("""() => { const box = document.getElementById('plot-lens').getBoundingClientRect();
        return Array.from(document.querySelectorAll('#plot-lens .gtitle tspan.line, #plot-lens .gtitle'))
          .map(t => t.getBoundingClientRect().right - box.right); }""")
    assert title and max(title) <= 1, title  # every line of the title inside the box, none cut at its edge
    shot(page, "explains_lens_phone.png", "#plot-lens")
    open_view(page, "Token scrubber")
    page.wait_for_function(f"() => ({SCRUB_STEP})() !== null")
    assert_plots_fit(page, "phone, Token scrubber")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator("#scrub-index").scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "explains_scrubber_phone.png"), full_page=True)
    wide = page.evaluate("() => document.documentElement.scrollWidth > window.innerWidth + 1")
    assert not wide, "the page scrolls sideways on a phone"
