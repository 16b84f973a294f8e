"""The one place that knows transformers 5.x internals: embedding, masks, rotary, layers, K/V projection, LM head."""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch
from torch import nn
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from d3.models import check_arch


def _cache_keyword(fn: Any) -> str:
    """The name `fn` takes the KV cache under: `cache` from transformers 5.24 on, `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(fn).parameters else "past_key_values"


# Decided once per process from the installed library, so no call passes the deprecated name (5.24 warns on
# `past_key_values`; 5.40 removes it) and an older 5.x that only knows `past_key_values` still gets it.
_MASK_CACHE_KW = _cache_keyword(create_causal_mask)


class Adapter:
    """Public pieces of a decoder-only transformers model, called one layer at a time.

    Works for models whose `model.model` has `embed_tokens`, `layers`, `norm`, `rotary_emb` and whose
    decoder layers are pre-norm blocks with `input_layernorm`, `self_attn.{q,k,v}_proj` (Llama, Mistral,
    Qwen2/3, Gemma 3). `layer_types` (sliding / full attention) are honoured.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.base = model.model
        self.config = self.base.config
        self.layers: list[nn.Module] = list(self.base.layers)
        self.num_layers = len(self.layers)
        n = self.num_layers
        self.layer_types: list[str] = list(getattr(self.config, "layer_types", None) or ["full_attention"] * n)
        self._layer_cache_kw = _cache_keyword(type(self.layers[0]).forward)
        self._rotary_takes_type = "layer_type" in inspect.signature(self.base.rotary_emb.forward).parameters
        self._softcap = getattr(self.config, "final_logit_softcapping", None)
        attn_module = sys.modules[type(self.layers[0].self_attn).__module__]
        self._apply_rotary = attn_module.apply_rotary_pos_emb
        self.head_dim = self.layers[0].self_attn.head_dim
        self.num_heads = self.config.num_attention_heads
        self.num_kv_heads = self.config.num_key_value_heads

    # -- per-call pieces ---------------------------------------------------------------------
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.base.embed_tokens(input_ids)  # [batch, pos, d_model]

    def masks(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None, cache: Any,
              position_ids: torch.Tensor) -> dict[str, Any]:
        """The library's own causal masks, one per attention type (None where sdpa needs none)."""
        kwargs = {"config": self.config, "inputs_embeds": hidden, "attention_mask": attention_mask,
                  _MASK_CACHE_KW: cache, "position_ids": position_ids}
        out = {}
        for kind in set(self.layer_types):
            make = create_sliding_window_causal_mask if kind == "sliding_attention" else create_causal_mask
            out[kind] = make(**kwargs)
        return out

    def rope(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """(cos, sin) per attention type."""
        if not self._rotary_takes_type:
            shared = self.base.rotary_emb(hidden, position_ids)
            return {kind: shared for kind in set(self.layer_types)}
        return {kind: self.base.rotary_emb(hidden, position_ids, kind) for kind in set(self.layer_types)}

    def run_layer(self, idx: int, hidden: torch.Tensor, mask: Any, rope: tuple[torch.Tensor, torch.Tensor],
                  cache: Any, position_ids: torch.Tensor) -> torch.Tensor:
        # hidden is passed positionally so forward pre-hooks see it in args[0].
        return self.layers[idx](hidden, attention_mask=mask, position_embeddings=rope,
                                position_ids=position_ids, use_cache=True, **{self._layer_cache_kw: cache})

    def mid_norm(self, idx: int) -> nn.Module:
        """The norm whose input is the residual stream between attention and MLP."""
        layer = self.layers[idx]
        return getattr(layer, "pre_feedforward_layernorm", None) or layer.post_attention_layernorm

    def logits(self, hidden_last: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head (+ Gemma's soft-capping) on [batch, d_model] -> float32 [batch, vocab]."""
        logits = self.model.lm_head(self.base.norm(hidden_last)).float()
        if self._softcap:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        return logits

    # -- filling and inspection ----------------------------------------------------------------
    def _heads(self, attn: nn.Module, proj: nn.Module, normed: torch.Tensor, norm_name: str) -> torch.Tensor:
        states = proj(normed).view(*normed.shape[:-1], -1, self.head_dim).transpose(1, 2)  # [b, heads, pos, hd]
        norm = getattr(attn, norm_name, None)
        return norm(states) if norm is not None else states

    def project_kv(self, idx: int, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer idx's own keys/values computed from `hidden` (state propagation): [b, kv_heads, pos, hd] each."""
        layer = self.layers[idx]
        attn = layer.self_attn
        normed = layer.input_layernorm(hidden)
        keys = self._heads(attn, attn.k_proj, normed, "k_norm")
        values = attn.v_proj(normed).view(*normed.shape[:-1], -1, self.head_dim).transpose(1, 2)
        cos, sin = rope
        _, keys = self._apply_rotary(keys, keys, cos, sin)
        return keys, values

    def attention_probs(self, idx: int, hidden_in: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                        keys: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Attention weights of layer idx for the queries of `hidden_in` over cached `keys`: [b, heads, q, kv]."""
        layer = self.layers[idx]
        attn = layer.self_attn
        q = self._heads(attn, attn.q_proj, layer.input_layernorm(hidden_in), "q_norm")
        cos, sin = rope
        q, _ = self._apply_rotary(q, q, cos, sin)
        k = keys.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)
        scores = (q.float() @ k.float().transpose(-1, -2)) * attn.scaling  # [b, heads, q, kv]
        if mask is not None:
            m = mask[..., -scores.shape[-1]:]
            scores = scores.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else scores + m.float()
        return torch.softmax(scores, dim=-1).nan_to_num(0.0)


def check_supported(model: nn.Module) -> None:
    """Raise ValueError if the model's architecture is not one the skip-aware loop handles."""
    check_arch(model.config.to_dict())
