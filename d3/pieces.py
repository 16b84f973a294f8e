"""A token's own text where it holds only part of a character: byte-level tokenizers split a multi-byte UTF-8
character (an emoji, most CJK characters) into tokens that decode, one at a time, to U+FFFD. Such a token is shown
with its bytes written out ("<0xF0><0x9F>"), read from the token's string (a byte-fallback token or a byte-level
BPE token). Imports nothing: the tokenizer is any Hugging Face tokenizer."""

from __future__ import annotations

import re
from typing import Any

BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # a sentencepiece byte token (Gemma, Llama 2): "<0xE2>"


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's alphabet (GPT-2's, SmolLM2's, Qwen's): the printable character a token's string holds for
    each byte (the printable bytes stand for themselves, the others for chr(256 + n), in order)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + n): b for n, b in enumerate(others)}}


BYTE_LEVEL = _byte_level_alphabet()


def token_bytes(tokenizer: Any, token_id: int) -> bytes | None:
    """The bytes a token stands for, where its string shows them: a byte-fallback token ("<0xE2>") or a byte-level
    BPE token ("\u0120\u00f0\u0141": a space and the bytes F0 9F); None for any other token."""
    piece = tokenizer.convert_ids_to_tokens(int(token_id))
    if not isinstance(piece, str) or not piece:
        return None
    if match := BYTE_FALLBACK.fullmatch(piece):
        return bytes([int(match.group(1), 16)])
    if all(ch in BYTE_LEVEL for ch in piece):
        return bytes(BYTE_LEVEL[ch] for ch in piece)
    return None


def piece_text(tokenizer: Any, token_id: int) -> str:
    """A token's text on its own, with the bytes of a multi-byte character it holds only a part of written out
    ("<0xF0><0x9F>"): decoded alone, such a part is U+FFFD ("\ufffd"), which says nothing."""
    text = tokenizer.decode([int(token_id)], skip_special_tokens=False)
    raw = token_bytes(tokenizer, token_id) if "\ufffd" in text else None
    if raw is None:
        return text
    return "".join(f"<0x{ord(ch) - 0xDC00:02X}>" if 0xDC80 <= ord(ch) <= 0xDCFF else ch
                   for ch in raw.decode("utf-8", errors="surrogateescape"))
