"""The one place that knows transformers 5.x internals: embedding, masks, rotary, layers, K/V projection, LM head."""

from __future__ import annotations

import inspect
import sys
from typing import Any, cast

import torch
from torch import nn
from transformers.cache_utils import get_layer_types_and_kwargs
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from d3.families import Family, family_of


def _cache_keyword(fn: Any) -> str:
    """The name `fn` takes the KV cache under: `cache` from transformers 5.24 on, `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(fn).parameters else "past_key_values"


# Decided once per process from the installed library, so no call passes the deprecated name (5.24 warns on
# `past_key_values`; 5.40 removes it) and an older 5.x that only knows `past_key_values` still gets it.
_MASK_CACHE_KW = _cache_keyword(create_causal_mask)


class Adapter:
    """Public pieces of a decoder-only transformers model, called one layer at a time.

    Works for models whose `model.model` has `embed_tokens`, `layers`, `norm`, `rotary_emb` and whose decoder
    layers have a `self_attn`; everything else that differs between families is read from their `Family`
    description (d3/families.py). Attention types (full / sliding window) come from the library's own
    `get_layer_types_and_kwargs`, so Mistral's model-wide `sliding_window` counts as sliding on every layer.
    """

    def __init__(self, model: nn.Module) -> None:
        # The model's parts as the family has them (attributes of modules the library builds, found at run time):
        # typed Any, the pieces this class hands out typed below.
        self.model: Any = cast(Any, model)
        self.base: Any = self.model.model
        self.config: Any = self.base.config
        self.family: Family = family_of(self.config)
        self.layers: list[Any] = list(self.base.layers)
        self.num_layers = len(self.layers)
        self.layer_types: list[str] = list(get_layer_types_and_kwargs(self.config)[0])
        self._layer_cache_kw = _cache_keyword(type(self.layers[0]).forward)
        self._rotary_takes_type = "layer_type" in inspect.signature(self.base.rotary_emb.forward).parameters
        self._embed_multiplier = getattr(self.config, self.family.embed_multiplier or "", None)
        self._logit_ops: dict[str, Any] = {op: getattr(self.config, op, None) for op in self.family.logit_ops}
        attn_module = sys.modules[type(self.layers[0].self_attn).__module__]
        self._apply_rotary: Any = attn_module.apply_rotary_pos_emb
        self.head_dim: int = self.layers[0].self_attn.head_dim
        self.num_heads: int = self.config.num_attention_heads
        self.num_kv_heads: int = self.config.num_key_value_heads

    # -- per-call pieces ---------------------------------------------------------------------
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden: torch.Tensor = self.base.embed_tokens(input_ids)  # [batch, pos, d_model]
        return hidden * self._embed_multiplier if self._embed_multiplier is not None else hidden  # Granite

    def masks(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None, cache: Any,
              position_ids: torch.Tensor) -> dict[str, Any]:
        """The library's own causal masks, one per attention type (None where sdpa needs none)."""
        kwargs = {"config": self.config, "inputs_embeds": hidden, "attention_mask": attention_mask,
                  _MASK_CACHE_KW: cache, "position_ids": position_ids}
        out: dict[str, Any] = {}
        for kind in set(self.layer_types):
            make = create_sliding_window_causal_mask if kind == "sliding_attention" else create_causal_mask
            out[kind] = make(**kwargs)
        return out

    def rope(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """(cos, sin) per attention type."""
        if not self._rotary_takes_type:
            shared: tuple[torch.Tensor, torch.Tensor] = self.base.rotary_emb(hidden, position_ids)
            return {kind: shared for kind in set(self.layer_types)}
        return {kind: self.base.rotary_emb(hidden, position_ids, kind) for kind in set(self.layer_types)}

    def run_layer(self, idx: int, hidden: torch.Tensor, mask: Any, rope: tuple[torch.Tensor, torch.Tensor],
                  cache: Any, position_ids: torch.Tensor) -> torch.Tensor:
        # hidden is passed positionally so forward pre-hooks see it in args[0].
        out: torch.Tensor = self.layers[idx](hidden, attention_mask=mask, position_embeddings=rope,
                                             position_ids=position_ids, use_cache=True, **{self._layer_cache_kw: cache})
        return out

    def mid_norm(self, idx: int) -> nn.Module:
        """The module whose input is the residual stream between attention and MLP (the family's `mid_point`); for
        a parallel block (no such stream) the layer itself, so `resid_mid` reads the layer's input."""
        layer = self.layers[idx]
        module: nn.Module = getattr(layer, self.family.mid_point) if self.family.mid_point else layer
        return module

    def layer_device(self, idx: int) -> torch.device:
        """Where layer idx's weights (and so its KV cache) live; differs per layer under device_map="auto"."""
        device: torch.device = next(self.layers[idx].parameters()).device
        return device

    def head_device(self) -> torch.device:
        """Where the final norm reads its input (under device_map="auto", not necessarily the embedding's device)."""
        device: torch.device = next(self.base.norm.parameters(), next(self.model.lm_head.parameters())).device
        return device

    def logits(self, hidden_last: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head + the family's own scaling on [batch, d_model] -> float32 [batch, vocab].

        The scaling is done in the head's dtype as the model's forward does it, then cast (Cohere's
        `logit_scale`, Granite's `logits_scaling`, Gemma 2/3's `final_logit_softcapping`)."""
        logits: torch.Tensor = self.model.lm_head(self.base.norm(hidden_last))
        ops = self._logit_ops
        if ops.get("logit_scale") is not None:
            logits = logits * ops["logit_scale"]
        if ops.get("logits_scaling") is not None:
            logits = logits / ops["logits_scaling"]
        cap = ops.get("final_logit_softcapping")
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits.float()

    def linear_head(self) -> tuple[torch.Tensor, torch.Tensor | None, float] | None:
        """(weight [vocab, d_model], bias or None, scale) where `logits(h)` is scale * (weight @ norm(h) + bias)
        computed in float32; None where it is not (a family that caps its logits, or a head in another dtype, whose
        rounding a float32 product would not reproduce)."""
        ops, head = self._logit_ops, self.model.lm_head
        if ops.get("final_logit_softcapping") or getattr(head, "weight", None) is None or head.weight.dtype != torch.float32:
            return None
        scale = 1.0
        if ops.get("logit_scale") is not None:
            scale *= float(ops["logit_scale"])
        if ops.get("logits_scaling") is not None:
            scale /= float(ops["logits_scaling"])
        return head.weight, head.bias, scale

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        """What the LM head reads: the final norm of the residual."""
        normed: torch.Tensor = self.base.norm(hidden)
        return normed

    # -- filling and inspection ----------------------------------------------------------------
    def _project(self, idx: int, hidden: torch.Tensor, which: str) -> torch.Tensor:
        """Layer idx's queries ("q"), keys ("k") or values ("v") of `hidden`, as its attention computes them before
        the rotary embedding: [b, heads, pos, hd]. The family says where the input norm, a fused QKV projection
        and the q/k norms (per head, or over the whole projection) are."""
        fam, layer = self.family, self.layers[idx]
        attn = layer.self_attn
        normed = getattr(layer, fam.attn_norm)(hidden) if fam.attn_norm else hidden
        if fam.fused_qkv:
            q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
            qkv = attn.qkv_proj(normed)
            states: torch.Tensor = {"q": qkv[..., :q_size], "k": qkv[..., q_size:q_size + kv_size], "v": qkv[..., q_size + kv_size:]}[which]
        else:
            states = getattr(attn, f"{which}_proj")(normed)
        norm = getattr(attn, f"{which}_norm", None) if which != "v" else None
        if norm is not None and fam.flat_qk_norm:
            states = norm(states)
        states = states.view(*normed.shape[:-1], -1, self.head_dim)  # [b, pos, heads, hd]
        if norm is not None and not fam.flat_qk_norm:
            states = norm(states)  # per head (RMSNorm over hd; Cohere's LayerNorm over (heads, hd))
        return states.transpose(1, 2)

    def _rotate(self, idx: int, states: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if not self.family.uses_rope(self.layers[idx].self_attn):
            return states
        cos, sin = (t.to(states.device) for t in rope)
        rotated: torch.Tensor = self._apply_rotary(states, states, cos, sin)[1]
        return rotated

    def project_kv(self, idx: int, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer idx's own keys/values computed from `hidden` (state propagation): [b, kv_heads, pos, hd] each, on
        the layer's device."""
        hidden = hidden.to(self.layer_device(idx))
        keys = self._rotate(idx, self._project(idx, hidden, "k"), rope)
        return keys, self._project(idx, hidden, "v")

    def attention_probs(self, idx: int, hidden_in: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                        keys: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Attention weights of layer idx for the queries of `hidden_in` over cached `keys`: [b, heads, q, kv]."""
        attn = self.layers[idx].self_attn
        q = self._rotate(idx, self._project(idx, hidden_in.to(self.layer_device(idx)), "q"), rope)
        k = keys.to(q.device).repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)
        scores = (q.float() @ k.float().transpose(-1, -2)) * attn.scaling  # [b, heads, q, kv]
        cap = getattr(attn, "attn_logit_softcapping", None)
        if cap:  # Gemma 2: the attention's own soft-capping
            scores = torch.tanh(scores / cap) * cap
        if mask is not None:
            m = mask[..., -scores.shape[-1]:].to(scores.device)
            scores = scores.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else scores + m.float()
        return torch.softmax(scores, dim=-1).nan_to_num(0.0)


def check_supported(model: nn.Module) -> None:
    """Raise ValueError if the model's architecture is not one the skip-aware loop handles, or if it was built with
    an attention implementation that does not compute what the checkpoint means (Gemma 2 under sdpa)."""
    config: Any = cast(Any, model).config.get_text_config()
    family = family_of(config)
    needed, used = family.attn_implementation(config), getattr(config, "_attn_implementation", None)
    if needed == "eager" and used != "eager":
        raise ValueError(f"a {family.label} model needs attn_implementation='eager' (its attention soft-capping); it was "
                         f"built with {used!r}: load it with d3.models.load_model / get_model, or pass "
                         f"attn_implementation='eager'")
