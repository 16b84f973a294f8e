"""The tiny random models of d3.testing, under the name the tests import them by."""

from d3.testing import CHARS, SPECIALS, tiny_llama, tiny_tokenizer

__all__ = ["CHARS", "SPECIALS", "tiny_llama", "tiny_tokenizer"]


# A random 6-layer Gemma 3: sliding layers (rope base 10k) and global layers 1 and 4 (rope base 1M).
GEMMA_TYPES = ("sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "full_attention",
               "sliding_attention")


def tiny_gemma3(seed: int = 0, sliding_window: int = 4):
    """The 6-layer Gemma 3 of GEMMA_TYPES (vocab 99, hidden 32, sliding window 4), random weights, eval mode."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=6,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, layer_types=list(GEMMA_TYPES),
                           sliding_window=sliding_window, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return Gemma3ForCausalLM(cfg).eval()
