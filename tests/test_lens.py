"""The logit lens in the trace: per layer, the top-1 text and the picked token's probability and rank."""

from __future__ import annotations

import math

import numpy as np

from d3.config import D3Config, EarlyExitConfig, FullConfig, GenerationConfig, TraceConfig
from d3.trace import Trace

GREEDY = GenerationConfig(max_new_tokens=12, stop_at_eos=False)
LENS = TraceConfig(logit_lens=True, sublayer_stats=False)


def test_lens_probability_at_the_last_layer_is_the_tokens_probability(tiny_engine):
    trace = tiny_engine.generate("hello world", D3Config(alpha=0.8, core_head=1, core_tail=1), GREEDY, LENS)
    for s in trace.steps:
        last = s.layers_run[-1]
        assert last == 5  # the tail core layer always runs, so the lens there is the model's own output
        assert math.isclose(s.lens_prob[last], math.exp(s.logprob), rel_tol=1e-4)
        assert s.lens_rank[last] == 0  # greedy picks the final layer's top-1
        assert s.logit_lens[last] == tiny_engine.tokenizer.decode([s.token_id])
        skipped = set(range(6)) - set(s.layers_run)
        assert all(s.lens_rank[x] == -1 and math.isnan(s.lens_prob[x]) for x in skipped)
        ran = list(s.layers_run)
        probs = np.array(s.lens_prob)[ran]
        assert ((probs > 0) & (probs <= 1)).all()
        assert all(r >= 0 for r in np.array(s.lens_rank)[ran])
    # some token skipped something, else the skip mask has nothing to show
    assert any(len(s.layers_run) < 6 for s in trace.steps)


def test_an_early_exit_token_is_the_lens_top1_at_its_exit_layer(tiny_engine):
    # Early exit reads its token off the exit layer through the same norm and head as the lens.
    trace = tiny_engine.generate("abc", EarlyExitConfig(threshold=1e-6, min_layers=2), GREEDY, LENS)
    exited = [s for s in trace.steps if s.exit_layer is not None]
    assert exited
    for s in exited:
        assert s.lens_rank[s.exit_layer] == 0
        assert s.layers_run[-1] == s.exit_layer


def test_lens_fields_survive_json(tiny_engine):
    trace = tiny_engine.generate("hi", FullConfig(), GenerationConfig(max_new_tokens=3, stop_at_eos=False), LENS)
    back = Trace.from_json(trace.to_json())
    for a, b in zip(trace.steps, back.steps):
        assert a.lens_rank == b.lens_rank and a.logit_lens == b.logit_lens
        assert np.allclose(a.lens_prob, b.lens_prob, atol=1e-6)


def test_no_lens_unless_asked(tiny_engine):
    trace = tiny_engine.generate("hi", FullConfig(), GenerationConfig(max_new_tokens=2, stop_at_eos=False),
                                 TraceConfig(sublayer_stats=False))
    assert all(s.lens_prob == () and s.lens_rank == () and s.logit_lens == () for s in trace.steps)


def test_lens_read_out_after_the_run_equals_the_lens_recorded_while_generating(tiny_engine):
    from d3.lens import has_lens_states, read_lens

    cfg = D3Config(alpha=0.8, core_head=1, core_tail=1)
    now = tiny_engine.generate("hi there", cfg, GREEDY, LENS)
    kept = tiny_engine.generate("hi there", cfg, GREEDY, TraceConfig(lens_states=True, sublayer_stats=False))
    assert has_lens_states(kept) and all(s.lens_prob == () for s in kept.steps)  # nothing read out during the run
    later = read_lens(tiny_engine.adapter, tiny_engine.tokenizer, kept, rows_per_call=7)  # chunks cut across tokens
    assert not has_lens_states(later) and later.token_ids == now.token_ids
    for a, b in zip(now.steps, later.steps):
        assert a.lens_rank == b.lens_rank and a.logit_lens == b.logit_lens
        assert np.allclose(a.lens_prob, b.lens_prob, atol=1e-5, equal_nan=True)


def test_kept_lens_states_cost_no_lm_head_call_and_are_not_exported(tiny_engine, monkeypatch):
    calls = []
    original = tiny_engine.adapter.logits
    monkeypatch.setattr(tiny_engine.adapter, "logits", lambda h: calls.append(h.shape) or original(h))
    trace = tiny_engine.generate("hi", FullConfig(), GREEDY, TraceConfig(lens_states=True, sublayer_stats=False))
    assert len(calls) == len(trace.steps)  # one per step: the next-token logits only, no lens
    assert trace.steps[0].lens_states.shape == (tiny_engine.num_layers, tiny_engine.model.config.hidden_size)
    assert "lens_states" not in trace.steps[0].to_dict()
    assert Trace.from_dict(trace.to_dict()).steps[0].lens_states is None
