"""Parsing what a person (or a direct API call) sends: numbers, choices, flags and prompts, each refused with a
one-line message that names the field and what is allowed."""

from __future__ import annotations

import math
from typing import Any

from d3.engine import Engine, check_prompt
from explorer.caps import Caps

MAX_NUMBER_CHARS = 64  # a number typed or sent as text: longer is refused before it is read


def shown(value: object) -> str:
    """A refused value as shown back in an error: its repr, cut to 40 characters (a huge integer by its size:
    Python refuses to write one of more than 4,300 digits)."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"<an integer of about {int(value.bit_length() * 0.30103):,} digits>"
    if isinstance(value, str) and len(value) > 40:
        value = value[:40]  # repr of the first 40 characters only: a megabyte is never copied
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def as_number(name: str, value: Any, lo: float, hi: float, *, integer: bool = False, lo_open: bool = False) -> float:
    """`value` (number or numeric text) as a float or int in [lo, hi] ((lo, hi] if `lo_open`); ValueError naming
    the field and the allowed range otherwise."""
    kind = "an integer" if integer else "a number"
    interval = f"{'(' if lo_open else '['}{_bound(lo)}, {_bound(hi)}]"
    allowed = f"{name} must be {kind} in {interval}"
    number = _to_float(name, value, allowed)
    if integer and number != math.floor(number):
        raise ValueError(f"{name}={shown(value)} is not allowed: {allowed}")
    if number < lo or number > hi or (lo_open and number == lo):
        raise ValueError(f"{name}={shown(value)} is out of range: {allowed}")
    return int(number) if integer else number


def _bound(value: float) -> str:
    """A range's end as a person reads it: 2147483647 (not 2.14748e+09), 0.8, inf."""
    return str(int(value)) if math.isfinite(value) and float(value).is_integer() else f"{value:g}"


def _to_float(name: str, value: Any, allowed: str) -> float:
    if isinstance(value, bool) or value is None or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"{name} is missing or not a number: {allowed}")
    if isinstance(value, str) and len(value) > MAX_NUMBER_CHARS:
        raise ValueError(f"{name} is {len(value):,} characters long, not a number: {allowed}")
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name}={shown(value)} is not a number: {allowed}") from None
    if not math.isfinite(number):
        raise ValueError(f"{name}={shown(value)} is not a finite number: {allowed}")
    return number


def as_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name}={shown(value)} is not allowed: {name} must be one of {', '.join(choices)}")
    return value


def as_flag(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if value in (0, 1, "true", "false", "True", "False"):
        return str(value).lower() in ("1", "true")
    raise ValueError(f"{name}={shown(value)} is not allowed: {name} must be true or false")


def whole(value: Any, default: int = 0) -> int:
    """A view index from whatever was sent: junk falls back to `default` (it only changes a drawing)."""
    try:
        return max(0, int(value))
    except (TypeError, ValueError, OverflowError):
        return default


def clean_prompt(prompt: Any, caps: Caps) -> str:
    """The prompt without control characters; ValueError if it is empty or longer than the cap."""
    if isinstance(prompt, str) and len(prompt) > caps.max_prompt_chars:
        raise ValueError(f"prompt is {len(prompt):,} characters long; the limit is {caps.max_prompt_chars:,} "
                         "characters: shorten it")
    return check_prompt(prompt)


def check_prompt_tokens(engine: Engine, prompt: str, chat_template: bool, caps: Caps) -> int:
    """Number of prompt tokens (with the chat template); ValueError above the cap."""
    ids, _ = engine.encode([prompt], chat_template)  # [1, prompt_len]
    count = int(ids.shape[1])
    limit = min(caps.max_prompt_tokens, engine.max_prompt_tokens)
    if count > limit:
        raise ValueError(f"prompt is {count} tokens long; the limit is {limit} tokens: shorten it")
    return count
