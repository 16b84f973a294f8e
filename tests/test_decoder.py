"""The skip-aware loop on tiny random Llamas: parity with generate, exact layer sets, fills, batching, hooks."""

from __future__ import annotations

import warnings

import pytest
import torch

from d3.config import (
    D3Config,
    EarlyExitConfig,
    FullConfig,
    GenerationConfig,
    SkipDecodeConfig,
    TraceConfig,
    TRACE_OFF,
    UnifiedConfig,
)
from d3.engine import Engine
from d3.hooks import HOOK_POINTS, StatsRecorder, count_hooks, recording
from d3.schedule import plan
from d3.trace import FILLED_COPY, HOLE, LAYER_STATS, RAN, Trace
from tests.tiny import GEMMA_TYPES, tiny_llama  # tiny_gemma's layer types (the fixture: conftest.py)

GREEDY = GenerationConfig(max_new_tokens=24, stop_at_eos=False)
PROMPT = "hello world"


def reference(engine: Engine, prompt: str, n: int) -> list[int]:
    ids, mask = engine.encode([prompt])
    out = engine.model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("strategy", [
    FullConfig(),
    D3Config(alpha=1.0),
    D3Config(alpha=1.0, fill="propagate"),
    D3Config(alpha=1.0, fill="none"),
    EarlyExitConfig(threshold=1.0, min_layers=6),
])
def test_full_depth_matches_model_generate(tiny_engine, strategy):
    trace = tiny_engine.generate(PROMPT, strategy, GREEDY, TRACE_OFF)
    assert trace.token_ids == reference(tiny_engine, PROMPT, GREEDY.max_new_tokens)
    assert trace.layers_used.tolist() == [6] * GREEDY.max_new_tokens


@pytest.mark.parametrize("num_layers,seed", [(2, 1), (5, 2), (8, 3)])
def test_parity_on_other_tiny_configs(tiny_tok, num_layers, seed):
    engine = Engine(tiny_llama(num_layers, seed=seed), tiny_tok, "tiny")
    trace = engine.generate("abc", FullConfig(), GREEDY, TraceConfig())
    assert trace.token_ids == reference(engine, "abc", GREEDY.max_new_tokens)


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
                             observer=lambda i, o, s: rows.append(o.logits))
        logits[fill] = torch.cat(rows)
    assert (logits["copy"] - logits["none"]).abs().max() > 1e-4
    assert (logits["copy"] - logits["propagate"]).abs().max() > 1e-4


def test_fills_do_not_matter_for_nested_schedules(tiny_engine):
    """Middle-out D3 only ever shrinks its layer set, so no later token reads a filled entry."""
    outs = {}
    for fill in ("copy", "none"):
        rows = []
        cfg = D3Config(alpha=0.85, core_head=1, core_tail=1, fill=fill)
        tiny_engine.generate(PROMPT, cfg, GREEDY, TRACE_OFF, observer=lambda i, o, s: rows.append(o.logits))
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
                                     observer=lambda i, o, s: rows.append(o.logits))
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


def test_grid_codes(tiny_engine):
    trace = tiny_engine.generate(PROMPT, D3Config(alpha=0.7, core_head=1, core_tail=1), GREEDY, TraceConfig())
    grid = trace.grid()
    assert grid.shape == (GREEDY.max_new_tokens, 6)
    assert (grid[0] == RAN).all() and (grid[-1] == FILLED_COPY).any()
    assert (grid == RAN).sum(axis=1).tolist() == trace.layers_used.tolist()


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


def test_left_padded_batch_matches_single_runs(tiny_engine):
    prompts = ["hi", "a much longer prompt here", "mid size"]
    for strategy in (FullConfig(), D3Config(alpha=0.85, core_head=1, core_tail=1)):
        batch = tiny_engine.generate_batch(prompts, strategy, GREEDY)
        for p, t in zip(prompts, batch):
            assert t.token_ids == tiny_engine.generate(p, strategy, GREEDY, TRACE_OFF).token_ids


def test_seeded_sampling_is_reproducible(tiny_engine):
    gen = GenerationConfig(max_new_tokens=16, temperature=1.0, top_p=0.9, seed=7, stop_at_eos=False)
    a = tiny_engine.generate(PROMPT, FullConfig(), gen, TRACE_OFF).token_ids
    b = tiny_engine.generate(PROMPT, FullConfig(), gen, TRACE_OFF).token_ids
    c = tiny_engine.generate(PROMPT, FullConfig(), GenerationConfig(max_new_tokens=16, temperature=1.0, seed=8,
                                                                     stop_at_eos=False), TRACE_OFF).token_ids
    assert a == b and a != c


