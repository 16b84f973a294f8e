"""d3/adapter.py: the model's public pieces called one layer at a time give back exactly what the model's own
forward computes: the logits, each layer's keys and values (what state propagation writes), and its attention
weights; a model of a family it does not know is refused before anything runs."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.cache_utils import DynamicCache

from d3.adapter import Adapter, check_supported
from d3.testing import tiny_family_model, tiny_llama
from tests.tiny import tiny_gemma3

IDS = torch.tensor([[5, 17, 3, 42, 8, 23, 11]])


def layer_by_layer(adapter: Adapter, ids: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor], DynamicCache]:
    """Logits of the last position, the residual entering every layer, and the cache, from the adapter's pieces."""
    positions = torch.arange(ids.shape[1])[None]
    cache = DynamicCache(config=adapter.config)
    hidden = adapter.embed(ids)
    masks, ropes = adapter.masks(hidden, None, cache, positions), adapter.rope(hidden, positions)
    entering = []
    for idx in range(adapter.num_layers):
        entering.append(hidden)
        kind = adapter.layer_types[idx]
        hidden = adapter.run_layer(idx, hidden, masks[kind], ropes[kind], cache, positions)
    return adapter.logits(hidden[:, -1]), entering, cache


@pytest.mark.parametrize("make", [lambda: tiny_llama(4), tiny_gemma3, lambda: tiny_family_model("cohere"),
                                  lambda: tiny_family_model("phi3")], ids=["llama", "gemma3", "cohere", "phi3"])
def test_the_pieces_give_the_models_own_logits(make) -> None:
    """Embedding scale, every layer, the final norm and the family's logit scaling (Cohere's scale, Gemma 3's
    soft-capping) as the model's forward applies them."""
    model = make().eval()
    with torch.inference_mode():
        ours, _, _ = layer_by_layer(Adapter(model), IDS)
        theirs = model(IDS).logits[:, -1].float()
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("make", [lambda: tiny_llama(4), tiny_gemma3, lambda: tiny_family_model("phi3")],
                         ids=["llama", "gemma3", "phi3 (fused qkv)"])
def test_project_kv_is_what_the_layer_itself_wrote(make) -> None:
    """State propagation's keys and values for a layer, from the residual entering it, equal the layer's own cache
    entries (q/k norms, a fused QKV projection and the rotary embedding included)."""
    adapter = Adapter(make().eval())
    positions = torch.arange(IDS.shape[1])[None]
    with torch.inference_mode():
        _, entering, cache = layer_by_layer(adapter, IDS)
        ropes = adapter.rope(entering[0], positions)
        for idx in range(adapter.num_layers):
            keys, values = adapter.project_kv(idx, entering[idx], ropes[adapter.layer_types[idx]])
            kept = cache.layers[idx].keys.shape[-2]  # a sliding-window layer keeps its last `window` positions
            torch.testing.assert_close(keys[..., -kept:, :], cache.layers[idx].keys, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(values[..., -kept:, :], cache.layers[idx].values, rtol=1e-4, atol=1e-5)


def test_attention_probs_are_the_models_eager_attention_weights() -> None:
    model = tiny_llama(3, attn_implementation="eager").eval()
    adapter = Adapter(model)
    positions = torch.arange(IDS.shape[1])[None]
    with torch.inference_mode():
        _, entering, cache = layer_by_layer(adapter, IDS)
        expected = model(IDS, output_attentions=True).attentions
        hidden = adapter.embed(IDS)
        mask = adapter.masks(hidden, None, DynamicCache(config=adapter.config), positions)["full_attention"]
        rope = adapter.rope(hidden, positions)["full_attention"]
        for idx in range(adapter.num_layers):
            probs = adapter.attention_probs(idx, entering[idx], rope, cache.layers[idx].keys, mask)
            torch.testing.assert_close(probs, expected[idx].float(), rtol=1e-4, atol=1e-5)
    assert torch.allclose(probs.sum(-1), torch.ones(())) and probs[0, :, 0, 1:].abs().max() == 0  # causal rows


def test_a_family_it_does_not_know_is_refused_naming_what_it_supports() -> None:
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=50, n_positions=32))
    with pytest.raises(ValueError) as err:
        check_supported(gpt2)
    assert "gpt2" in str(err.value) and "llama" in str(err.value)
