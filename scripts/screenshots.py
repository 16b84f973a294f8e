"""Screenshots of the page on the embedded model, for a person to look at before a lecture or a release.

Serves the page (the default models) on a free local port, drives it in headless Chromium, presses Generate with
the page's defaults, and saves the first screen and every view tab at each size: a laptop (1280x800), presentation
mode on a projector (1920x1080) and on a laptop (1280x800), and a phone (390x844). Then runs each scenario once at
1280x800 and saves the screen after it. Nothing is asserted: the tests check boxes and pixels; this is for eyes.

Usage: python scripts/screenshots.py OUT_DIR [--tokens 24] [--chromium /usr/bin/chromium] [--no-scenarios] [--one-run]
       [--views TITLE ...] (only these view tabs, by their titles) [--models NAME ...] (each in OUT_DIR/NAME, opened
       by a link that sets the model: the page's default model when none is named) [--sizes laptop projector phone]

The screenshots in docs/screenshots/ (issue 44, item 7; the *-first-screen.png and *-view-*.png of each model) were
made by
    python scripts/screenshots.py docs/screenshots --tokens 8 --one-run --no-scenarios \
        --sizes laptop projector phone --views "Layer stack (animated)" --models smollm2-135m gemma3-270m
    python scripts/screenshots.py docs/screenshots --tokens 4 --one-run --no-scenarios \
        --sizes laptop projector phone --views "Layer stack (animated)" --models qwen2.5-coder-1.5b
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from explorer.page import build_demo, free_port, launch  # noqa: E402

SIZES = {"laptop": ({"width": 1280, "height": 800}, False), "projector": ({"width": 1920, "height": 1080}, True),
         "presentation-laptop": ({"width": 1280, "height": 800}, True), "phone": ({"width": 390, "height": 844}, False)}
# The view tabs a person can click (gradio keeps a hidden copy of each for measuring).
SHOWN_TABS = "#views .tab-wrapper > .tab-container:not(.visually-hidden) button, #views .overflow-dropdown button"
ALL_VIEWS = "() => Array.from(document.querySelectorAll('#views .visually-hidden button')).map(b => b.innerText.trim())"
TIMEOUT_MS = 1_200_000  # a busy 2-core machine writes SmolLM2 at ~0.5 token/s, Qwen far slower


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def open_view(page, name: str) -> None:
    tabs = page.locator(SHOWN_TABS).filter(has_text=re.compile(f"^{re.escape(name)}$"))
    if tabs.count() == 0:  # in the overflow menu: open it first
        page.locator("#views .overflow-menu button").first.click()
    tabs.first.click()
    page.wait_for_timeout(600)  # the view's figure is drawn by the browser after the tab shows


def generate(page, tokens: int) -> None:
    page.fill("#max-new-tokens input", str(tokens))
    page.click("#generate")
    page.wait_for_function("() => document.querySelector('#status')?.innerText.includes('Done')", timeout=TIMEOUT_MS)


def shoot_size(browser, url: str, out: Path, name: str, tokens: int, only: list[str] | None = None,
               model: str | None = None) -> None:
    viewport, presentation = SIZES[name]
    page = browser.new_page(viewport=viewport)
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(url + (f"?model={model}" if model else ""))  # a link that sets the model (explorer/share.py)
    page.wait_for_selector("#generate")
    if presentation:
        page.click("#presentation input")
    generate(page, tokens)
    # The first screen as a person sees it on opening the page: a model's first load scrolled the page down (Gemma
    # 3's projector screenshot showed the panes cut off at the top).
    page.evaluate("() => window.scrollTo(0, 0)")
    page.wait_for_timeout(300)
    page.screenshot(path=str(out / f"{name}-first-screen.png"))
    page.screenshot(path=str(out / f"{name}-page.png"), full_page=True)
    for view in page.evaluate(ALL_VIEWS):
        if only and view not in only:
            continue
        open_view(page, view)
        page.locator("#views").screenshot(path=str(out / f"{name}-view-{slug(view)}.png"))
    page.close()


def shoot_after_one_run(browser, url: str, out: Path, names: list[str], tokens: int, only: list[str] | None = None,
                        model: str | None = None) -> None:
    """Every size after one run (`--one-run`): the page is resized and presentation mode switched as a person does
    on the same screen, so a slow model (Qwen2.5-Coder-1.5B on a busy CPU) runs once, not once per size."""
    page = browser.new_page(viewport=SIZES[names[0]][0])
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(url + (f"?model={model}" if model else ""))
    page.wait_for_selector("#generate")
    generate(page, tokens)
    presenting = False
    for name in names:
        viewport, presentation = SIZES[name]
        page.set_viewport_size(viewport)
        if presentation != presenting:
            page.click("#presentation input")
            presenting = presentation
        page.wait_for_timeout(1500)  # the figures redrawn for the size and the mode
        page.evaluate("() => window.scrollTo(0, 0)")
        page.wait_for_timeout(300)
        page.screenshot(path=str(out / f"{name}-first-screen.png"))
        for view in page.evaluate(ALL_VIEWS):
            if only and view not in only:
                continue
            open_view(page, view)
            page.locator("#views").screenshot(path=str(out / f"{name}-view-{slug(view)}.png"))
        print(f"{model or 'default model'}, {name}: saved", flush=True)
    page.close()


def shoot_scenarios(browser, url: str, out: Path) -> None:
    page = browser.new_page(viewport=SIZES["laptop"][0])
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(url)
    page.wait_for_selector("#generate")
    for button in page.locator("[id^=scenario-]").evaluate_all("(bs) => bs.filter(b => b.tagName === 'BUTTON')"
                                                                ".map(b => b.id)"):
        page.click(f"#{button}")
        page.wait_for_timeout(1500)  # the scenario's first run has started and said so
        page.wait_for_function("() => !document.querySelector('#scenario-finding')?.innerText.includes('Running')",
                               timeout=TIMEOUT_MS)
        page.screenshot(path=str(out / f"scenario-{button.removeprefix('scenario-')}.png"), full_page=True)
    page.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokens", type=int, default=24, help="new tokens per run (the page's default is 64)")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--no-scenarios", action="store_true")
    parser.add_argument("--views", nargs="+", metavar="TITLE", help="only these view tabs (default: every one)")
    parser.add_argument("--models", nargs="+", metavar="NAME", help="each of these models in its own folder")
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    parser.add_argument("--one-run", action="store_true", help="one run per model, the page resized for each size")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    demo = build_demo()
    port = free_port()
    launch(demo, prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium,
                                        args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            for model in args.models or [None]:
                out = args.out / model if model else args.out
                out.mkdir(parents=True, exist_ok=True)
                if args.one_run:
                    shoot_after_one_run(browser, url, out, args.sizes, args.tokens, args.views, model)
                    continue
                for name in args.sizes:
                    shoot_size(browser, url, out, name, args.tokens, args.views, model)
                    print(f"{model or 'default model'}, {name}: saved", flush=True)
            if not args.no_scenarios:
                shoot_scenarios(browser, url, args.out)
                print("scenarios: saved", flush=True)
            browser.close()
    finally:
        demo.close()
    print(f"screenshots in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
