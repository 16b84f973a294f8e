"""d3/hooks.py: named hook points on the real layers, recorded for one forward pass and removed in `finally`
(also when generation fails): no hook is ever left behind."""

from __future__ import annotations

import pytest
import torch

from d3.config import D3Config, GenerationConfig, TraceConfig
from d3.engine import Engine
from d3.hooks import HOOK_POINTS, StatsRecorder, recording
from d3.testing import count_hooks
from d3.trace import LAYER_STATS
from tests.tiny import tiny_llama

GREEDY = GenerationConfig(max_new_tokens=24, stop_at_eos=False)
PROMPT = "hello world"


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


def test_a_step_records_while_another_thread_loads_a_bfloat16_model(tiny_engine):
    """The class load test: a SmolLM2 run failed with "Index put requires the source and destination dtypes match"
    while Qwen loaded (transformers sets torch's default dtype to bfloat16 for the whole process while it builds a
    model); the recorder's stats are float32 whatever the default is."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # what a load in another thread does for a while
    try:
        trace = tiny_engine.generate(PROMPT, D3Config(alpha=0.8, core_head=1, core_tail=1),
                                     GenerationConfig(max_new_tokens=3, stop_at_eos=False), TraceConfig())
    finally:
        torch.set_default_dtype(before)
    assert len(trace.steps) == 3 and trace.steps[-1].stats["attn_cos"].dtype.name == "float32"
