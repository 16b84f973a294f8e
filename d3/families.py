"""Decoder families as small descriptions: where a layer's norms and projections live, how its K/V entry is made.

The skip-aware loop runs every decoder layer as the library's own module; what differs between families is only
what the loop does around the layers (embedding multiplier, final logit scaling / soft-capping), how a skipped
layer's key/value entry is computed for the `propagate` fill, where the residual stream between attention and MLP
is read, and which attention implementation the library needs. `FAMILIES` is the one table of accepted families:
the error message, `d3 info`, docs/models.md and tests/test_families.py (which builds `tiny` for each) read it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

TESTED_ON = "2026-11-25"  # when tests/test_families.py last passed for every family in FAMILIES
TESTED_TRANSFORMERS = "5.24.0"
FILLS_EXACT_NOTE = ("full depth equals model.generate token for token; `propagate` computes the skipped layer's own "
                    "K/V exactly as its attention would; `copy` and `none` are the method's approximations")


def _always(attn: Any) -> bool:
    return True


@dataclass(frozen=True)
class Family:
    """How the skip-aware loop drives one `model_type` (decoder layers themselves run as the library's modules).

    attn_norm: the layer's norm in front of attention (None: post-norm layers such as OLMo 2 read the raw stream).
    mid_point: the module whose input is the residual stream between attention and MLP (`resid_mid`); None for
      parallel blocks (Cohere), where attention and MLP both read the layer's input and no such stream exists.
    fused_qkv: one `qkv_proj` (Phi-3) instead of `q_proj` / `k_proj` / `v_proj`.
    flat_qk_norm: q/k norms over the whole projection before the split into heads (OLMo 2), not per head.
    uses_rope(attn): whether this attention module rotates its keys (SmolLM3's NoPE layers, Cohere 2's global ones).
    eager_if: a config field that, when set, needs eager attention (Gemma 2's attention soft-capping).
    embed_multiplier / logit_ops: config fields the model's own forward applies around the layers.
    tiny: config overrides of the tiny random model tests/test_families.py builds for this family.
    """

    model_type: str
    label: str
    attn_norm: str | None = "input_layernorm"
    mid_point: str | None = "post_attention_layernorm"
    fused_qkv: bool = False
    flat_qk_norm: bool = False
    uses_rope: Callable[[Any], bool] = _always
    eager_if: str | None = None
    embed_multiplier: str | None = None
    logit_ops: tuple[str, ...] = ()  # any of "logit_scale" (x), "logits_scaling" (/), "final_logit_softcapping"
    tiny: dict[str, Any] = field(default_factory=dict)
    notes: str = ""

    def attn_implementation(self, config: Any) -> str:
        """The attention implementation the library needs for this config to compute what the checkpoint means."""
        return "eager" if self.eager_if and _get(config, self.eager_if) else "sdpa"


def _get(config: Any, key: str) -> Any:
    return config.get(key) if isinstance(config, dict) else getattr(config, key, None)


SLIDING = {"sliding_window": 6}  # shorter than the tests' prompt, so every test reads past the window
MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16}

_TABLE = (
    Family("llama", "Llama 2 / 3.x", tiny={"tie_word_embeddings": False}),
    Family("mistral", "Mistral", tiny=SLIDING, notes="sliding window on every layer (Mistral 7B v0.1: 4,096)"),
    Family("mixtral", "Mixtral (MoE)", tiny={**SLIDING, "num_local_experts": 4, "num_experts_per_tok": 2,
                                           "intermediate_size": 32},  # grouped_mm wants 16-byte strides
           notes="sparse MoE MLP (the library's module); sliding window on every layer"),
    Family("qwen2", "Qwen 2 / 2.5", tiny={**SLIDING, "use_sliding_window": True, "max_window_layers": 2},
           notes="sliding window on the layers from max_window_layers on"),
    Family("qwen2_moe", "Qwen 2 MoE", tiny={**MOE, "shared_expert_intermediate_size": 16},
           notes="MoE MLP with a shared expert"),
    Family("qwen3", "Qwen 3", notes="per-head q/k norms"),
    Family("qwen3_moe", "Qwen 3 MoE", tiny=MOE, notes="MoE MLP; per-head q/k norms"),
    Family("gemma", "Gemma", notes="embedding scaled by sqrt(hidden) inside its embedding module"),
    Family("gemma2", "Gemma 2", mid_point="pre_feedforward_layernorm", eager_if="attn_logit_softcapping",
           logit_ops=("final_logit_softcapping",), tiny=SLIDING,
           notes="eager attention (attention soft-capping), final logit soft-capping, alternating sliding layers"),
    Family("gemma3_text", "Gemma 3", mid_point="pre_feedforward_layernorm", eager_if="attn_logit_softcapping",
           logit_ops=("final_logit_softcapping",), tiny={**SLIDING, "sliding_window_pattern": 2},
           notes="per-head q/k norms; sliding and global layers with their own rotary bases"),
    Family("phi3", "Phi-3 / Phi-4", fused_qkv=True, tiny={**SLIDING, "partial_rotary_factor": 0.5},
           notes="fused qkv_proj; partial rotary"),
    Family("olmo", "OLMo", notes="LayerNorm without weights"),
    Family("olmo2", "OLMo 2", attn_norm=None, mid_point="mlp", flat_qk_norm=True,
           notes="post-norm layers; q/k norms over the whole projection"),
    Family("granite", "Granite", embed_multiplier="embedding_multiplier", logit_ops=("logits_scaling",),
           tiny={"embedding_multiplier": 2.0, "residual_multiplier": 0.5, "attention_multiplier": 0.3,
                 "logits_scaling": 2.0},
           notes="embedding, residual and attention multipliers; logits divided by logits_scaling"),
    Family("glm4", "GLM-4", tiny={"partial_rotary_factor": 0.5}, notes="partial rotary; extra post-sublayer norms"),
    Family("cohere", "Command R (Cohere)", mid_point=None, logit_ops=("logit_scale",),
           tiny={"logit_scale": 0.5, "use_qk_norm": True},
           notes="parallel attention + MLP (no resid_mid: the attention change reads 0); optional q/k LayerNorm; "
                 "logits x logit_scale"),
    Family("cohere2", "Command R7B (Cohere 2)", mid_point=None, logit_ops=("logit_scale",),
           uses_rope=lambda attn: attn.sliding_window is not None, tiny={**SLIDING, "logit_scale": 0.5},
           notes="parallel attention + MLP; rotary only on the sliding layers"),
    Family("smollm3", "SmolLM3", uses_rope=lambda attn: bool(attn.use_rope),
           tiny={**SLIDING, "use_sliding_window": True, "no_rope_layer_interval": 2},
           notes="no rotary on every no_rope_layer_interval-th layer"),
    Family("starcoder2", "StarCoder 2", tiny=SLIDING, notes="LayerNorm and projections with biases; sliding window"),
    Family("olmo3", "OLMo 3", attn_norm=None, mid_point="mlp", flat_qk_norm=True, tiny=SLIDING,
           notes="post-norm layers; q/k norms over the whole projection; sliding and global layers"),
    Family("exaone4", "EXAONE 4", attn_norm=None, mid_point="mlp", tiny=SLIDING,
           uses_rope=lambda attn: attn.sliding_window is None or attn.is_sliding,
           notes="post-norm layers; per-head q/k norms; with a sliding window, rotary only on the sliding layers"),
    Family("apertus", "Apertus", attn_norm="attention_layernorm", mid_point="feedforward_layernorm",
           tiny={"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
           notes="its own norm names; per-head q/k norms; xIELU MLP"),
    Family("helium", "Helium", notes="Llama layout"),
    Family("arcee", "Arcee (AFM)", notes="ReLU-squared MLP without a gate"),
    Family("ernie4_5", "ERNIE 4.5", notes="Llama layout"),
)
FAMILIES: dict[str, Family] = {f.model_type: f for f in _TABLE}
# model_type aliases that share a description (a Gemma 3 checkpoint's text config is gemma3_text)
ALIASES = {"gemma3": "gemma3_text"}


def fill_exactness(family: Family) -> dict[str, str]:
    """How exact full depth and each fill is for `family` (what tests/test_families.py checks), one line each."""
    copy = "approximate by design: the KV entry of the nearest lower layer that ran, of the same attention type"
    if family.uses_rope is not _always:
        copy += " (some layers here rotate their keys and others do not, so a copy may cross that line)"
    return {
        "full depth": "exact: equals model.generate token for token and logit for logit (tested)",
        "propagate": "exact: the skipped layer's own keys and values of the hidden state it would have read (tested)",
        "copy": copy,
        "copy_any_type": "approximate by design: the nearest lower layer that ran, whatever its attention type",
        "none": "no entry: the hole is masked out of attention (the paper's ablation)",
    }


def family_of(config: Any) -> Family:
    """The family describing a model config (a config object or its dict); ValueError in one line otherwise."""
    model_type = _get(config, "model_type")
    if model_type == "gemma3" and _get(config, "vision_config") is not None:
        raise ValueError("multimodal Gemma 3 checkpoints are not supported: use a text-only (gemma3_text) checkpoint")
    family = FAMILIES.get(ALIASES.get(model_type, model_type))
    if family is None:
        raise ValueError(f"architecture {model_type!r} is not supported: D3 has no family description for it (where "
                         f"its layers, norms and K/V projections live, in d3/families.py); supported families are "
                         f"{', '.join(FAMILIES)} (tested {TESTED_ON}, transformers {TESTED_TRANSFORMERS})")
    missing = _missing(family, config)
    if missing:
        raise ValueError(f"architecture {model_type!r} is supported, but not with {missing}")
    return family


def _missing(family: Family, config: Any) -> str | None:
    """A config option the description does not cover (checked before anything is built), or None."""
    text = _get(config, "text_config") or config
    if _get(text, "attention_chunk_size"):
        return "attention_chunk_size (chunked attention): D3's masks know full and sliding-window attention only"
    return None