def test_stops_at_eos_but_teacher_forcing_feeds_every_token(tiny_model, tiny_tok):
    engine = Engine(tiny_model, tiny_tok, "tiny")
    free = engine.generate(PROMPT, FullConfig(), GREEDY, TRACE_OFF).token_ids
    engine.eos_ids = {free[3]}
    stopped = engine.generate(PROMPT, FullConfig(), GenerationConfig(max_new_tokens=20), TRACE_OFF)
    assert stopped.token_ids == free[: free.index(free[3]) + 1] and stopped.finish_reason == "eos"
    forced = engine.generate(PROMPT, FullConfig(), GenerationConfig(max_new_tokens=10), TRACE_OFF,
                             forced=[[5, 6, free[3], 7]])
    assert forced.token_ids == [5, 6, free[3], 7]


def test_should_stop_ends_within_one_step(tiny_engine):
    calls = []
    traces = list(tiny_engine.stream(PROMPT, FullConfig(), GREEDY, TRACE_OFF,
                                     should_stop=lambda: calls.append(1) or len(calls) > 3))
    assert len(traces[-1].steps) == 3 and traces[-1].finish_reason == "stopped"


def test_trace_records_hook_stats_and_no_hook_is_left(tiny_engine):
    trace = tiny_engine.generate(PROMPT, D3Config(alpha=0.8, core_head=1, core_tail=1), GREEDY,
                                 TraceConfig(logit_lens=True, attention_layers=(0, 5)))
    assert count_hooks(tiny_engine.model) == 0
    s = trace.steps[-1]
    for name in ("attn_cos", "attn_dist", "mlp_cos", "mlp_dist", "hidden_norm"):
        ran = s.stats[name][list(s.layers_run)]
        assert (ran == ran).all()  # finite where the layer ran
        skipped = [x for x in range(6) if x not in s.layers_run]
        assert all(s.stats[name][x] != s.stats[name][x] for x in skipped)  # NaN where it did not
    assert ((-1 <= s.stats["attn_cos"][0]) & (s.stats["attn_cos"][0] <= 1)).all()
    assert set(s.attention) == {0, 5}
    kv_len = len(trace.prompt_stats.tokens) + len(trace.steps) - 1
    assert s.attention[0].shape == (4, kv_len)
    assert abs(float(s.attention[0].astype("float32").sum(-1).mean()) - 1.0) < 1e-2
    assert len(s.logit_lens) == 6 and all(s.logit_lens[x] == "" for x in skipped)
    prompt = trace.prompt_stats
    assert prompt.stats["attn_cos"].shape == (6,) and prompt.attention[0].shape[1:] == (len(prompt.tokens),) * 2


def test_hooks_removed_even_when_generation_fails(tiny_engine, monkeypatch):
    import d3.decoder as decoder

    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(decoder, "_fill", boom)
    with pytest.raises(RuntimeError):
        tiny_engine.generate(PROMPT, D3Config(alpha=0.5, core_head=1, core_tail=1), GREEDY, TraceConfig())
    assert count_hooks(tiny_engine.model) == 0


def test_recording_reads_each_named_point_once_per_layer_then_removes_its_hooks(tiny_tok):
    # A model of its own: output_hidden_states makes transformers install its own (idle) hooks on the layers.
    engine = Engine(tiny_llama(6), tiny_tok, name="tiny")
    ids, mask = engine.encode([PROMPT])
    with torch.inference_mode():
        reference = engine.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    theirs = count_hooks(engine.model)
    seen = []

    class Spy(StatsRecorder):
        def on(self, point, idx, hidden):
            seen.append((point, idx))
            super().on(point, idx, hidden)

    recorder = Spy(6)
    with torch.inference_mode():
        with recording(engine.adapter, recorder, batch=1, valid=mask):
            assert count_hooks(engine.model) == theirs + len(HOOK_POINTS) * 6
            engine.model(input_ids=ids, attention_mask=mask)
    assert count_hooks(engine.model) == theirs
    assert seen == [(point, layer) for layer in range(6) for point in HOOK_POINTS]
    stats = recorder.collect()
    assert list(stats) == list(LAYER_STATS) and all(v.shape == (1, 6) for v in stats.values())
    # resid_post of layer i is hidden_states[i + 1] (the last entry has the final norm applied, so it is left out)
    for layer in range(5):
        expected = reference[layer + 1][0].float().norm(dim=-1).mean()
        assert float(stats["hidden_norm"][0, layer]) == pytest.approx(float(expected), rel=1e-5)


