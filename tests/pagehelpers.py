"""Helpers shared by the page's browser tests: where screenshots go, viewports, and how a person reaches things on
the page (open it, click a view's tab, wait for the status line, generate), plus the JavaScript probes the tests
read the page with (is a plot drawn with data, does it fill its box, is an element on the first screen)."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import pytest

from explorer import views as _views

VIEWS = _views.titles()  # each view's title by key, from the view registry

# Screenshots for a person to look at: into $D3_SCREENSHOTS when set, else the test run's scratch folder (removed
# at the end, see tests/conftest.py), so a plain run leaves nothing behind.
ARTIFACTS = Path(os.environ.get("D3_SCREENSHOTS") or Path(tempfile.gettempdir()) / "screenshots")
TIMEOUT_MS = 120_000
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
PRESENTATION = "Presentation mode"

# A plot counts as rendered with data when plotly drew it and some trace holds values (plain arrays, or the
# base64 typed arrays {dtype, bdata} that plotly.py sends for numpy data).
PLOT_HAS_DATA = """(id) => {
  const plot = document.querySelector(`#${id} .js-plotly-plot`);
  if (!plot || !plot.data || !plot.querySelector('.main-svg')) return false;
  const filled = v => v && ((v.bdata && v.bdata.length > 0) || (v.length > 0 && Array.from(v).some(x => x !== null)));
  return plot.data.some(t => filled(t.x) || filled(t.y) || filled(t.z));
}"""
# Where on the screen a D3 point of the Sweep tab's Pareto view is, and a listener that remembers what a click hit.
# The centre of the D3 point farthest from every other strategy's point: timings on the tiny model are noisy, so
# a D3 point can land under another strategy's, and a click there would pick that one.
D3_POINT = """() => {
  const plot = document.querySelector('#plot-sweep .js-plotly-plot');
  window.__clicked = null;
  plot.on('plotly_click', (e) => { window.__clicked = {row: e.points[0].customdata, text: e.points[0].text}; });
  const groups = document.querySelectorAll('#plot-sweep .scatterlayer .trace');
  const centres = (i) => Array.from(groups[i].querySelectorAll('path.point')).map(p => {
    const r = p.getBoundingClientRect(); return {x: r.x + r.width / 2, y: r.y + r.height / 2}; });
  const d3 = plot.data.findIndex(d => d.meta && d.meta.role === 'points' && d.meta.name === 'd3');
  const others = plot.data.flatMap((d, i) => (i !== d3 && d.meta && d.meta.role === 'points') ? centres(i) : []);
  const room = (c) => Math.min(Infinity, ...others.map(o => Math.hypot(o.x - c.x, o.y - c.y)));
  return centres(d3).reduce((best, c) => (room(c) > room(best) ? c : best));
}"""
TOKENS_IN = "(id) => document.querySelectorAll(`#${id} .d3-tok`).length"
# Each visible plot: the width plotly drew (its svg) and the width of the box it sits in.
PLOT_WIDTHS = """() => Array.from(document.querySelectorAll('[id^=plot-]')).filter(c => c.offsetParent !== null)
  .map(c => { const svg = c.querySelector('.js-plotly-plot .main-svg');
    return {id: c.id, box: c.getBoundingClientRect().width, drawn: svg ? svg.getBoundingClientRect().width : null}; })
  .filter(w => w.drawn !== null)"""
PLOTS_FIT = f"() => ({PLOT_WIDTHS})().every(w => Math.abs(w.box - w.drawn) <= 4)"
IN_VIEW = """(sel) => { const r = document.querySelector(sel).getBoundingClientRect();
  return r.height > 0 && r.top >= 0 && r.bottom <= window.innerHeight && r.left >= 0 && r.right <= window.innerWidth; }"""
# Red "Error" pills gradio draws over outputs of a failed event.
ERROR_PILLS = """() => Array.from(document.querySelectorAll('.error, [class*=error]'))
  .filter(e => e.offsetParent !== null && (e.innerText || '').trim() === 'Error').length"""
TOASTS = """() => Array.from(document.querySelectorAll('[data-testid=toast-body], .toast-body'))
  .filter(t => t.offsetParent !== null).map(t => t.innerText)"""

# gradio keeps every tab's button in a visually hidden list (for measuring) and shows each one either in the tab
# bar or in its overflow list; these are the ones a person sees.
SHOWN_TABS = "#views .tab-wrapper > .tab-container:not(.visually-hidden) button, #views .overflow-dropdown button"
ALL_VIEWS = "() => Array.from(document.querySelectorAll('#views .visually-hidden button')).map(b => b.innerText.trim())"
UNREACHABLE_VIEWS = f"""() => ({ALL_VIEWS})().filter(name => !Array.from(document.querySelectorAll('{SHOWN_TABS}'))
  .some(b => b.innerText.trim() === name && b.getBoundingClientRect().height >= 16))"""


def open_page(browser, url: str, viewport: dict | None = None):
    """A new tab on the page, once its Generate button is there (1440x1000 unless a viewport is given)."""
    page = browser.new_page(viewport=viewport or {"width": 1440, "height": 1000})
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(url)
    page.wait_for_selector("#generate")
    return page


def wait_for_status(page, text: str, timeout_ms: float = TIMEOUT_MS) -> None:
    page.wait_for_function("(t) => document.querySelector('#status')?.innerText.includes(t)", arg=text,
                           timeout=timeout_ms)


def generate(page, tokens: int = 16) -> None:
    page.fill("#max-new-tokens input", str(tokens))
    page.click("#generate")
    page.wait_for_function("() => !document.querySelector('#status').innerText.includes('Ready')")
    wait_for_status(page, "Done.")


def click_tab(page, key: str) -> None:
    """Open a view's tab by its key; the decay curve has none: it sits beside the panes."""
    if key != "decay":
        page.locator(SHOWN_TABS).filter(has_text=re.compile(f"^{re.escape(VIEWS[key])}$")).first.click()


