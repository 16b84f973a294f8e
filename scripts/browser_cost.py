"""What one browser test costs in CPU: the page opened in headless Chromium (tiny random Llamas under the embedded
models' names, as tests/test_browser_sequences.py serves them), then opened and run for 4 tokens, then left idle.
CPU-seconds are this process's and its children's (the served page's threads, Chromium's processes), by psutil.
Prints one line per measure; docs/install.md quotes them.

    python scripts/browser_cost.py [--pages 4]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.apphelpers import serve_engines, tiny_engines  # noqa: E402 (the repository root first)

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
GUARD_MS = 120_000  # a hang guard, not a claim


def cpu_seconds(process: psutil.Process) -> float:
    """User + system CPU of a process and its living descendants."""
    total = 0.0
    for each in [process, *process.children(recursive=True)]:
        try:
            times = each.cpu_times()
        except psutil.Error:  # ended between the listing and the look
            continue
        total += times.user + times.system
    return total


def open_page(browser, url: str):
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(url)
    page.wait_for_selector("#plot-decay .js-plotly-plot .main-svg", timeout=GUARD_MS)
    return page


def run_once(page) -> None:
    page.fill("#max-new-tokens input", "4")
    page.click("#generate")
    page.wait_for_function("() => document.querySelector('#status')?.innerText.includes('Done.')", timeout=GUARD_MS)


def measure(browser, url: str, pages: int, generate: bool) -> tuple[float, float]:
    """(CPU-seconds, wall seconds) per page opened (and run, with `generate`), then closed."""
    me = psutil.Process()
    cpu, wall = cpu_seconds(me), time.monotonic()
    for _ in range(pages):
        page = open_page(browser, url)
        if generate:
            run_once(page)
        page.close()
    return (cpu_seconds(me) - cpu) / pages, (time.monotonic() - wall) / pages


def idle_cost(browser, url: str, seconds: float = 5.0) -> float:
    """CPU-seconds per second while one page stays open and nobody touches it."""
    page, me = open_page(browser, url), psutil.Process()
    cpu = cpu_seconds(me)
    time.sleep(seconds)
    spent = cpu_seconds(me) - cpu
    page.close()
    return spent / seconds


def main() -> None:
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=4, help="pages per measure (default 4)")
    pages = parser.parse_args().pages
    engines = tiny_engines({"smollm2-135m": 30, "gemma3-270m": 18})
    with serve_engines(engines) as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        open_page(browser, url).close()  # the first open warms the server's caches
        for label, generate in (("open", False), ("open + a 4-token run", True)):
            cpu, wall = measure(browser, url, pages, generate)
            print(f"{label}: {cpu:.2f} CPU-s per page, {wall:.2f} s wall")
        print(f"an idle open page: {idle_cost(browser, url):.2f} CPU-s per second")
        browser.close()


if __name__ == "__main__":
    main()