def test_trace_json_round_trip(tiny_engine):
    trace = tiny_engine.generate(PROMPT, D3Config(alpha=0.8, core_head=1, core_tail=1, fill="none"), GREEDY,
                                 TraceConfig(attention_layers=(2,)))
    back = Trace.from_json(trace.to_json())
    assert back.token_ids == trace.token_ids and (back.grid() == trace.grid()).all()
    assert back.steps[3].filled == trace.steps[3].filled
    frame = trace.to_frame()
    assert len(frame) == len(trace.steps) * 6 and set(frame["cell"]) >= {"ran", "hole (masked)"}


@pytest.mark.parametrize("prompt,match", [("", "empty"), ("   \n\t ", "empty"), ("\x00\x01", "empty"), (None, "text")])
def test_bad_prompts_are_clear_errors(tiny_engine, prompt, match):
    with pytest.raises(ValueError, match=match):
        tiny_engine.generate(prompt, FullConfig(), GREEDY)


def test_over_long_prompt_and_bad_configs(tiny_engine):
    engine = Engine(tiny_engine.model, tiny_engine.tokenizer, "tiny", max_prompt_tokens=50)
    with pytest.raises(ValueError, match="limit is 50 tokens"):
        engine.generate("x" * 500, FullConfig(), GREEDY)
    with pytest.raises(ValueError, match="core_head"):
        engine.generate(PROMPT, D3Config(core_head=4, core_tail=4), GREEDY)
    with pytest.raises(ValueError, match="attention_layers"):
        engine.generate(PROMPT, FullConfig(), GREEDY, TraceConfig(attention_layers=(9,)))


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


def test_bfloat16_model_runs_every_fill(tiny_tok):
    engine = Engine(tiny_llama(6).to(torch.bfloat16), tiny_tok, "tiny-bf16")
    full = engine.generate(PROMPT, FullConfig(), GenerationConfig(max_new_tokens=8, stop_at_eos=False), TraceConfig())
    assert full.token_ids == reference(engine, PROMPT, 8)
    for fill in ("copy", "propagate", "none"):
        cfg = D3Config(alpha=0.8, core_head=1, core_tail=1, drop_order="strided", fill=fill)
        trace = engine.generate(PROMPT, cfg, GenerationConfig(max_new_tokens=8, stop_at_eos=False), TraceConfig())
        assert len(trace.steps) == 8 and all(s.entropy == s.entropy for s in trace.steps)


def test_no_stop_at_eos_records_every_step(tiny_model, tiny_tok):
    engine = Engine(tiny_model, tiny_tok, "tiny")
    free = engine.generate(PROMPT, FullConfig(), GREEDY, TRACE_OFF).token_ids
    engine.eos_ids = {free[3]}
    trace = engine.generate(PROMPT, FullConfig(), GREEDY, TRACE_OFF)
    assert len(trace.steps) == GREEDY.max_new_tokens and trace.token_ids == free


@pytest.mark.parametrize("strategy", [
    FullConfig(),
    D3Config(alpha=0.8, core_head=1, core_tail=1),
    D3Config(alpha=0.8, core_head=1, core_tail=0, drop_order="strided", fill="none"),
    D3Config(alpha=0.8, core_head=1, core_tail=0, drop_order="strided", fill="propagate"),
    UnifiedConfig(ratio=2.0),
    EarlyExitConfig(threshold=0.01, min_layers=1, measure="cosine"),
])
def test_score_continuations_shares_one_prefill_and_matches_forced_runs(tiny_engine, strategy):
    prompt = tiny_engine.tokenizer("hello world")["input_ids"]
    options = [[5, 9, 13, 21, 30], [7], [11, 12, 40]]
    alone = []
    for option in options:
        gen = GenerationConfig(max_new_tokens=len(option), stop_at_eos=False)
        trace = tiny_engine.generate_batch([prompt], strategy, gen, forced=[option])[0]
        assert len(trace.steps) == len(option)
        alone.append(sum(s.logprob for s in trace.steps))
    shared = tiny_engine.score_continuations(prompt, options, strategy)
    assert shared == pytest.approx(alone, abs=1e-4)
    # the scores depend on the schedule: skipping layers moves them away from full depth
    if not isinstance(strategy, FullConfig):
        assert shared != pytest.approx(tiny_engine.score_continuations(prompt, options), abs=1e-4)


def test_score_continuations_rejects_empty_input(tiny_engine):
    with pytest.raises(ValueError, match="non-empty"):
        tiny_engine.score_continuations([], [[1]])
    with pytest.raises(ValueError, match="non-empty"):
        tiny_engine.score_continuations([1, 2], [[1], []])
