"""The page explains one token at a time: the logit lens, the token scrubber (slider and Play), links that carry
every control, and hover linking between the token panes and the layer grid. Headless Chromium on a tiny random
Llama with SmolLM2's 30 layers, as a person sees it; handler-level checks first (no browser)."""

from __future__ import annotations

import time
from urllib.parse import parse_qsl, urlsplit

import gradio as gr
import pytest

from d3.config import D3Config, GenerationConfig, TraceConfig, default_core
from d3.trace import RAN
from explorer.caps import Caps
from explorer.controls import CONTROL_NAMES, DEFAULTS, default_attention_layer
from explorer.explain import PAUSE, PLAY, RUN_OUTPUTS, next_token, render_scrub, show_run, toggle_play, view_opened
from explorer.page import build_demo
from explorer.runs import check_run, side_by_side
from explorer.session import Session
from explorer.share import FLAGS, RESTORE_OUTPUTS, TEXTS, controls_from_query, controls_query, restore_from_link
from tests.apphelpers import CountingEngine, serve
from tests.test_page_teaches import (
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
from tests.tiny import tiny_llama, tiny_tokenizer
from viz.layout import CELL_COLORS

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]
LAYERS = 30


@pytest.fixture(scope="module")
def engine() -> CountingEngine:
    return CountingEngine(tiny_llama(LAYERS), tiny_tokenizer(), name="tiny")


@pytest.fixture(scope="module")
def demo(engine):
    return build_demo(lambda name: engine, model_names=("tiny",), public=False, caps=Caps(max_new_tokens=64))


@pytest.fixture(scope="module")
def session(engine, demo) -> Session:
    """A finished run of the page's kind (D3 and full depth side by side, the lens's inputs kept), in a session."""
    demo.pool.engine("tiny")
    cfg = D3Config(alpha=0.9)
    last = None
    for last in side_by_side(engine, "the cat sat", cfg, GenerationConfig(max_new_tokens=10),
                             TraceConfig(lens_states=True), with_comparison=False):
        pass
    s = Session()
    s.finish(last, "D3")
    return s


def figure_of(value):
    return value if hasattr(value, "data") else value["value"]


def by_role(fig, role: str):
    return [t for t in fig.data if (t.meta or {}).get("role") == role]


# ---------------------------------------------------------------- handlers (no browser)


def test_the_page_keeps_the_lens_inputs_for_its_runs_unless_switched_off(demo) -> None:
    trace = check_run(demo.pool, DEFAULTS.with_(prompt="hi", model="tiny")).trace
    assert trace.lens_states and not trace.logit_lens  # no LM head per layer while generating: read out on demand
    assert not check_run(demo.pool, DEFAULTS.with_(prompt="hi", model="tiny", logit_lens=False)).trace.lens_states
    with pytest.raises(ValueError, match="logit_lens"):
        check_run(demo.pool, DEFAULTS.with_(prompt="hi", model="tiny", logit_lens="maybe"))


def test_the_lens_and_scrubber_are_drawn_only_while_their_tab_is_open(demo, session) -> None:
    view_opened("usage", session)
    skipped = lambda o: isinstance(o, dict) and o == gr.skip()  # noqa: E731
    assert all(skipped(o) for o in show_run(demo.pool, session, 0))  # nothing is sent after a run
    view_opened("lens", session)
    assert not any(skipped(o) for o in show_run(demo.pool, session, 0))


def test_the_lens_is_read_out_only_when_its_tab_opens(demo, engine) -> None:
    from d3.lens import has_lens_states

    last = None
    for last in side_by_side(engine, "a dog", D3Config(alpha=0.9), GenerationConfig(max_new_tokens=6),
                             TraceConfig(lens_states=True), with_comparison=False):
        pass
    s = Session()
    s.finish(last, "D3")
    assert has_lens_states(s.d3) and s.full.steps[0].lens_states is None  # kept for the D3 pane only
    view_opened("usage", s)
    show_run(demo.pool, s, 0)
    assert has_lens_states(s.d3)  # another tab is open: nothing read
    view_opened("lens", s)
    out = dict(zip(RUN_OUTPUTS, show_run(demo.pool, s, 0)))
    assert not has_lens_states(s.d3) and len(s.d3.steps[0].lens_prob) == LAYERS
    assert by_role(out["lens"], "lens")[0].z.shape == (LAYERS, len(s.d3.steps))


def test_after_a_run_the_lens_has_a_column_per_token_and_a_row_per_layer(demo, session) -> None:
    view_opened("lens", session)
    out = dict(zip(RUN_OUTPUTS, show_run(demo.pool, session, 99)))
    lens, tokens = out["lens"], len(session.d3.steps)
    heat = by_role(lens, "lens")[0]
    assert heat.z.shape == (LAYERS, tokens)  # z[layer][token]: tokens along x
    assert len(by_role(lens, "prediction-depth")[0].x) == tokens
    assert out["scrub_index"]["maximum"] == tokens - 1 and out["scrub_index"]["value"] == tokens - 1  # 99: the last
    layers = by_role(out["scrub"], "token-layers")[0]
    ran = [c == CELL_COLORS[RAN] for c in layers.marker.color]
    assert sum(ran) == session.d3.steps[-1].n_layers and len(ran) == LAYERS


def test_the_scrubber_compares_top5_with_full_depth_while_the_texts_agree(session) -> None:
    layers, topk, card = render_scrub(session, 0)
    assert {t.name for t in by_role(topk, "topk")} == {"D3", "full depth"}  # token 0: nothing written before it
    assert by_role(layers, "token-layers")[0].meta["step"] == 0
    assert "Token 0 of" in card