def show_tab(page, key: str) -> None:
    click_tab(page, key)
    page.wait_for_function(PLOT_HAS_DATA, arg=f"plot-{key}", timeout=TIMEOUT_MS)


def view_names(page) -> list[str]:
    return [n for n in page.evaluate(ALL_VIEWS) if n not in ("Run history", "Export")]


def open_view(page, name: str) -> None:
    """Show a view by its name, as a person would: click its visible tab."""
    page.locator(SHOWN_TABS).filter(has_text=re.compile(f"^{re.escape(name)}$")).first.click()
    page.wait_for_function("(n) => Array.from(document.querySelectorAll('#views button.selected'))"
                           ".some(b => b.innerText.trim() === n)", arg=name)


def assert_plots_fit(page, where: str) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(PLOTS_FIT, timeout=3000)
    except PlaywrightTimeout:
        pytest.fail(f"{where}: plots drawn narrower or wider than their box: {page.evaluate(PLOT_WIDTHS)}")


# ---------------------------------------------------------------- a page watched: its requests, its status lines


class Watched:
    """A page, every event request it sends (to count what an idle page sends) and every text its status line
    showed (a MutationObserver keeps them all, so a line shown for a moment between two looks is seen too)."""

    # Idle: no request for this long. The page's own pollers run every 300-400 ms (assets/*.js) and its only
    # server timer every 2 s (a public server's preparation line), so a storm or a late run shows within 3 s;
    # Each window is a wait the suite pays in full (a settle() is two): it was 5 s.
    QUIET_S = 3.0
    GUARD_S = 120.0  # hang guard for every wait (not a claim about speed)

    def __init__(self, page) -> None:
        import time

        self.page, self.requests = page, []
        page.on("request", lambda r: self.requests.append((time.monotonic(), r.url))
                if r.method == "POST" and re.search(r"/(queue/join|run/predict)", r.url) else None)
        page.evaluate("""() => { window.__statuses = [];
          const keep = () => { const t = document.querySelector('#status')?.innerText || '';
            if (window.__statuses[window.__statuses.length - 1] !== t) window.__statuses.push(t); };
          new MutationObserver(keep).observe(document.querySelector('#status'),
                                             {childList: true, subtree: true, characterData: true}); keep(); }""")

    def statuses(self) -> list[str]:
        return self.page.evaluate("() => window.__statuses")

    def mark(self) -> int:
        """Where the status history stands now: `since(mark)` gives the lines shown after it."""
        return len(self.statuses())

    def since(self, mark: int) -> list[str]:
        return self.statuses()[mark:]

    def status(self) -> str:
        return self.page.evaluate("() => document.querySelector('#status').innerText")

    def wait_status(self, *texts: str) -> str:
        self.page.wait_for_function("(ts) => ts.some(t => document.querySelector('#status')?.innerText.includes(t))",
                                    arg=list(texts), timeout=self.GUARD_S * 1000)
        return self.status()

    def settle(self) -> int:
        """Wait until the page sends no request for QUIET_S; then count what it sends in another QUIET_S (0 on a
        page that is idle). Fails if it never goes quiet."""
        import time

        start = time.monotonic()
        while True:
            last = self.requests[-1][0] if self.requests else start
            if time.monotonic() - max(last, start) >= self.QUIET_S:
                break
            if time.monotonic() - start > self.GUARD_S:
                pytest.fail(f"the page never went quiet: {len(self.requests)} requests, e.g. {self.requests[-5:]}")
            time.sleep(0.25)
        before = len(self.requests)
        time.sleep(self.QUIET_S)
        return len(self.requests) - before
