"""A teacher's moves on the page in headless Chromium (1280x800, presentation mode, a phone), checked by boxes and
pixels: typed values out of range, a model switch, core moves bounding each other, tabs, scenario buttons. One server per module on a tiny random Llama with
SmolLM2's 30 layers, like tests/test_browser_page.py."""

from __future__ import annotations

import io
import time

import pytest

from d3.config import D3Config
from d3.schedule import plan
from explorer.caps import Caps
from explorer.controls import DEFAULTS, default_attention_layer
from explorer.page import build_demo
from tests.apphelpers import CountingEngine, serve
from tests.pagehelpers import DESKTOP, PHONE, generate, open_view, wait_for_status
from tests.tiny import tiny_llama, tiny_tokenizer

pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]
playwright_api = pytest.importorskip("playwright.sync_api")
Image = pytest.importorskip("PIL.Image")
LAYERS = 30


ENGINE_LAYERS = LAYERS  # the conftest `engine` fixture's layer count for this module


@pytest.fixture(scope="module")
def url(engine):
    engines = {"tiny": engine, "tiny18": CountingEngine(tiny_llama(18), tiny_tokenizer(), name="tiny18")}
    demo = build_demo(engines.__getitem__, model_names=tuple(engines), public=False, caps=Caps(max_new_tokens=64))
    with serve(demo) as address:
        yield address


def pixel(page, x: float, y: float) -> tuple[int, int, int]:
    """The colour a person sees at document point (x, y) (scrolled to it)."""
    shot = Image.open(io.BytesIO(page.screenshot(full_page=True, clip={"x": int(x), "y": int(y), "width": 1,
                                                                        "height": 1})))
    return shot.convert("RGB").getpixel((0, 0))


# Page coordinates of the centre of heatmap row `row` (category index) in panel `panel` of a plot.
ROW_POINT = """([id, panel, row]) => {
  const gd = document.querySelector(`#${id} .js-plotly-plot`);
  const fl = gd._fullLayout, sfx = panel > 1 ? String(panel) : '';
  const xa = fl['xaxis' + sfx], ya = fl['yaxis' + sfx], box = gd.querySelector('.main-svg').getBoundingClientRect();
  return {x: box.left + scrollX + xa._offset + xa._length / 2, y: box.top + scrollY + ya._offset + ya.c2p(row)};
}"""


# ---------------------------------------------------------------- 1: attention view


def test_after_a_default_run_the_attention_view_shows_d3_rows_and_grey_skipped_rows(page) -> None:
    generate(page, tokens=DEFAULTS.max_new_tokens)
    open_view(page, "Attention: full depth vs D3")
    page.wait_for_selector("#plot-attention .js-plotly-plot .main-svg")
    layer = default_attention_layer(LAYERS)
    ran = [layer in plan(D3Config(alpha=DEFAULTS.alpha), LAYERS, i).run for i in range(DEFAULTS.max_new_tokens)]
    page.locator("#plot-attention").scroll_into_view_if_needed()
    ran_row, skipped_row = ran.index(True, 1), ran.index(False)
    skipped_at = page.evaluate(ROW_POINT, ["plot-attention", 2, skipped_row])
    r, g, b = pixel(page, skipped_at["x"], skipped_at["y"])
    assert abs(r - 0xD1) < 12 and abs(g - 0xD5) < 12 and abs(b - 0xDB) < 12, (r, g, b)  # grey, not white
    ran_at = page.evaluate(ROW_POINT, ["plot-attention", 2, ran_row])
    row = [pixel(page, ran_at["x"] + dx, ran_at["y"]) for dx in range(-200, 200, 20)]
    assert any(sum(c) < 600 for c in row), row  # a D3 row where the layer ran shows attention (not blank)
    assert sum(ran) >= 0.6 * len(ran)


# ---------------------------------------------------------------- 4: typed values


