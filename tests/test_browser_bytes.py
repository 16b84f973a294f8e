"""Bytes as bytes in a live run on the real models (issue 44, item 4, D8), read in headless Chromium as a person reads
it: a prompt that makes SmolLM2 (byte-level BPE: most hiragana take two tokens, the first holding two of a character's
three bytes) and Gemma 3 (byte fallback: an Egyptian hieroglyph is four byte tokens) write characters a token at a
time. Each pane shows the characters once their bytes complete and never U+FFFD; a token that holds part of a
character is named by its bytes in its tooltip ("<0xE3><0x81>"), with its real id."""

from __future__ import annotations

import re

import pytest

from d3.models import get_model
from d3.pieces import token_bytes
from explorer.caps import Caps
from explorer.page import build_demo
from tests.apphelpers import serve
from tests.pagehelpers import open_page, wait_for_status

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]
playwright_api = pytest.importorskip("playwright.sync_api")

# (model, prompt, a character full depth writes from those bytes), found by running the real models (greedy)
CASES = [
    ("smollm2-135m", "Write 'thank you' in Japanese hiragana, nothing else.", re.compile("[\u3041-\u3096]")),
    ("gemma3-270m", "Repeat exactly, nothing else: 𓀀𓀁𓀂𓀃", re.compile("[\U00013000-\U0001342F]")),
]
TOKENS = 8
# Each token span of a pane: the text it shows and its tooltip.
SPANS = """(id) => Array.from(document.querySelectorAll(`#${id} .d3-tok`)).map(s => ({text: s.innerText,
  title: s.getAttribute('title') || ''}))"""


@pytest.fixture(scope="module")
def url():
    demo = build_demo(model_names=tuple(model for model, _, _ in CASES), public=False, caps=Caps(max_new_tokens=64))
    with serve(demo) as address:
        yield address


@pytest.mark.parametrize("model, prompt, written", CASES, ids=[model for model, _, _ in CASES])
def test_a_live_run_shows_characters_whose_bytes_complete_and_names_a_partial_token_by_its_bytes(
        browser, url, model, prompt, written) -> None:
    tokenizer = get_model(model).tokenizer
    page = open_page(browser, f"{url}?model={model}")
    try:
        page.wait_for_function("(m) => document.querySelector('#model input')?.value === m", arg=model)
        page.wait_for_timeout(500)  # the link's controls are set (the page's restore runs as it opens)
        page.fill("#prompt textarea", prompt)
        page.fill("#max-new-tokens input", str(TOKENS))
        page.click("#generate")
        page.wait_for_function("() => !document.querySelector('#status').innerText.includes('Ready')")
        wait_for_status(page, "Done.")
        for pane in ("full-pane", "d3-pane"):
            assert "\ufffd" not in page.inner_text(f"#{pane}"), pane  # never a replacement character
        full_text = page.inner_text("#full-pane")
        assert written.search(full_text), full_text  # the characters, once their bytes complete
        spans = page.evaluate(SPANS, "full-pane")
        partial = [s for s in spans if re.search(r"token '((?:<0x[0-9A-F]{2}>)+)' \(id (\d+)\)", s["title"])]
        assert partial, [s["title"].splitlines()[0] for s in spans]
        for span in partial:
            shown, token_id = re.search(r"token '((?:<0x[0-9A-F]{2}>)+)' \(id (\d+)\)", span["title"]).groups()
            raw = bytes(int(b, 16) for b in re.findall(r"<0x([0-9A-F]{2})>", shown))
            assert token_bytes(tokenizer, int(token_id)) == raw, (shown, token_id)  # its real id holds these bytes
            assert "<0x" not in span["text"] and "\ufffd" not in span["text"]  # the next token completes it
        page.wait_for_timeout(100)
        assert page.locator(".toast-body.error").count() == 0
    finally:
        page.close()
