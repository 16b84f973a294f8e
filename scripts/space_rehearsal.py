"""The Space rehearsal's two halves that need Python (scripts/space_rehearsal.sh runs them with the dev venv's Python,
which has playwright: the visitor's browser, not part of the Space).

  hub-cache DIR           lay out SmolLM2 and Qwen2.5-Coder-1.5B as a hub download would leave them in DIR
                          (HF_HOME/hub), hard-linked from their conversions in ~/.cache/d3-explorer
  browse URL OUT LOG T0   a real Chromium on the served page: the first page, the scenario "D3 on a deeper model",
                          then a default run on each model; each step timed from T0 (the epoch second the install
                          began), the app's log LOG read for when each model was prepared; figures to OUT/figures.json,
                          screenshots to OUT/*.png
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RUN_TIMEOUT_MS = 900_000  # a run on a busy 2-core CPU: D3_MAX_RUN_S is 180 s; the deeper scenario is two runs + loads
MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-1.5b")
CHROMIUM = "/usr/bin/chromium"


def hub_cache(target: Path) -> None:
    from d3.models import KNOWN_MODELS, known_directory
    from d3.testing import hub_snapshot

    for name in ("smollm2-135m", "qwen2.5-coder-1.5b"):
        hub_id = KNOWN_MODELS[name].hub_id
        assert hub_id is not None
        snapshot = hub_snapshot(target, hub_id, known_directory(name))
        print(f"hub cache: {hub_id} in {snapshot}")


class Figures:
    def __init__(self, t0: float, out: Path) -> None:
        self.t0, self.out, self.rows = t0, out, {}

    def mark(self, what: str, value: object = None) -> None:
        self.rows[what] = round(time.time() - self.t0, 1) if value is None else value
        print(f"rehearsal: {what}: {self.rows[what]}", flush=True)
        (self.out / "figures.json").write_text(json.dumps(self.rows, indent=1))


def watch_log(log: Path, figures: Figures, stop: threading.Event) -> None:
    """Mark when the app's log says each model is prepared ("model 'x' is ready") or failed."""
    seen: set[str] = set()
    while not stop.is_set():
        text = log.read_text(errors="replace") if log.exists() else ""
        for name in re.findall(r"model '([^']+)' is ready", text):
            if name not in seen:
                seen.add(name)
                figures.mark(f"prepared {name} (s)")
        for name in re.findall(r"could not prepare model '([^']+)'", text):
            if name not in seen:
                seen.add(name)
                figures.mark(f"preparation failed {name}", True)
        stop.wait(0.5)


def status(page) -> str:
    return page.evaluate("() => document.querySelector('#status')?.innerText || ''")


def wait_done(page, timeout_ms: int = RUN_TIMEOUT_MS) -> str:
    """Wait for the run to end (Done, stopped at the time limit, or refused) and return the status line."""
    page.wait_for_function("() => { const s = document.querySelector('#status')?.innerText || '';"
                           " return s.includes('Done.') || s.includes('Stopped') || s.includes('being prepared')"
                           " || s.includes('waiting to be prepared') || s.includes('could not'); }",
                           timeout=timeout_ms)
    return status(page)


def browse(url: str, out: Path, log: Path, t0: float) -> None:
    from playwright.sync_api import sync_playwright

    figures = Figures(t0, out)
    stop = threading.Event()
    threading.Thread(target=watch_log, args=(log, figures, stop), daemon=True).start()
    while True:  # the first page: the server answers
        try:
            urllib.request.urlopen(url, timeout=5).read()
            break
        except OSError:
            time.sleep(0.5)
    figures.mark("server answers (s)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        page.set_default_timeout(RUN_TIMEOUT_MS)
        page.goto(url)
        page.wait_for_selector("#generate")
        figures.mark("first page drawn (s)")
        page.wait_for_timeout(2500)  # one tick of the preparation line
        figures.mark("preparation line", page.evaluate(
            "() => document.querySelector('#preparing')?.innerText || ''"))
        page.screenshot(path=str(out / "first_page.png"))

        page.click("#scenario-deeper")
        page.wait_for_function("() => { const f = document.querySelector('#scenario-finding')?.innerText || '';"
                               " return f.includes('run 2') || f.includes('interrupted'); }", timeout=RUN_TIMEOUT_MS)
        finding = page.evaluate("() => document.querySelector('#scenario-finding').innerText")
        figures.mark("deeper scenario done (s)")
        figures.mark("deeper scenario finding", finding)
        figures.mark("deeper scenario status", status(page))
        page.screenshot(path=str(out / "deeper_scenario.png"), full_page=False)

        dropdown = page.locator("#model input")
        for name in MODELS:
            dropdown.click()
            page.get_by_role("option", name=name, exact=True).click()
            page.wait_for_timeout(1500)
            tokens = page.evaluate("() => document.querySelector('#max-new-tokens input')?.value")
            started = time.time()
            page.click("#generate")
            page.wait_for_timeout(2000)
            line = wait_done(page)
            if "prepared" in line:  # refused at once while the server prepares it: wait for it, then try again
                figures.mark(f"{name}: refused while being prepared, after (s)", round(time.time() - started, 1))
                figures.mark(f"{name}: refusal", line.strip()[:300])
                page.screenshot(path=str(out / f"refused_{name}.png"))
                while f"prepared {name} (s)" not in figures.rows and f"preparation failed {name}" not in figures.rows:
                    time.sleep(1)
                started = time.time()
                page.click("#generate")
                page.wait_for_function("() => !(document.querySelector('#status')?.innerText || '')"
                                       ".includes('prepared')", timeout=60_000)
                line = wait_done(page)
            figures.mark(f"{name}: default run ({tokens} tokens) took (s)", round(time.time() - started, 1))
            figures.mark(f"{name}: default run done (s)")
            figures.mark(f"{name}: status", line.strip()[:400])
            page.screenshot(path=str(out / f"default_{name}.png"))
        browser.close()
    stop.set()


if __name__ == "__main__":
    if sys.argv[1] == "hub-cache":
        hub_cache(Path(sys.argv[2]))
    elif sys.argv[1] == "browse":
        browse(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]), float(sys.argv[5]))
    else:
        raise SystemExit(__doc__)
