"""d3/families.py: every accepted family, as a tiny random model saved and loaded through get_model, runs exactly.

One row per entry of `FAMILIES` (the table the error message and docs/models.md are made from): full depth equals
`model.generate` past the sliding window, `propagate` computes each layer's own K/V, D3 runs floor(L * alpha**i)
layers, every fill and baseline runs, custom_generate at alpha 1 equals generate, a left-padded batch equals its rows.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from d3.config import (
    TRACE_OFF,
    D3Config,
    EarlyExitConfig,
    FullConfig,
    GenerationConfig,
    SkipDecodeConfig,
    TraceConfig,
    UnifiedConfig,
)
from d3.decoder import left_padded_positions
from d3.engine import Engine
from d3.families import FAMILIES, TESTED_ON, TESTED_TRANSFORMERS, family_of
from d3.models import get_model
from d3.testing import clear_model_cache, tiny_family_model, tiny_tokenizer

ROOT = Path(__file__).resolve().parent.parent
CUSTOM = str(ROOT / "hub" / "d3-generate")
PROMPT = [5, 9, 14, 20, 7, 33, 12, 40, 8, 17, 25, 30, 11, 6, 44, 19]  # 16 tokens: over twice every tiny window (6)
SHORT = [21, 22, 23, 24]
N = 8


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """model_type -> LoadedModel: the tiny model saved with save_pretrained and loaded back through get_model."""
    cache = {}

    def load(model_type: str):
        if model_type not in cache:
            path = tmp_path_factory.mktemp(model_type)
            tiny_family_model(model_type).save_pretrained(path)
            tiny_tokenizer().save_pretrained(path)
            cache[model_type] = get_model(str(path))
        return cache[model_type]

    yield load
    clear_model_cache()


def greedy(model, ids, mask=None, **kwargs):
    mask = torch.ones_like(ids) if mask is None else mask
    return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=N, min_new_tokens=N, do_sample=False, **kwargs)


def tokens(engine: Engine, prompts, strategy, n: int = N) -> list[list[int]]:
    traces = engine.generate_batch(prompts, strategy, GenerationConfig(max_new_tokens=n, stop_at_eos=False), TRACE_OFF)
    return [list(t.token_ids) for t in traces]


@pytest.mark.parametrize("model_type", FAMILIES)
def test_full_depth_equals_generate_past_the_sliding_window(loaded, model_type):
    """Same tokens and the same logits at every step (logits catch a difference that the argmax may hide)."""
    lm = loaded(model_type)
    assert lm.arch in (model_type, "gemma3_text")
    ids = torch.tensor([PROMPT])
    ref = greedy(lm.model, ids, return_dict_in_generate=True, output_logits=True)
    engine = Engine.from_loaded(lm)
    logits = []
    traces = list(engine.run([PROMPT], FullConfig(), GenerationConfig(max_new_tokens=N, stop_at_eos=False), TRACE_OFF,
                             observer=lambda step, out, state: logits.append(out.logits)))[-1]
    assert list(traces[0].token_ids) == ref.sequences[0, len(PROMPT):].tolist()
    torch.testing.assert_close(torch.stack(logits), torch.stack(ref.logits).float())


@pytest.mark.parametrize("model_type", FAMILIES)
def test_propagate_computes_each_layers_own_keys_and_values(loaded, model_type):
    """project_kv on a layer's input equals the K/V its own attention wrote to the cache (the family's description
    of norms, fused QKV, q/k norms, partial and per-layer rotary is right)."""
    engine = Engine.from_loaded(loaded(model_type))
    adapter = engine.adapter
    inputs = {}
    handles = [layer.register_forward_pre_hook(lambda m, args, i=i: inputs.__setitem__(i, args[0]))
               for i, layer in enumerate(adapter.layers)]
    ids = torch.tensor([PROMPT])
    mask = torch.ones_like(ids)
    try:
        with torch.inference_mode():
            out = engine.model(input_ids=ids, attention_mask=mask, use_cache=True)
    finally:
        for h in handles:
            h.remove()
    ropes = adapter.rope(inputs[0], left_padded_positions(mask))
    for idx in range(adapter.num_layers):
        keys, values = adapter.project_kv(idx, inputs[idx], ropes[adapter.layer_types[idx]])
        cached = out.cache.layers[idx]
        n = cached.keys.shape[-2]  # a sliding layer keeps only its window
        torch.testing.assert_close(keys[..., -n:, :], cached.keys, msg=f"{model_type} layer {idx} keys")
        torch.testing.assert_close(values[..., -n:, :], cached.values, msg=f"{model_type} layer {idx} values")


@pytest.mark.parametrize("model_type", FAMILIES)
def test_attention_capture_equals_the_librarys_own_attention_weights(model_type):
    """The attention view's weights (queries from the family's description, over keys from project_kv) equal what
    the model returns with output_attentions=True under eager attention, layer by layer, sliding windows included."""
    model = tiny_family_model(model_type)
    model.config._attn_implementation = "eager"  # the only implementation that returns attention weights
    adapter = Engine(model, tiny_tokenizer()).adapter
    inputs = {}
    handles = [layer.register_forward_pre_hook(lambda m, args, i=i: inputs.__setitem__(i, args[0]))
               for i, layer in enumerate(adapter.layers)]
    ids = torch.tensor([PROMPT])
    mask = torch.ones_like(ids)
    try:
        with torch.inference_mode():
            out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    finally:
        for h in handles:
            h.remove()
    positions = left_padded_positions(mask)
    ropes, masks = adapter.rope(inputs[0], positions), adapter.masks(inputs[0], mask, None, positions)
    causal = torch.ones(1, 1, len(PROMPT), len(PROMPT), dtype=torch.bool).tril()  # where sdpa-style masks are None
    for idx in range(adapter.num_layers):
        kind = adapter.layer_types[idx]
        keys, _ = adapter.project_kv(idx, inputs[idx], ropes[kind])
        layer_mask = masks[kind] if masks[kind] is not None else causal
        probs = adapter.attention_probs(idx, inputs[idx], ropes[kind], keys, layer_mask)
        torch.testing.assert_close(probs, out.attentions[idx].float(), msg=f"{model_type} layer {idx}")


@pytest.mark.parametrize("model_type", FAMILIES)
def test_d3_runs_floor_l_alpha_i_layers_above_the_core(loaded, model_type):
    engine = Engine.from_loaded(loaded(model_type))
    trace = engine.generate_batch([PROMPT], D3Config(alpha=0.7, core_head=1, core_tail=1),
                                  GenerationConfig(max_new_tokens=N, stop_at_eos=False), TRACE_OFF)[0]
    L = engine.num_layers
    assert [len(s.layers_run) for s in trace.steps][1:] == [max(2, math.floor(L * 0.7 ** i)) for i in range(1, N)]


@pytest.mark.parametrize("model_type", FAMILIES)
def test_every_fill_and_baseline_runs(loaded, model_type):
    engine = Engine.from_loaded(loaded(model_type))
    strided = dict(alpha=0.7, core_head=1, core_tail=1, drop_order="strided")  # not nested: later tokens read fills
    for fill in ("copy", "copy_any_type", "propagate", "none"):
        trace = engine.generate_batch([PROMPT], D3Config(fill=fill, **strided), GenerationConfig(max_new_tokens=N,
                                      stop_at_eos=False), TRACE_OFF)[0]
        assert len(trace.token_ids) == N and all(math.isfinite(s.logprob) for s in trace.steps)
        used = {how for s in trace.steps for _, how, _ in s.filled}
        assert used and used <= {fill.removesuffix("_any_type"), "propagate"}
    for baseline in (SkipDecodeConfig(max_layers=3, min_layers=2), UnifiedConfig(ratio=2.0),
                     EarlyExitConfig(threshold=0.3)):
        assert len(tokens(engine, [PROMPT], baseline)[0]) == N


@pytest.mark.parametrize("model_type", FAMILIES)
def test_the_traced_views_record_every_layer_that_ran(loaded, model_type):
    """Sublayer statistics (hooks at the family's resid_mid point), attention and the logit lens, as the page asks."""
    engine = Engine.from_loaded(loaded(model_type))
    trace = engine.generate_batch([PROMPT], D3Config(alpha=0.7, core_head=1, core_tail=1),
                                  GenerationConfig(max_new_tokens=4, stop_at_eos=False),
                                  TraceConfig(logit_lens=True, attention_layers=(0, 3)))[0]
    for step in trace.steps[1:]:
        ran = list(step.layers_run)
        assert all(np.isfinite(step.stats[name][ran]).all() for name in ("attn_dist", "mlp_dist", "hidden_norm"))
        assert np.allclose(step.attention[0].sum(-1), 1.0, atol=1e-3) and len(step.logit_lens) == engine.num_layers


@pytest.mark.parametrize("model_type", FAMILIES)
def test_custom_generate_at_alpha_one_equals_generate(loaded, model_type):
    model = loaded(model_type).model
    ids = torch.tensor([PROMPT])
    out = greedy(model, ids, custom_generate=CUSTOM, trust_remote_code=True, alpha=1.0)
    assert torch.equal(out, greedy(model, ids))


@pytest.mark.parametrize("model_type", FAMILIES)
def test_a_left_padded_batch_equals_each_prompt_alone(loaded, model_type):
    engine = Engine.from_loaded(loaded(model_type))
    strategy = D3Config(alpha=0.8, core_head=1, core_tail=1, fill="propagate", drop_order="strided")
    together = tokens(engine, [SHORT, PROMPT], strategy)
    assert together == [tokens(engine, [SHORT], strategy)[0], tokens(engine, [PROMPT], strategy)[0]]


def test_an_unknown_family_is_refused_from_its_config_before_any_weight_is_read(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))  # no weights at all
    with pytest.raises(ValueError, match=r"architecture 'gpt2' is not supported: D3 has no family description") as err:
        get_model(str(tmp_path))
    assert "\n" not in str(err.value) and all(name in str(err.value) for name in FAMILIES)


def test_a_known_family_with_an_option_d3_cannot_honour_is_refused_naming_it():
    with pytest.raises(ValueError, match="'llama' is supported, but not with attention_chunk_size"):
        family_of({"model_type": "llama", "attention_chunk_size": 8192})


def test_gemma2_built_with_sdpa_is_refused_because_its_soft_capping_needs_eager():
    model = tiny_family_model("gemma2")
    model.config._attn_implementation = "sdpa"
    with pytest.raises(ValueError, match="needs attn_implementation='eager'"):
        Engine(model, tiny_tokenizer())


def test_mistral_reads_its_model_wide_sliding_window_as_sliding_layers(loaded):
    assert Engine.from_loaded(loaded("mistral")).adapter.layer_types == ["sliding_attention"] * 4


def test_docs_list_every_family_with_the_date_and_version_tested():
    docs = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    assert TESTED_ON in docs and f"transformers {TESTED_TRANSFORMERS}" in docs
    listed = {line.split("`")[1] for line in docs.splitlines() if line.startswith("| `")}
    assert listed == set(FAMILIES)