def test_the_scrubber_says_plainly_what_is_wrong(session) -> None:
    with pytest.raises(gr.Error, match="token must be an integer"):
        render_scrub(session, "three")
    _, _, card = render_scrub(session, 500)
    assert "Token 500 does not exist" in card
    _, _, card = render_scrub(None, 0)
    assert "Press Generate" in card


def test_play_steps_through_the_tokens_and_stops_at_the_last(session) -> None:
    last = len(session.d3.steps) - 1
    index, playing, timer, label = toggle_play(session, 2, False)
    assert (index, playing, label) == (2, True, PAUSE) and timer.active
    index, playing, timer, label = next_token(session, index, playing)
    assert (index, playing) == (3, True)
    index, playing, timer, label = next_token(session, last - 1, True)
    assert (index, playing, label) == (last, False, PLAY) and not timer.active
    assert toggle_play(session, last, False)[:2] == (0, True)  # Play at the end starts again from the first token
    assert toggle_play(session, 4, True)[:2] == (4, False)  # Pause keeps the token
    assert toggle_play(None, 0, False)[1] is False  # nothing to play


def test_a_link_carries_every_control_and_reads_back_the_same(demo) -> None:
    controls = DEFAULTS.with_(prompt="Ünïcode & ?x=1 #hash", model="tiny", alpha=0.93, core_head=2, core_tail=5,
                              start=3, drop_order="strided", fill="propagate", max_new_tokens=24, decoding="sample",
                              temperature=1.2, seed=7, unified_ratio=2.0, skipdecode_max=20, skipdecode_min=8,
                              threshold=0.8, attention_layer=11, attention_head=1, metric="cos", log_kl=True,
                              presentation=True, strategy="skipdecode", chat_template=False)
    params = dict(parse_qsl(controls_query(controls)[1:], keep_blank_values=True))  # an empty order box too
    assert set(params) == set(CONTROL_NAMES)
    assert controls_from_query(demo.pool, params) == {n: getattr(controls, n) for n in CONTROL_NAMES}


@pytest.mark.parametrize("params, message", [
    ({"alpha": "1.5"}, "alpha"), ({"core_head": "20", "core_tail": "12"}, "core"), ({"fill": "glue"}, "fill"),
    ({"prompt": " "}, "prompt is empty"), ({"max_new_tokens": "1000"}, "max_new_tokens"),
    ({"chat_template": "maybe"}, "chat_template"), ({"attention_head": "99"}, "attention_head"),
])
def test_a_bad_link_says_why_and_leaves_the_controls(demo, params, message) -> None:
    with pytest.raises(ValueError, match=message):
        controls_from_query(demo.pool, params)
    request = type("Request", (), {"query_params": params})()
    out = dict(zip(RESTORE_OUTPUTS, restore_from_link(demo.pool, request)))
    assert "not loaded" in out["status"] and all(isinstance(out[n], type(gr.skip())) for n in CONTROL_NAMES)


@pytest.mark.parametrize("name", [n for n in CONTROL_NAMES if n not in FLAGS + TEXTS])
def test_a_link_with_a_number_that_is_not_one_names_the_fields_real_range(demo, name) -> None:
    """Not "alpha must be a number in [-inf, inf]": the range said is the one the field is checked against."""
    with pytest.raises(ValueError, match=f"{name}='fast' is not a number") as err:
        controls_from_query(demo.pool, {name: "fast"})
    assert "inf" not in str(err.value), str(err.value)


def test_a_link_with_a_non_numeric_alpha_says_alphas_range(demo) -> None:
    for raw in ("fast", "nan", "1e999"):
        with pytest.raises(ValueError, match=r"alpha must be a number in \(0, 1\]"):
            controls_from_query(demo.pool, {"alpha": raw})


def test_a_link_to_another_model_sizes_the_layer_sliders_to_it() -> None:
    """The page is built for its first model (30 layers); a link naming a loaded 12-layer model resizes the core,
    attention-layer and head sliders to that model, with the link's values or the model's defaults."""
    engines = {"tiny": CountingEngine(tiny_llama(LAYERS), tiny_tokenizer(), name="tiny"),
               "tiny12": CountingEngine(tiny_llama(12), tiny_tokenizer(), name="tiny12")}
    two = build_demo(lambda name: engines[name], model_names=("tiny", "tiny12"), public=False,
                     caps=Caps(max_new_tokens=64))
    two.pool.facts("tiny12")  # loaded, as after choosing it in the Model picker
    request = type("Request", (), {"query_params": {"model": "tiny12", "core_head": "2", "prompt": "hi"}})()
    out = dict(zip(RESTORE_OUTPUTS, restore_from_link(two.pool, request)))
    head, tail = default_core(12)
    sized = {n: (out[n]["maximum"], out[n]["value"]) for n in ("core_head", "core_tail", "attention_layer")}
    assert sized == {"core_head": (11 - tail, 2), "core_tail": (11 - 2, tail),
                     "attention_layer": (11, default_attention_layer(12))}
    assert out["model"] == "tiny12" and out["prompt"] == "hi" and "loaded from the link" in out["status"]


# ---------------------------------------------------------------- in the browser

playwright_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def url(demo):
    with serve(demo) as address:
        yield address


@pytest.fixture()
def page(browser, url, request):
    pg = browser.new_page(viewport=getattr(request, "param", DESKTOP))
    pg.set_default_timeout(TIMEOUT_MS)
    pg.goto(url)
    pg.wait_for_selector("#generate")
    yield pg
    pg.close()


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
