"""The "What each token needs" view in headless Chromium: measuring draws the oracle, fitting moves the α slider."""

from __future__ import annotations

import re

import pytest

from tests.pagehelpers import PLOT_HAS_DATA, TIMEOUT_MS, click_tab, open_page

pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]

ROLES = "() => document.querySelector('#plot-needs .js-plotly-plot').data.map(t => t.meta && t.meta.role)"
ALPHA = "() => document.querySelector('#alpha input[type=number]').value"


def test_measure_draws_the_needs_and_fit_sets_the_alpha_slider(browser, url) -> None:
    page = open_page(browser, url)
    try:
        page.fill("#prompt textarea", "the cat sat on the mat")
        page.fill("#max-new-tokens input", "8")
        click_tab(page, "needs")
        page.click("#needs-measure")
        page.wait_for_function(PLOT_HAS_DATA, arg="plot-needs", timeout=TIMEOUT_MS)
        assert {"schedule", "served", "underserved", "lens"} <= set(page.evaluate(ROLES))
        page.wait_for_function("() => document.querySelector('#needs-note').innerText.includes('tokens need')")
        page.click("#needs-fit")
        page.wait_for_function("() => document.querySelector('#needs-note').innerText.includes('α set to')",
                               timeout=TIMEOUT_MS)
        fitted = re.search(r"α set to ([0-9.]+)", page.inner_text("#needs-note")).group(1)
        page.wait_for_function(f"() => Math.abs(({ALPHA})() - {fitted}) < 1e-9")
        assert "Ready" in page.inner_text("#status")  # fitting moved the slider without running a generation
    finally:
        page.close()
