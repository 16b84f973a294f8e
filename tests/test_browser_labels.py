"""Labels a person can read. In headless Chromium at 1280x800, in
presentation mode (1280x800 and 1920x1080) and on a phone (390x844): the model picker's value clear of its arrow,
the core floor's label where no marker can sit, figure titles inside their box and no two labels on top of each
other, and presentation mode's first screen after a scenario. One server per module on a tiny random Llama with
SmolLM2's 30 layers, named as the embedded model so the page shows what it shows for it; screenshots go to
$D3_SCREENSHOTS when set."""

from __future__ import annotations

import re

import pytest

from explorer.caps import Caps
from explorer.page import build_demo
from tests.apphelpers import CountingEngine, serve
from tests.pagehelpers import ARTIFACTS, DESKTOP, PHONE, TIMEOUT_MS, open_view, wait_for_status
from tests.tiny import tiny_llama, tiny_tokenizer

pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]
playwright_api = pytest.importorskip("playwright.sync_api")

MODEL = "smollm2-135m"  # the longest name the page's model picker shows
WIDE = {"width": 1920, "height": 1080}


@pytest.fixture(scope="module")
def url():
    engine = CountingEngine(tiny_llama(30), tiny_tokenizer(), name=MODEL)
    demo = build_demo(lambda name: engine, model_names=(MODEL,), public=False, caps=Caps(max_new_tokens=64))
    with serve(demo) as address:
        yield address


def new_page(browser, url, viewport: dict):
    page = browser.new_page(viewport=viewport)
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(url)
    page.wait_for_selector("#generate")
    return page


@pytest.fixture()
def page(browser, url, request):
    pg = new_page(browser, url, getattr(request, "param", DESKTOP))
    yield pg
    pg.close()


def present(page, on: bool = True) -> None:
    box = page.locator("#presentation input")
    if box.is_checked() != on:
        box.click()
    page.wait_for_function("(on) => (document.querySelector('.d3-present') !== null) === on", arg=on)


def run_scenario(page, key: str) -> None:
    page.click(f"#scenario-{key}")
    page.wait_for_function("() => !document.querySelector('#scenario-finding').innerText.includes('Running')"
                           " && document.querySelector('#scenario-finding').innerText.trim().length > 0")


def shoot(page, name: str, selector: str | None = None) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    if selector is None:
        page.screenshot(path=str(ARTIFACTS / f"labels_{name}.png"))
    else:
        page.locator(selector).screenshot(path=str(ARTIFACTS / f"labels_{name}.png"))


# ---------------------------------------------------------------- a: the model picker


# The picker's value as drawn: where its text ends (measured in the input's own font), where the input's box ends,
# and where the arrow begins.
DROPDOWN = """(id) => {
  const input = document.querySelector(`#${id} input[role=combobox]`), icon = document.querySelector(`#${id} .icon-wrap`);
  const style = getComputedStyle(input), box = input.getBoundingClientRect();
  const ctx = document.createElement('canvas').getContext('2d');
  ctx.font = style.font;
  const left = box.left + parseFloat(style.paddingLeft), right = box.right - parseFloat(style.paddingRight);
  return {value: input.value, text_right: left + ctx.measureText(input.value).width, box_right: right,
          arrow_left: icon.getBoundingClientRect().left};
}"""


@pytest.mark.parametrize("presentation", [False, True], ids=["1280x800", "presentation"])
def test_the_model_pickers_value_is_not_drawn_under_its_arrow(page, presentation) -> None:
    if presentation:
        present(page)
        page.wait_for_timeout(300)  # the fonts grow
    drawn = page.evaluate(DROPDOWN, "model")
    assert drawn["value"] == MODEL
    assert drawn["box_right"] <= drawn["arrow_left"], drawn  # the input's box stops before the arrow
    assert drawn["text_right"] <= drawn["box_right"] + 0.5, drawn  # and the whole name fits in it
    shoot(page, f"model_picker_{'presentation' if presentation else 'desktop'}", "#model-row")


# ---------------------------------------------------------------- b: the core floor's label


