"""explorer/parse.py: numbers named by field with the range they must fall in, prompts cleaned of control
characters, and the prompt's token cap."""

from __future__ import annotations

from dataclasses import replace

import pytest

from explorer.caps import Caps
from explorer.parse import as_number, check_prompt_tokens, clean_prompt

CAPS = Caps()


@pytest.mark.parametrize("value, message", [
    (None, "alpha is missing"), ("", "alpha is missing"), (True, "alpha is missing"), ("abc", "not a number"),
    (float("nan"), "not a finite number"), (float("inf"), "not a finite number"), ("1e999", "not a finite number"),
    (0, "out of range"), (1.5, "out of range"), (-1, "out of range"),
])
def test_as_number_names_the_field_and_the_range(value, message) -> None:
    with pytest.raises(ValueError, match=message) as err:
        as_number("alpha", value, 0, 1, lo_open=True)
    assert "alpha must be a number in (0, 1]" in str(err.value)


def test_a_range_prints_whole_ends_as_integers() -> None:
    with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 2147483647\]$"):
        as_number("seed", -1, 0, 2**31 - 1, integer=True)
    with pytest.raises(ValueError, match=r"ratio must be a number in \[1, 64\]$"):
        as_number("ratio", 0.5, 1.0, 64.0)
    with pytest.raises(ValueError, match=r"alpha must be a number in \(0, 0.999\]$"):
        as_number("alpha", 1, 0, 0.999, lo_open=True)


def test_as_number_accepts_numeric_text_and_whole_floats() -> None:
    assert as_number("alpha", " 0.5 ", 0, 1) == 0.5
    assert as_number("n", 7.0, 1, 10, integer=True) == 7 and isinstance(as_number("n", "7", 1, 10, integer=True), int)
    with pytest.raises(ValueError, match="n must be an integer in"):
        as_number("n", 7.5, 1, 10, integer=True)


def test_clean_prompt_strips_control_characters_and_odd_unicode() -> None:
    assert clean_prompt("hi\x00 there\x1b\u202e\n\tok", CAPS) == "hi there\n\tok"
    for empty in ("", "   \n\t", "\x00\x01", "\u200b\u200b", "\ufeff"):
        with pytest.raises(ValueError, match="prompt is empty"):
            clean_prompt(empty, CAPS)
    with pytest.raises(ValueError, match="prompt must be text"):
        clean_prompt(None, CAPS)
    with pytest.raises(ValueError, match="limit is 8,000 characters"):
        clean_prompt("a" * 8001, CAPS)
    assert clean_prompt("café 東京 🙂", CAPS) == "café 東京 🙂"


def test_prompt_token_cap_is_enforced(tiny_engine) -> None:
    caps = replace(CAPS, max_prompt_tokens=40)  # the chat template adds about 20 characters (tokens here)
    assert check_prompt_tokens(tiny_engine, "short", True, caps) <= 40
    with pytest.raises(ValueError, match="limit is 40 tokens"):
        check_prompt_tokens(tiny_engine, "x" * 50, True, caps)
