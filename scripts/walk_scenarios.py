"""A teacher's walk (issue 44): the page's scenarios on each model in headless Chromium, and for each screen a check
that no sentence in the scenario's finding, the status line or the counters contradicts the figures or counters on
the same screen: the tokens each pane shows, how many agree, the first divergence, the mean layers, the speed read
against theory, and the strategy's name.

Serves the page (the models named) on a free local port, opens it once per model with a link that sets the model
(`?model=NAME`), clicks each scenario button, waits until its finding is written, reads the screen as a person sees
it (the panes' token spans, the status line, the counters, the finding, the usage figure's columns) and checks it
(`contradictions`, pure: tests/test_walk_scenarios.py). The deeper-model scenario names its own two models (SmolLM2,
then Qwen): it runs on the first model's page only. Writes every screen's readings and what contradicted what.

Usage (a busy 2-core CPU: Qwen's runs take minutes each):
    nice -n 5 python scripts/walk_scenarios.py --json results/walk/walk.json \
        --models smollm2-135m gemma3-270m qwen2.5-coder-1.5b
results/walk/walk.json was made on a 2-core CPU beside a benchmark in two walks side by side, the server's run limit
raised (at its 180 s a loaded CPU stopped the fill scenario's run on SmolLM2, and a stopped run has no count to check):
    D3_MAX_RUN_S=900 nice -n 5 python scripts/walk_scenarios.py --json results/walk/walk.json \
        --models smollm2-135m gemma3-270m --scenarios full_vs_d3 core fill aggressive
    D3_MAX_RUN_S=900 nice -n 5 python scripts/walk_scenarios.py --json results/walk/walk.json --merge \
        --models qwen2.5-coder-1.5b
(the deeper-model scenario, SmolLM2 then Qwen, on Qwen's page; `--merge` keeps the screens of the other models).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TIMEOUT_MS = 1_500_000  # a Qwen scenario's runs on a loaded 2-core CPU
FILLS_DONE = "Fill comparison"  # the status after the fill scenario's comparison (explorer/live.py `_fills`)
SPEED_ABOVE_THEORY = 1.02  # viz.stream.SPEED_ABOVE_THEORY: read here so the check stays free of the page's code

# What a person reads on one screen, in the browser (innerText, spans' classes and the usage figure's data).
READ = """() => {
  const text = (sel) => (document.querySelector(sel)?.innerText || '').trim();
  const spans = (id) => Array.from(document.querySelectorAll(`#${id} .d3-tok`));
  const d3 = spans('d3-pane'), full = spans('full-pane');
  const usage = document.querySelector('#plot-usage .js-plotly-plot');
  let usageColumns = null;
  if (usage && usage.data) {
    const grid = usage.data.find(t => t.type === 'heatmap');
    if (grid && grid.z && grid.z.length) usageColumns = grid.z[0].length;
  }
  return {status: text('#status'), title: text('#d3-title'), counters: text('#d3-counters'),
          finding: text('#scenario-finding'), fullCounters: text('#full-counters'),
          scenario: text('#scenario-text'),
          d3Text: d3.map(s => s.innerText).join(''), fullText: spans('full-pane').map(s => s.innerText).join(''),
          d3Tokens: d3.length, fullTokens: full.length,
          diffs: d3.map((s, i) => s.classList.contains('d3-diff') ? i : -1).filter(i => i >= 0),
          badge: (() => { const pane = document.querySelector('#d3-pane'); if (!pane) return null;
            const b = pane.querySelector('.d3-badge'); if (!b) return null;
            let i = 0; for (let n = b.nextElementSibling; n; n = n.nextElementSibling) {
              if (n.classList.contains('d3-tok')) return d3.indexOf(n); } return null; })(),
          replacement: (document.querySelector('#d3-pane')?.innerText || '').includes('\\ufffd') ||
                       (document.querySelector('#full-pane')?.innerText || '').includes('\\ufffd'),
          usageColumns};
}"""


def _number(pattern: str, text: str, group: int = 1) -> float | None:
    m = re.search(pattern, text)
    return float(m[group]) if m else None


def contradictions(screen: dict[str, Any], strategy: str = "D3") -> list[str]:
    """Every sentence on one screen that the figures or counters beside it contradict (empty: none). `screen` is
    READ's result; `strategy` the name the run's strategy goes by on the page."""
    out: list[str] = []
    status, counters, finding = screen["status"], screen["counters"], screen["finding"]
    n_d3, n_full, diffs = screen["d3Tokens"], screen["fullTokens"], screen["diffs"]
    # Tokens: the status's counts against the panes' tokens, the counters' and the usage grid's columns.
    said = re.search(r"(\d+) (.+?) tokens, (\d+) full-depth tokens: (\d+) of the (\d+) tokens both wrote agree", status)
    agree_counter = re.search(r"(\d+) / (\d+)\s*\n\s*tokens agreeing", counters)
    if not screen["title"].startswith(strategy):
        out.append(f"the D3 pane's title {screen['title']!r} does not name {strategy}")
    if said:
        s_d3, name, s_full, agreeing, compared = int(said[1]), said[2], int(said[3]), int(said[4]), int(said[5])
        if name != strategy:
            out.append(f"status names the strategy {name!r}, the run was {strategy}")
        if s_d3 != n_d3:
            out.append(f"status says {s_d3} {name} tokens, the pane shows {n_d3}")
        if s_full != n_full:
            out.append(f"status says {s_full} full-depth tokens, the pane shows {n_full}")
    elif status.startswith("Stopped"):  # a run stopped at the server's limit: its status gives no count to check
        return []
    elif status.startswith(FILLS_DONE) and agree_counter:
        # The fill scenario ends on its fill comparison's status, which counts nothing: the run's count on this
        # screen is the counters', checked against the panes and the finding as the status's would be.
        agreeing, compared = int(agree_counter[1]), int(agree_counter[2])
    else:
        return [*out, f"the status gives no count of the run: {status!r}"]
    who = "status" if said else "the agreement counter"
    if compared != min(n_d3, n_full):
        out.append(f"{who} compares {compared} tokens, the panes share {min(n_d3, n_full)}")
    shown_agree = compared - len([i for i in diffs if i < compared])
    if agreeing != shown_agree:
        out.append(f"{who} says {agreeing} of {compared} agree, the pane marks {compared - shown_agree} differing")
    if screen.get("usageColumns") is not None and screen["usageColumns"] != n_d3:
        out.append(f"the usage grid has {screen['usageColumns']} token columns, the pane {n_d3} tokens")
    tokens_counter = _number(r"^\s*(\d+)\s*\n\s*tokens\b", counters)
    if tokens_counter is not None and int(tokens_counter) != n_d3:
        out.append(f"the tokens counter says {int(tokens_counter)}, the pane shows {n_d3}")
    if agree_counter and (int(agree_counter[1]), int(agree_counter[2])) != (agreeing, compared):
        out.append(f"the counter says {agree_counter[1]} / {agree_counter[2]} agree, the status {agreeing} of {compared}")
    # First divergence: the status's, the pane's badge and the first token marked as differing.
    first = _number(r"First divergence at token (\d+)", status)
    marked = diffs[0] if diffs else None
    if said and (None if first is None else int(first)) != marked:
        out.append(f"status puts the first divergence at {first}, the pane marks token {marked} first")
    if screen.get("badge") is not None and screen["badge"] != marked:
        out.append(f"the pane's badge sits before token {screen['badge']}, the first differing token is {marked}")
    if "No divergence" in status and diffs:
        out.append(f"status says no divergence, the pane marks {len(diffs)} differing tokens")
    # Speed read against theory: a measured speedup above the theoretical, or below 1, is said as such.
    theory = _number(r"([\d.]+)×\s*\n\s*theoretical speedup", counters)
    ratio = _number(r"([\d.]+)× measured \(", counters)
    if theory is not None and ratio is not None:
        if ratio > theory * SPEED_ABOVE_THEORY and "artefact" not in counters and "above" not in counters:
            out.append(f"counters show {ratio:.2f}× measured above the theoretical {theory:.2f}× without a word")
        if ratio < 1 and "slower" not in counters and "artefact" not in counters:
            out.append(f"counters show {ratio:.2f}× (slower than full depth) without a word")
    said_speed = re.search(r"Measured speed ([\d.]+)×", status)
    if said_speed and theory is not None:
        r = float(said_speed[1])
        if r > theory * SPEED_ABOVE_THEORY and "artefact" not in status:
            out.append(f"status gives {r:.2f}× above the theoretical {theory:.2f}× without a word")
    # The finding: its last run's numbers against this screen (the screen shows the scenario's last run).
    if finding and "interrupted" not in finding:
        rows = [line for line in finding.splitlines() if "layers per token" in line]
        last = rows[-1] if rows else ""
        compared_over = "compared over the first" in finding
        layers = _number(r"([\d.]+) of (\d+) layers per token", last)
        mean = _number(r"([\d.]+) / (\d+)\s*\n\s*mean layers", counters)
        if layers is not None and mean is not None and not compared_over and abs(layers - mean) > 0.051:
            out.append(f"the finding says {layers} layers per token, the counter {mean}")
        f_theory = _number(r"\(([\d.]+)× fewer layer runs\)", last)
        if f_theory is not None and theory is not None and not compared_over and abs(f_theory - theory) > 0.0051:
            out.append(f"the finding says {f_theory:.2f}× fewer layer runs, the counter {theory:.2f}×")
        agreement = re.search(r"agreement with full depth ([\d.]+) \((\d+) of the (\d+) tokens both wrote agree", last)
        if agreement:
            value, x, y = float(agreement[1]), int(agreement[2]), int(agreement[3])
            if abs(value - x / y) > 0.0051:
                out.append(f"the finding's agreement {value} is not its own {x} of {y}")
            if not compared_over and (x, y) != (agreeing, compared):
                out.append(f"the finding says {x} of {y} agree, the status {agreeing} of {compared}")
        f_first = _number(r"first divergence at token (\d+)", last)
        if not compared_over and last:
            if "never diverged" in last and diffs:
                out.append("the finding says the run never diverged, the pane marks differing tokens")
            if f_first is not None and int(f_first) != marked:
                out.append(f"the finding puts the first divergence at {int(f_first)}, the pane at {marked}")
        f_speed = re.search(r"measured ([\d.]+)×(: [^\n]*)?", last)  # the clause ends the run's line
        if f_speed and theory is not None:
            r = float(f_speed[1])
            if r > theory * SPEED_ABOVE_THEORY and "artefact" not in (f_speed[2] or ""):
                out.append(f"the finding gives {r:.2f}× above the theoretical {theory:.2f}× without a word")
            if r < 1 and "slower" not in (f_speed[2] or "") and "artefact" not in (f_speed[2] or ""):
                out.append(f"the finding gives {r:.2f}× (slower than full depth) without a word")
    if screen.get("replacement"):
        out.append("a pane shows U+FFFD (a replacement character) where bytes should be")
    return out


def walk(url: str, browser: Any, model: str, scenarios: list[str], log: Any,
         saved: Any = None) -> list[dict[str, Any]]:
    """The scenarios on one model's page; `saved(screens)` after each screen (a slow model's walk cut short
    keeps the screens it read)."""
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(f"{url}?model={model}")
    page.wait_for_selector("#generate")
    screens = []
    for key in scenarios:
        button = f"#scenario-{key}"
        if page.locator(button).count() == 0:
            screens.append({"model": model, "scenario": key, "skipped": "no such button on this page"})
            continue
        started = time.monotonic()
        page.click(button)
        page.wait_for_timeout(1500)
        page.wait_for_function("() => { const f = document.querySelector('#scenario-finding')?.innerText || '';"
                               " return f.trim() && !f.includes('Running'); }", timeout=TIMEOUT_MS)
        # the fill scenario's last status is its comparison's ("Fill comparison done: ..."), not the run's "Done."
        page.wait_for_function("() => /Done|Stopped|Fill comparison done/.test("
                               "document.querySelector('#status')?.innerText || '')", timeout=TIMEOUT_MS)
        page.wait_for_timeout(1000)  # the figures after the last update
        screen = page.evaluate(READ)
        found = contradictions(screen)
        row = {"model": model, "scenario": key, "seconds": round(time.monotonic() - started, 1), "screen": screen,
               "stopped": screen["status"].startswith("Stopped"), "contradictions": found}
        screens.append(row)
        log(f"{model} {key}: {row['seconds']} s, {len(found)} contradiction(s){': ' if found else ''}"
            + "; ".join(found))
        if saved is not None:
            saved(screens)
    page.close()
    return screens


def recheck(path: Path) -> int:
    """The screens a walk read, checked again with `contradictions` as it is now (it is pure: no page, no model)."""
    report = json.loads(path.read_text(encoding="utf-8"))
    for screen in report["screens"]:
        if "screen" in screen:
            screen["stopped"] = screen["screen"]["status"].startswith("Stopped")
            screen["contradictions"] = contradictions(screen["screen"])
    report["screens_with_contradictions"] = len([s for s in report["screens"] if s.get("contradictions")])
    path.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(report['screens'])} screens, {report['screens_with_contradictions']} with a contradiction: {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m", "qwen2.5-coder-1.5b"])
    parser.add_argument("--scenarios", nargs="+", help="scenario keys (default: every one the page offers)")
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--recheck", action="store_true", help="only check the screens already in --json again")
    parser.add_argument("--merge", action="store_true",
                        help="keep the screens already in --json that this walk does not read again (a slow model "
                             "walked on its own)")
    args = parser.parse_args(argv)
    if args.recheck:
        return recheck(args.json)
    from playwright.sync_api import sync_playwright

    from explorer.caps import Caps
    from explorer.page import build_demo, free_port, launch
    from explorer.scenarios import SCENARIOS

    keys = args.scenarios or list(SCENARIOS)
    demo = build_demo(model_names=tuple(dict.fromkeys([*args.models, "smollm2-135m", "qwen2.5-coder-1.5b"])),
                      public=False, caps=Caps.from_env())
    port = free_port()
    launch(demo, prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
    url = f"http://127.0.0.1:{port}/"
    ours: list[dict[str, Any]] = []  # the screens this walk read

    def log(line: str) -> None:
        print(line, flush=True)

    def save(screens: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The report: this walk's screens so far, and with `--merge` those the file holds now of other models or
        scenarios (read again at each save: a walk of another model beside this one writes the same file)."""
        models, scenarios, kept = list(args.models), list(keys), []
        if args.merge and args.json.is_file():
            before = json.loads(args.json.read_text(encoding="utf-8"))
            kept = [s for s in before["screens"] if s["model"] not in args.models or s["scenario"] not in keys]
            models = list(dict.fromkeys([*before["models"], *args.models]))
            scenarios = list(dict.fromkeys([*before["scenarios"], *keys]))
        every = [*kept, *ours, *(screens or [])]
        report = {"models": models, "scenarios": scenarios, "screens": every,
                  "screens_with_contradictions": len([s for s in every if s.get("contradictions")])}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        return report

    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium,
                                        args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            for i, model in enumerate(args.models):
                # the deeper-model scenario runs SmolLM2 then Qwen whatever the page's model: once is enough
                these = [k for k in keys if k != "deeper" or i == 0]
                ours += walk(url, browser, model, these, log, save)
            browser.close()
    finally:
        demo.close()
    report = save()
    log(f"{len(report['screens'])} screens, {report['screens_with_contradictions']} with a contradiction: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