def status(page) -> str:
    return page.evaluate("() => document.querySelector('#status').innerText")


def planned_d3_label(page) -> str:
    return page.evaluate("""() => document.querySelector('#plot-decay .js-plotly-plot').data
      .filter(t => (t.meta || {}).role === 'planned' && t.meta.strategy === 'd3').map(t => t.name)[0]""")


@pytest.mark.parametrize("typed, runs", [("0.5", "α=0.8"), ("1.5", "α=1.0")])
def test_a_typed_alpha_out_of_range_is_said_and_the_run_uses_what_the_curve_shows(page, typed, runs) -> None:
    page.wait_for_selector("#plot-decay .js-plotly-plot .main-svg")
    box = page.locator("#alpha input[type=number]")
    box.fill(typed)
    box.press("Enter")
    wait_for_status(page, f"α (decay rate)={typed} is out of range: α (decay rate) must be a number in [0.8, 1]")
    page.wait_for_function("(t) => document.querySelector('#plot-decay .js-plotly-plot').data"
                           ".some(d => (d.name || '').startsWith(`D3 (${t}`))", arg=runs)
    generate(page, tokens=6)
    title = page.evaluate("() => document.querySelector('#d3-title').innerText")
    assert runs in title and runs in planned_d3_label(page)  # the run is what the curve shows


def test_a_fixed_value_takes_its_error_back_without_generating(page) -> None:
    box = page.locator("#max-new-tokens input")
    box.fill("2.5")
    page.click("#generate")
    wait_for_status(page, "New tokens=2.5 is not allowed")  # named as the page labels it
    box.fill("6")
    box.press("Enter")
    page.wait_for_function("() => !document.querySelector('#status').innerText.includes('not allowed')")
    assert "Ready" in status(page)


# ---------------------------------------------------------------- 6: switching models


CORE_BOUNDS = """() => ['core-head', 'core-tail'].map(id => {
  const r = document.querySelector(`#${id} input[type=range]`);
  return [Number(r.value), Number(r.max)]; })"""


def test_switching_models_clears_the_other_models_run_and_bounds_the_core_at_once(page) -> None:
    dropdown = page.locator("#model input")

    def switch(name: str, settled: list) -> list:
        """Every bound the sliders show from the switch until they settle at `settled` (however long a loaded
        machine takes to answer: no time window), then for one second more (nothing late moves them again)."""
        dropdown.click()
        page.get_by_role("option", name=name, exact=True).click()
        seen = [page.evaluate(CORE_BOUNDS)]
        while seen[-1] != settled:
            page.wait_for_timeout(50)
            seen.append(page.evaluate(CORE_BOUNDS))
            assert len(seen) < 2400, seen[-5:]  # a hang guard (2 minutes), not a timing claim
        for _ in range(20):
            page.wait_for_timeout(50)
            seen.append(page.evaluate(CORE_BOUNDS))
        return seen

    assert switch("tiny18", [[2, 15], [2, 15]])[-1] == [[2, 15], [2, 15]]
    generate(page, tokens=6)
    assert "/ 18" in page.evaluate("() => document.querySelector('#d3-counters').innerText")  # mean layers / L
    seen = switch("tiny", [[3, 26], [3, 26]])
    settled = [[3, 26], [3, 26]]
    assert seen[-1] == settled
    for (head, head_max), (tail, tail_max) in seen[seen.index(settled):]:
        assert head_max == 29 - tail and tail_max == 29 - head  # head + tail < 30 at every moment once sized
    wait_for_status(page, "Model tiny: press Generate")
    for pane in ("#d3-pane", "#full-pane", "#d3-counters"):
        text = page.evaluate("(s) => document.querySelector(s).innerText", pane)
        assert "18" not in text and "tiny18" not in text, (pane, text)


