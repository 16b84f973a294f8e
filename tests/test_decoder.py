"""d3/decoder.py: the skip-aware forward pass on tiny random models: exact layer sets, every fill (Gemma 3's by
attention type), holes, early exit, batched attention."""

from __future__ import annotations

import warnings

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
from d3.engine import Engine
from d3.schedule import plan
from d3.trace import FILLED_COPY, HOLE
from tests.tiny import GEMMA_TYPES

GREEDY = GenerationConfig(max_new_tokens=24, stop_at_eos=False)
PROMPT = "hello world"


@pytest.mark.parametrize("strategy", [
    D3Config(alpha=0.9, core_head=1, core_tail=1),
    D3Config(alpha=0.8, core_head=2, core_tail=1, start=3, drop_order="strided", fill="none"),
    D3Config(alpha=0.85, core_head=0, core_tail=0, drop_order="top_down", fill="propagate"),
    SkipDecodeConfig(max_layers=5, min_layers=2, warmup=1, horizon=12),
    UnifiedConfig(ratio=2.0),
])
def test_layers_run_are_exactly_the_schedule(tiny_engine, strategy):
    trace = tiny_engine.generate(PROMPT, strategy, GREEDY, TraceConfig())
    for s in trace.steps:
        expected = plan(strategy, 6, s.step).run
        assert s.layers_run == expected
        assert {layer for layer, _, _ in s.filled} == set(range(6)) - set(expected)
        assert all(how == strategy.fill for _, how, _ in s.filled)
        assert s.planned == plan(strategy, 6, s.step).budget


def test_skipping_changes_the_output_distribution(tiny_engine):
    full, skip = [], []
    tiny_engine.generate(PROMPT, FullConfig(), GREEDY, TRACE_OFF, observer=lambda i, o, s: full.append(o.logits))
    tiny_engine.generate(PROMPT, D3Config(alpha=0.8, core_head=1, core_tail=1), GREEDY, TRACE_OFF,
                         observer=lambda i, o, s: skip.append(o.logits))
    assert torch.equal(full[0], skip[0])  # the first token comes from the full-depth prefill
    assert (full[-1] - skip[-1]).abs().max() > 1e-3


def test_fill_strategies_differ_where_sets_are_not_nested(tiny_engine):
    """With a strided order later tokens read skipped positions, so copy / propagate / none give different logits."""
    logits = {}
    for fill in ("copy", "propagate", "none"):
        rows = []
        cfg = D3Config(alpha=0.9, core_head=1, core_tail=1, drop_order="strided", fill=fill)
        tiny_engine.generate(PROMPT, cfg, GREEDY, TRACE_OFF, forced=[list(range(5, 29))],
                             observer=lambda i, o, s: rows.append(o.logits))  # noqa: B023 (called within this iteration)
        logits[fill] = torch.cat(rows)
    assert (logits["copy"] - logits["none"]).abs().max() > 1e-4
    assert (logits["copy"] - logits["propagate"]).abs().max() > 1e-4


def test_fills_do_not_matter_for_nested_schedules(tiny_engine):
    """Middle-out D3 only ever shrinks its layer set, so no later token reads a filled entry."""
    outs = {}
    for fill in ("copy", "none"):
        rows = []
        cfg = D3Config(alpha=0.85, core_head=1, core_tail=1, fill=fill)
        tiny_engine.generate(PROMPT, cfg, GREEDY, TRACE_OFF, observer=lambda i, o, s: rows.append(o.logits))  # noqa: B023 (called within this iteration)
        outs[fill] = torch.cat(rows)
    torch.testing.assert_close(outs["copy"], outs["none"])


def test_copy_fill_writes_the_lower_layers_kv(tiny_engine):
    states = []
    cfg = D3Config(alpha=0.7, core_head=1, core_tail=1)
    tiny_engine.generate(PROMPT, cfg, GenerationConfig(max_new_tokens=6, stop_at_eos=False), TRACE_OFF,
                         observer=lambda i, o, s: states.append((o, s)))
    out, state = states[-1]
    skipped = [layer for layer, _, _ in out.filled]
    assert skipped, "alpha 0.7 must skip at step 5"
    for layer in skipped:
        src = max(r for r in out.layers_run if r < layer)
        assert torch.equal(state.cache.layers[layer].keys[..., -1, :], state.cache.layers[src].keys[..., -1, :])


def test_copy_any_type_equals_copy_on_one_attention_type(tiny_engine):
    """Llama has only full attention: the same-type rule picks the very layer the any-type rule picks."""
    logits = {}
    for fill in ("copy", "copy_any_type"):
        rows = []
        cfg = D3Config(alpha=0.9, core_head=1, core_tail=1, drop_order="strided", fill=fill)
        trace = tiny_engine.generate(PROMPT, cfg, GREEDY, TraceConfig(), forced=[list(range(5, 29))],
                                     observer=lambda i, o, s: rows.append(o.logits))  # noqa: B023 (called within this iteration)
        logits[fill] = torch.cat(rows)
        assert (trace.grid() == FILLED_COPY).any()
    assert torch.equal(logits["copy"], logits["copy_any_type"])


def _one_step(engine: Engine, run: tuple[int, ...], fill: str):
    from d3.decoder import decode_one_token, prefill
    from d3.schedule import LayerPlan

    ids, mask = engine.encode([PROMPT])
    state, first = prefill(engine.adapter, ids, mask)
    out = decode_one_token(engine.adapter, state, first.logits.argmax(-1), LayerPlan(run, len(run)), fill)
    return out, state.cache


def _newest_keys(cache, layer: int) -> torch.Tensor:
    return cache.layers[layer].keys[..., -1, :]


