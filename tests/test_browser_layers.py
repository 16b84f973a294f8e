"""The "Which layers matter" view in headless Chromium, at 1280x800 and on a phone (390x844): measuring draws the
single drops and both removal curves, the figure fills its box, and "Use this order" sets the calibrated order."""

from __future__ import annotations

import pytest

from tests.pagehelpers import ARTIFACTS, PLOT_HAS_DATA, TIMEOUT_MS, click_tab

pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]

ROLES = "() => document.querySelector('#plot-layers .js-plotly-plot').data.map(t => t.meta && t.meta.role)"
# The plot's drawn area against its box: plotly's svg as wide as the container (it fills its box), and visible.
FILLS_BOX = """() => {
  const box = document.querySelector('#plot-layers');
  const svg = box.querySelector('.main-svg');
  const b = box.getBoundingClientRect(), s = svg.getBoundingClientRect();
  return {box: b.width, svg: s.width, height: s.height, visible: s.width > 0 && s.height > 0};
}"""


@pytest.mark.parametrize("viewport", [(1280, 800), (390, 844)], ids=["desktop", "phone"])
def test_measure_draws_which_layers_matter_and_use_sets_the_order(browser, url, viewport) -> None:
    page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
    page.set_default_timeout(TIMEOUT_MS)
    try:
        page.goto(url)
        page.wait_for_selector("#generate")
        page.fill("#prompt textarea", "the cat sat on the mat")
        page.fill("#max-new-tokens input", "8")
        click_tab(page, "layers")
        # the cold view says what to press (plotly draws the placeholder's text once the tab is shown)
        page.wait_for_function("() => document.querySelector('#plot-layers').innerText.includes('Measure which layers')",
                               timeout=30_000)
        page.click("#layers-measure")
        page.wait_for_function(PLOT_HAS_DATA, arg="plot-layers", timeout=TIMEOUT_MS)
        assert {"single", "single-kl", "curve", "in-use-curve"} <= set(page.evaluate(ROLES))
        page.wait_for_function("() => document.querySelector('#layers-note').innerText.includes('spares best')")
        size = page.evaluate(FILLS_BOX)
        assert size["visible"] and size["svg"] >= 0.95 * size["box"] and size["height"] >= 300
        page.locator("#plot-layers").scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / f"layers_{viewport[0]}x{viewport[1]}.png"), full_page=False)
        page.click("#layers-use")
        page.wait_for_function("() => document.querySelector('#layers-note').innerText.includes('Drop order set to')")
        page.get_by_text("More controls", exact=True).click()  # the order box sits with the drop order, in there
        box = page.locator("#layer-order textarea, #layer-order input").first
        page.wait_for_function("() => { const b = document.querySelector('#layer-order textarea, #layer-order input');"
                               " return b && b.value.length > 0; }")
        order = box.input_value()
        assert sorted(int(x) for x in order.split(",")) == [1, 2, 3, 4]
        page.locator("#plot-layers").screenshot(path=str(ARTIFACTS / f"layers_plot_{viewport[0]}.png"))
    finally:
        page.close()
