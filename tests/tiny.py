"""The tiny random models of d3.testing, under the name the tests import them by."""

from d3.testing import CHARS, SPECIALS, tiny_llama, tiny_tokenizer

__all__ = ["CHARS", "SPECIALS", "tiny_llama", "tiny_tokenizer"]
