"""A token that holds only part of a multi-byte character (issue 35: shown as "�"): byte-level tokenizers split an
emoji or a CJK character into such tokens. The text each token adds still joins to the answer; where a view shows
one token on its own, it shows the bytes it holds ("<0xF0><0x9F>"), in the panes, the layer grid, the scrubber,
the layer stack, the top-k candidates and the logit lens. With the real tokenizers of SmolLM2 (byte-level BPE)
and Gemma 3 (byte fallback), skipped where they are not cached."""

from __future__ import annotations

from dataclasses import replace

import pytest

from d3.config import D3Config
from d3.pieces import piece_text
from d3.trace_builder import token_texts
from tests.traces import make_trace

TEXT = "I love 🍕 and 日本語"


def _tokenizer(model: str):
    from transformers import AutoTokenizer

    from d3.models import cache_root

    found = sorted((cache_root() / model).glob("*/tokenizer.json"))
    if not found:
        pytest.skip(f"{model}'s tokenizer is not cached")
    return AutoTokenizer.from_pretrained(str(found[0].parent))


@pytest.fixture(scope="module")
def smol():
    return _tokenizer("smollm2-135m")


def test_a_part_of_a_character_is_shown_by_its_bytes_and_the_text_still_joins(smol) -> None:
    ids = smol.encode(TEXT, add_special_tokens=False)
    pieces = [token_texts(smol, ids, i) for i in range(len(ids))]
    assert "".join(text for text, _ in pieces) == TEXT
    partial = [piece for _, piece in pieces if piece]
    assert partial, "the prompt must hold tokens that are parts of a character"
    assert " <0xF0><0x9F>" in partial  # the space and the first two of the pizza's four bytes
    assert all("\ufffd" not in text + piece for text, piece in pieces)
    alone = [piece_text(smol, i) for i in ids]  # as the top-k candidates and the logit lens show a token
    assert "\ufffd" not in "".join(alone) and "<0x8D>" in alone


def test_a_byte_fallback_token_is_shown_by_its_byte() -> None:
    gemma = _tokenizer("gemma3-270m")
    byte = gemma.convert_tokens_to_ids("<0xE2>")
    assert gemma.decode([byte]) == "\ufffd"  # what the page showed
    assert piece_text(gemma, byte) == "<0xE2>"


def test_every_view_of_a_token_shows_its_bytes_not_a_replacement_character(smol) -> None:
    from viz.grid import layer_grid
    from viz.scrub import scrub_html, token_layers, topk_compare
    from viz.stack import layer_stack
    from viz.stream import token_html

    ids = smol.encode(TEXT, add_special_tokens=False)
    texts, pieces = zip(*(token_texts(smol, ids, i) for i in range(len(ids))))
    trace = make_trace(D3Config(alpha=0.9), num_layers=12, steps=len(ids), token_ids=ids, texts=list(texts))
    steps = tuple(replace(s, piece=p, topk=((i, piece_text(smol, i), 0.6), (1, " dog", 0.2)))
                  for s, p, i in zip(trace.steps, pieces, ids))
    trace = trace.with_steps(steps)
    partial = next(i for i, p in enumerate(pieces) if p == "<0x8D>")  # adds no text: the pizza's third byte

    pane = token_html(trace)
    assert "\ufffd" not in pane and "🍕" in pane and "日" in pane
    assert "&lt;0x8D&gt;" in pane  # the token's tooltip names its byte
    assert "min-width:0.4em" in pane  # and it keeps a sliver of its colour in the text (a token to hover)

    shown = [layer_grid(trace).to_json(), token_layers(trace, partial).to_json(), topk_compare(trace, partial).to_json(),
             scrub_html(trace, partial), layer_stack(trace).to_json()]
    for out in shown:
        assert "\\ufffd" not in out and "\ufffd" not in out and "∅" not in out
    assert all("0x8D" in out for out in shown), [out[:200] for out in shown if "0x8D" not in out]


@pytest.mark.parametrize("model, byte_token", [("smollm2-135m", "â"), ("gemma3-270m", "<0xE2>")])
def test_a_byte_no_token_completes_is_shown_as_bytes_and_the_next_token_as_itself(model, byte_token) -> None:
    """Issue 44, D8: a live run on SmolLM2 wrote "frontirsails �/undabase": the first byte of a character (0xE2),
    then "/". Its pane showed "�" and the tooltip of "/" said "token '�/' (id 31)". With SmolLM2's byte-level BPE
    (the byte 0xE2 is its character "â") and Gemma 3's byte fallback ("<0xE2>")."""
    from d3.trace import TokenStep
    from viz import token_html

    smol = _tokenizer(model)
    byte = smol.convert_tokens_to_ids(byte_token)
    ids = smol.encode("frontirsails", add_special_tokens=False) + [byte] + smol.encode("/undabase", add_special_tokens=False)
    at = ids.index(byte)
    texts = [token_texts(smol, ids, i) for i in range(len(ids))]
    assert texts[at] == ("", "<0xE2>") and texts[at + 1][0] == "/"
    assert all("\ufffd" not in text for text, _ in texts)
    steps = tuple(TokenStep(step=i, token_id=t, text=text, piece=piece, layers_run=(0, 1), filled=(), planned=2,
                            entropy=0.0, wall_ms=1.0) for i, (t, (text, piece)) in enumerate(zip(ids, texts)))
    trace = make_trace(D3Config(), num_layers=2, steps=1).with_steps(steps)
    pane = token_html(trace)
    assert "\ufffd" not in pane and "&lt;0xE2&gt;</span>" in pane and "token &#x27;/&#x27; (id" in pane


def test_byte_fallback_characters_in_a_row_each_show_once_and_a_started_one_as_its_bytes() -> None:
    """Issue 44, D8, live on Gemma 3 (copying Egyptian hieroglyphs, four byte tokens each): Hugging Face's byte-fallback
    decoder turns a run of byte tokens that ends inside a character into U+FFFD per byte, so the decoded left context
    lost the character completed just before; the next character's first byte showed as the text "<0xF0>", and the
    token completing it as "𓀄𓀄"."""
    gemma = _tokenizer("gemma3-270m")
    byte = lambda b: gemma.convert_tokens_to_ids(f"<0x{b:02X}>")  # noqa: E731
    glyphs = "𓀄𓀄𓀃"
    ids = gemma.encode("Hi", add_special_tokens=False) + [byte(b) for b in glyphs.encode()] + [byte(0xF0)] \
        + gemma.encode("A", add_special_tokens=False) + [byte(0x93)]
    texts = [token_texts(gemma, ids, i) for i in range(len(ids))]
    assert "".join(text for text, _ in texts) == "Hi" + glyphs + "A"  # each character once, where its bytes complete
    start = len(ids) - 3 - 4 * len(glyphs)
    assert [t for t, _ in texts[start:start + 4]] == ["", "", "", "𓀄"]
    assert [p for _, p in texts[start:start + 4]] == ["<0xF0>", "<0x93>", "<0x80>", ""]
    assert texts[-3] == ("", "<0xF0>") and texts[-2][0] == "A"  # a first byte no token went on with: its bytes
    assert texts[-1] == ("", "<0x93>")  # a continuation byte with no character: its bytes, never U+FFFD
    assert all("\ufffd" not in text and "<0x" not in text for text, _ in texts)