def test_a_persons_core_moves_bound_the_other_slider(page) -> None:
    """A dragged head lowers the tail's maximum; a tail typed past its maximum is clamped, and the head's maximum
    follows the clamped tail (head + tail < 30 throughout)."""
    head_range = page.locator("#core-head input[type=range]")
    head_range.focus()
    for _ in range(4):
        head_range.press("ArrowRight")  # 3 -> 7, as a person's keys or drag: input events
    page.wait_for_function(f"() => ({CORE_BOUNDS})()[1][1] === 22")
    tail_box = page.locator("#core-tail input[type=number]")
    tail_box.fill("40")
    tail_box.press("Tab")  # the browser clamps 40 to the tail's maximum, 22
    page.wait_for_function(f"() => {{ const b = ({CORE_BOUNDS})(); return b[1][0] === 22 && b[0][1] === 7; }}")
    time.sleep(1)  # nothing late moves them again
    assert page.evaluate(CORE_BOUNDS) == [[7, 7], [22, 22]]


# ---------------------------------------------------------------- 9: a cold page


@pytest.mark.parametrize("view", ["Per-token layer usage", "Information flow: core vs flex",
                                  "Attention: full depth vs D3", "Error propagation", "Fill strategies",
                                  "What each token needs"])
def test_a_cold_page_says_what_to_press_in_every_view(page, view) -> None:
    open_view(page, view)
    shown = """() => Array.from(document.querySelectorAll('[id^=plot-]')).filter(c => c.offsetParent !== null
      && c.id !== 'plot-decay').map(c => Array.from(c.querySelectorAll('.annotation-text')).map(a => a.textContent)
      .join(' '))"""
    page.wait_for_function(f"() => ({shown})().length > 0 && ({shown})().every(t => t.includes('Press'))",
                           timeout=15_000)


def test_after_a_run_a_fill_view_never_opened_still_says_what_compare_does(page) -> None:
    """A placeholder sent to a plot whose tab was never opened is drawn as an empty box with an icon: a run leaves
    the fill view alone unless it showed a comparison."""
    generate(page, tokens=6)
    open_view(page, "Fill strategies")
    page.wait_for_function("() => Array.from(document.querySelectorAll('#plot-fills .annotation-text'))"
                           ".some(a => a.textContent.includes('Press'))", timeout=15_000)


# ---------------------------------------------------------------- 5: the core scenario's findings


def test_the_core_scenarios_findings_are_on_the_first_screen_with_both_runs_texts(page) -> None:
    page.click("#scenario-core")
    page.wait_for_function("() => document.querySelector('#scenario-finding').innerText.includes('run 2')")
    box = page.evaluate("() => { const r = document.querySelector('#scenario-finding').getBoundingClientRect();"
                        " return {top: r.top + scrollY, left: r.left, bottom: r.bottom + scrollY}; }")
    panes = page.evaluate("() => document.querySelector('#d3-pane').getBoundingClientRect().left")
    assert box["top"] < DESKTOP["height"] / 2 and box["left"] >= panes - 40  # above the panes, in their column
    text = page.evaluate("() => document.querySelector('#scenario-finding').innerText")
    assert text.count("wrote “") == 2


# ---------------------------------------------------------------- 7: view tabs keep their places


# Each tab's place relative to the tab bar (what is drawn above the bar may still grow while the page settles).
TAB_PLACES = """() => { const bar = document.querySelector('#views [role=tablist]').getBoundingClientRect();
  return Array.from(document.querySelectorAll('#views [role=tablist] button')).map(b => {
    const r = b.getBoundingClientRect(); return [b.innerText.trim(), Math.round(r.top - bar.top), Math.round(r.left - bar.left)]; }); }"""