# Boxes of the core floor's label, of every marker drawn on the decay curve, and of the plot and the figure.
FLOOR_LABEL = """() => {
  const plot = document.querySelector('#plot-decay .js-plotly-plot');
  const box = (e) => { const r = e.getBoundingClientRect(); return {l: r.left, r: r.right, t: r.top, b: r.bottom}; };
  const index = plot.layout.annotations.findIndex((a) => a.name === 'core-floor');
  const label = plot.querySelectorAll('.annotation')[index].querySelector('.annotation-text');
  const svg = plot.querySelector('.main-svg').getBoundingClientRect(), xa = plot._fullLayout.xaxis;
  return {label: box(label), text: label.textContent, points: Array.from(plot.querySelectorAll('.scatterlayer .point')).map(box),
          plot_right: svg.left + xa._offset + xa._length, figure: box(plot.querySelector('.main-svg'))};
}"""


def overlaps(a: dict, b: dict) -> bool:
    return a["l"] < b["r"] - 0.5 and b["l"] < a["r"] - 0.5 and a["t"] < b["b"] - 0.5 and b["t"] < a["b"] - 0.5


def test_no_marker_covers_the_core_floors_label(page) -> None:
    run_scenario(page, "aggressive")  # α = 0.9: the last tokens run at the core floor, markers along its line
    wait_for_status(page, "Done.")
    page.wait_for_function("() => document.querySelectorAll('#plot-decay .scatterlayer .point').length >= 24")
    drawn = page.evaluate(FLOOR_LABEL)
    assert drawn["text"].startswith("core floor") and len(drawn["points"]) >= 24
    assert not [p for p in drawn["points"] if overlaps(drawn["label"], p)], drawn
    assert drawn["label"]["l"] >= drawn["plot_right"]  # in the margin: no marker can be drawn there
    assert drawn["text"] == "core floor3+3=6"  # two lines (3 + 3 core layers), short enough for the margin
    figure, label = drawn["figure"], drawn["label"]
    assert figure["l"] <= label["l"] and label["r"] <= figure["r"] and figure["t"] <= label["t"] <= label["b"] <= figure["b"]
    page.locator("#plot-decay").scroll_into_view_if_needed()
    shoot(page, "decay_floor_label", "#plot-decay")


# ---------------------------------------------------------------- c, d: titles and labels in their boxes


# Every title, note, axis title and legend entry of each plot shown: those drawn outside what a person sees of the
# plot's box (a plot that scrolls sideways on a phone: its drawing; its title: the box itself), and pairs that cross.
LABEL_PROBLEMS = """(ids) => {
  const problems = [];
  for (const id of ids) {
    const c = document.getElementById(id), svg = c && c.querySelector('.js-plotly-plot .main-svg');
    if (!svg || c.offsetParent === null) { problems.push([id, 'not shown']); continue; }
    const box = c.getBoundingClientRect(), drawn = svg.getBoundingClientRect();
    const scrolls = getComputedStyle(c).overflowX === 'auto' && c.scrollWidth > c.clientWidth + 1;
    const seen = {l: Math.max(box.left, drawn.left), r: Math.min(box.right, drawn.right)};
    const labels = Array.from(c.querySelectorAll('.gtitle, .annotation-text, .legendtext, [class$=title] > text'))
      .filter((t) => t.getBoundingClientRect().width > 0).map((t) => {
        const r = t.getBoundingClientRect();
        return {what: t.textContent.slice(0, 60), title: t.classList.contains('gtitle'), l: r.left, r: r.right, t: r.top, b: r.bottom};
      });
    for (const t of labels) {
      const edge = scrolls && !t.title ? {l: drawn.left, r: drawn.right} : seen;
      if (t.l < edge.l - 1 || t.r > edge.r + 1) problems.push([id, 'cut', t.what, Math.round(t.l - edge.l), Math.round(t.r - edge.r)]);
    }
    labels.forEach((a, i) => labels.slice(i + 1).forEach((b) => {
      if (a.l < b.r - 1 && b.l < a.r - 1 && a.t < b.b - 1 && b.t < a.b - 1) problems.push([id, 'overlap', a.what, b.what]);
    }));
  }
  return problems;
}"""
PLOTS_FIT = """() => Array.from(document.querySelectorAll('[id^=plot-]')).filter((c) => c.offsetParent !== null)
  .every((c) => { const svg = c.querySelector('.js-plotly-plot .main-svg'), plot = c.querySelector('.js-plotly-plot');
    return !svg || Math.abs(svg.getBoundingClientRect().width - plot.getBoundingClientRect().width) <= 2; })"""