@pytest.mark.parametrize("run,skipped,source_copy,source_any", [
    ((0, 1, 2, 3, 5), 4, 1, 3),  # global layer 4: the global layer 1 below, not the sliding layer 3 next to it
    ((0, 2, 3, 4, 5), 1, 4, 0),  # global layer 1 with no global layer below: the nearest global layer above
    ((0, 1, 3, 4, 5), 2, 0, 1),  # sliding layer 2: the sliding layer 0, not the global layer 1
])
def test_gemma3_copy_fills_from_a_layer_of_the_same_attention_type(tiny_gemma, run, skipped, source_copy, source_any):
    types = tiny_gemma.adapter.layer_types
    assert tuple(types) == GEMMA_TYPES
    out, cache = _one_step(tiny_gemma, run, "copy")
    assert out.filled == ((skipped, "copy", source_copy),) and types[source_copy] == types[skipped]
    assert torch.equal(_newest_keys(cache, skipped), _newest_keys(cache, source_copy))
    assert not torch.equal(_newest_keys(cache, skipped), _newest_keys(cache, source_any)) or source_any == source_copy
    out, cache = _one_step(tiny_gemma, run, "copy_any_type")  # the old rule stays selectable
    assert torch.equal(_newest_keys(cache, skipped), _newest_keys(cache, source_any))


def test_gemma3_copy_propagates_when_no_layer_of_the_type_ran(tiny_gemma):
    out, cache = _one_step(tiny_gemma, (0, 2, 3, 5), "copy")  # both global layers skipped
    assert out.filled == ((1, "propagate", None), (4, "propagate", None))
    out_any, _ = _one_step(tiny_gemma, (0, 2, 3, 5), "copy_any_type")
    assert out_any.filled == ((1, "copy", 0), (4, "copy", 3))


@pytest.mark.parametrize("fill", ["copy", "propagate", "none"])
def test_a_decode_raises_no_deprecation_warning(tiny_engine, tiny_gemma, fill):
    """transformers 5.24 renamed `past_key_values` to `cache` (removed in 5.40): the adapter passes the current name."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for engine in (tiny_engine, tiny_gemma):
            engine.generate(PROMPT, D3Config(alpha=0.8, fill=fill), GenerationConfig(max_new_tokens=4), TRACE_OFF)
    deprecations = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught
                    if issubclass(w.category, (FutureWarning, DeprecationWarning))]
    assert deprecations == []


def test_gemma3_d3_generation_copies_within_type(tiny_gemma):
    """A whole strided D3 generation: every copied entry equals the newest entry of a same-type layer that ran."""
    cfg = D3Config(alpha=0.8, core_head=1, core_tail=1, drop_order="strided")
    steps = []
    tiny_gemma.generate(PROMPT, cfg, GenerationConfig(max_new_tokens=6, stop_at_eos=False), TRACE_OFF,
                        observer=lambda i, o, s: steps.append((o, [_newest_keys(s.cache, k).clone() for k in range(6)])))
    types = tiny_gemma.adapter.layer_types
    copied = 0
    for out, keys in steps:
        for layer, how, source in out.filled:
            if how == "copy":  # the recorded source is a same-type layer that ran, and the entry is its entry
                assert source in out.layers_run and types[source] == types[layer]
                assert torch.equal(keys[layer], keys[source])
                copied += 1
    assert copied > 0


def test_none_fill_masks_holes(tiny_engine):
    states = []
    cfg = D3Config(alpha=0.7, core_head=1, core_tail=1, fill="none")
    trace = tiny_engine.generate(PROMPT, cfg, GenerationConfig(max_new_tokens=6, stop_at_eos=False), TraceConfig(),
                                 observer=lambda i, o, s: states.append(s))
    state = states[-1]
    grid = trace.grid()
    assert (grid == HOLE).any()
    for layer, hole in state.holes.items():
        assert hole[0, -1].item() == (grid[-1, layer] == HOLE)
        assert torch.count_nonzero(state.cache.layers[layer].keys[0, :, hole[0]]) == 0


def test_early_exit_is_dynamic_and_fills_by_propagation(tiny_engine):
    trace = tiny_engine.generate(PROMPT, EarlyExitConfig(threshold=0.05, min_layers=2, measure="softmax_gap"),
                                 GREEDY, TraceConfig())
    exits = [s.exit_layer for s in trace.steps[1:]]
    assert any(e is not None for e in exits)
    for s in trace.steps[1:]:
        if s.exit_layer is not None:
            assert s.layers_run == tuple(range(s.exit_layer + 1))
            assert s.confidence[-1] >= 0.05 and all(c < 0.05 for c in s.confidence[:-1])
            assert all(how == "propagate" for _, how, _ in s.filled)
    cos = tiny_engine.generate(PROMPT, EarlyExitConfig(threshold=0.5, min_layers=2, measure="cosine"), GREEDY, TRACE_OFF)
    assert cos.mean_layers <= 6


def test_batched_attention_drops_left_padding(tiny_engine):
    prompts = ["hi", "a longer prompt"]
    batch = tiny_engine.generate_batch(prompts, FullConfig(), GenerationConfig(max_new_tokens=4, stop_at_eos=False),
                                       TraceConfig(attention_layers=(1,)))
    for p, t in zip(prompts, batch):
        solo = tiny_engine.generate(p, FullConfig(), GenerationConfig(max_new_tokens=4, stop_at_eos=False),
                                    TraceConfig(attention_layers=(1,)))
        a, b = t.steps[2].attention[1].astype("float32"), solo.steps[2].attention[1].astype("float32")
        assert a.shape == b.shape
        assert abs(a - b).max() < 1e-2