@pytest.mark.parametrize("page", [DESKTOP, PHONE], indirect=True, ids=["desktop", "phone"])
def test_picking_a_view_tab_leaves_every_tab_where_it_was(page) -> None:
    before = page.evaluate(TAB_PLACES)
    from explorer import views

    tabs = sum(v.tab for v in views.registry()) + 2  # every view's tab (the registry), Run history and Export
    assert len(before) == tabs and len({top for _, top, _ in before}) >= 2  # all in the bar, on several lines
    for name in ("Logit lens", "Export", "Fill strategies"):  # tabs on the second line (or further down)
        page.locator("#views [role=tablist] button", has_text=name).first.click()
        page.wait_for_function("(n) => document.querySelector('#views button.selected').innerText.trim() === n",
                               arg=name)
        assert page.evaluate(TAB_PLACES) == before
    assert not page.locator("#views .overflow-menu").is_visible()


# ---------------------------------------------------------------- 11: small wording


def test_scenario_buttons_look_like_buttons_and_the_export_names_both_files(page) -> None:
    style = page.evaluate("""() => { const s = getComputedStyle(document.querySelector('#scenario-core'));
      return [s.borderTopWidth, s.borderTopColor, s.backgroundColor]; }""")
    assert style[0] != "0px" and style[1] not in ("rgba(0, 0, 0, 0)", "transparent"), style
    open_view(page, "Export")
    page.get_by_role("button", name="Download figure (HTML + plotly.min.js: keep both in one folder)").wait_for()


# ---------------------------------------------------------------- 10: presentation mode


def present(page) -> None:
    page.click("#presentation")
    page.wait_for_function("() => document.querySelector('.d3-present') !== null")
    page.wait_for_timeout(1500)  # the views redraw at the bigger size


def test_presentation_mode_at_1280x800_has_the_panes_and_the_decay_curve_on_the_first_screen(page) -> None:
    generate(page, tokens=24)
    present(page)
    page.evaluate("() => window.scrollTo(0, 0)")
    box = lambda sel: page.evaluate("(s) => { const r = document.querySelector(s).getBoundingClientRect();"  # noqa: E731
                                    " return {top: r.top, bottom: r.bottom}; }", sel)
    for pane in ("#d3-pane", "#full-pane", "#d3-counters"):
        assert box(pane)["bottom"] <= DESKTOP["height"], pane
    plot_area = page.evaluate("""() => { const gd = document.querySelector('#plot-decay .js-plotly-plot');
      const svg = gd.querySelector('.main-svg').getBoundingClientRect(), ya = gd._fullLayout.yaxis;
      return {bottom: svg.top + ya._offset + ya._length + 30, height: ya._length}; }""")  # with its tick labels
    assert plot_area["bottom"] <= DESKTOP["height"]
    assert plot_area["height"] >= 95, plot_area  # a curve a class can read (its 5-row legend had left ~30 px)
    prompt = page.evaluate("() => { const t = document.querySelector('#prompt textarea');"
                           " return [t.clientHeight, parseFloat(getComputedStyle(t).lineHeight)]; }")
    assert prompt[0] >= 2 * prompt[1]  # two whole lines of the prompt


@pytest.mark.parametrize("page", [{"width": 1920, "height": 1080}], indirect=True, ids=["1920x1080"])
def test_presentation_mode_keeps_slider_labels_on_one_line_and_scales_their_numbers(page) -> None:
    present(page)
    for slider in ("core-head", "core-tail"):
        label = page.evaluate("(id) => { const s = document.querySelector(`#${id} [data-testid=block-info]`);"
                              " return [s.getBoundingClientRect().height, parseFloat(getComputedStyle(s).lineHeight)"
                              " || parseFloat(getComputedStyle(s).fontSize) * 1.5]; }", slider)
        assert label[0] <= 2.2 * label[1], (slider, label)  # at most two lines (it was four)
    sizes = page.evaluate("() => ['#alpha [data-testid=max-value]', '#alpha [data-testid=block-info]']"
                          ".map(s => parseFloat(getComputedStyle(document.querySelector(s)).fontSize))")
    assert sizes[0] >= 0.85 * sizes[1]  # the range numbers about as big as the label