VIEWS = {"Per-token layer usage": ["plot-usage"], "Attention: full depth vs D3": ["plot-attention"],
         "Error propagation": ["plot-errors"], "Fill strategies": ["plot-fills"],
         "Token scrubber": ["plot-scrub", "plot-scrub-topk"]}
SCREENS = {"desktop": (DESKTOP, False), "presentation": (DESKTOP, True), "presentation_1920": (WIDE, True),
           "phone": (PHONE, False)}


@pytest.fixture(scope="module")
def after_fills(browser, url):
    """One page after the fill scenario (a long D3 label: strided, fill none; and the fill comparison)."""
    pg = new_page(browser, url, DESKTOP)
    run_scenario(pg, "fill")
    wait_for_status(pg, "Fill comparison done")
    yield pg
    pg.close()


def scrub_to_last_token(page) -> None:
    """The scrubber on the last token: past the first divergence, the top-5's title says why full depth is not
    shown (its longest subtitle)."""
    page.wait_for_function("() => document.querySelector('#scrub-card').innerText.includes('Token ')"
                           " && Number(document.querySelector('#scrub-index input[type=range]').max) > 1")
    last = page.evaluate("() => document.querySelector('#scrub-index input[type=range]').max")
    page.fill("#scrub-index input[type=number]", str(last))
    page.press("#scrub-index input[type=number]", "Enter")
    page.wait_for_function("(n) => document.querySelector('#scrub-card').innerText.includes(`Token ${n} of`)", arg=last)


@pytest.mark.parametrize("screen", list(SCREENS))
def test_titles_and_labels_stay_in_their_box_and_apart(after_fills, screen) -> None:
    page = after_fills
    viewport, presentation = SCREENS[screen]
    page.set_viewport_size(viewport)
    present(page, presentation)
    problems = {}
    for view, plots in VIEWS.items():
        open_view(page, view)
        if view == "Token scrubber":
            scrub_to_last_token(page)
        page.wait_for_function("(ids) => ids.every((id) => document.querySelector(`#${id} .js-plotly-plot .main-svg`))",
                               arg=plots)
        page.wait_for_function(PLOTS_FIT)
        page.wait_for_timeout(200)  # a redraw for presentation mode's fonts lands
        if presentation:
            page.wait_for_function("(id) => document.querySelector(`#${id} .js-plotly-plot`).layout.font.size > 16",
                                   arg=plots[0])
        found = page.evaluate(LABEL_PROBLEMS, plots)
        if found:
            problems[view] = found
        page.locator(f"#{plots[0]}").scroll_into_view_if_needed()
        shoot(page, f"{screen}_{re.sub(r'[^a-z]+', '_', view.lower()).strip('_')}", "#views")
    assert not problems, problems


# ---------------------------------------------------------------- e: presentation mode's first screen


@pytest.mark.xfail(strict=False, reason="after a scenario in presentation mode at 1280x800 the decay curve ends ~18 px "
                   "below the first screen (the longer scenario text of issue 24); open in issue 24's layout list")
def test_presentation_mode_keeps_the_panes_and_the_decay_curve_on_the_first_screen_after_a_scenario(page) -> None:
    present(page)
    run_scenario(page, "core")
    page.wait_for_function("() => document.querySelector('#scenario-finding').innerText.includes('run 2')")
    wait_for_status(page, "Done.")
    page.wait_for_timeout(1000)  # the views redraw at the bigger size
    page.evaluate("() => window.scrollTo(0, 0)")
    box = lambda sel: page.evaluate("(s) => { const r = document.querySelector(s).getBoundingClientRect();"  # noqa: E731
                                    " return {top: r.top, bottom: r.bottom}; }", sel)
    assert box("#scenario-finding")["top"] < DESKTOP["height"] / 2  # the findings are there, under the status
    for pane in ("#d3-pane", "#full-pane", "#d3-counters"):
        assert box(pane)["bottom"] <= DESKTOP["height"], pane
    plot_area = page.evaluate("""() => { const gd = document.querySelector('#plot-decay .js-plotly-plot');
      const svg = gd.querySelector('.main-svg').getBoundingClientRect(), ya = gd._fullLayout.yaxis;
      return svg.top + ya._offset + ya._length + 30; }""")  # the curve and its tick labels
    assert plot_area <= DESKTOP["height"]
    shoot(page, "presentation_after_core_scenario")
