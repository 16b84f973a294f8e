"""The engine on the real embedded models: parity with generate, every strategy runs, quality measures."""

from __future__ import annotations

import numpy as np
import pytest

from d3.compare import compare, perplexity
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
from d3.testing import count_hooks

pytestmark = pytest.mark.integration
PROMPT = "Give me two tips for learning to cook."
GEN = GenerationConfig(max_new_tokens=24)


def reference(engine: Engine, prompt: str, n: int) -> list[int]:
    ids, mask = engine.encode([prompt])
    out = engine.model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("strategy", [FullConfig(), D3Config(alpha=1.0, fill="propagate"), D3Config(alpha=1.0, fill="none")])
def test_full_depth_is_token_identical_to_generate(smol_engine, strategy):
    trace = smol_engine.generate(PROMPT, strategy, GEN, TRACE_OFF)
    assert trace.token_ids == reference(smol_engine, PROMPT, GEN.max_new_tokens)


@pytest.mark.parametrize("strategy", [
    D3Config(alpha=0.97),
    D3Config(alpha=0.97, drop_order="strided", fill="propagate"),
    SkipDecodeConfig(horizon=24),
    UnifiedConfig(ratio=1.5),
])
def test_every_strategy_runs_its_schedule_on_the_real_model(smol_engine, strategy):
    trace = smol_engine.generate(PROMPT, strategy, GEN, TraceConfig(attention_layers=(14,)))
    assert count_hooks(smol_engine.model) == 0
    for s in trace.steps:
        assert s.layers_run == plan(strategy, 30, s.step).run
    assert trace.text.strip()
    assert np.isfinite(trace.steps[-1].stats["mlp_dist"][list(trace.steps[-1].layers_run)]).all()


def test_early_exit_on_the_real_model(smol_engine):
    trace = smol_engine.generate(PROMPT, EarlyExitConfig(threshold=0.9, min_layers=8), GEN, TraceConfig())
    assert all(8 <= s.n_layers <= 30 for s in trace.steps)


def test_comparison_against_full_depth(smol_engine):
    comp = compare(smol_engine, PROMPT, D3Config(alpha=0.95), GEN)
    n = len(comp.skip.steps)
    assert comp.agree[0]  # the first token comes from the same full-depth prefill
    assert comp.kl_teacher[0] == pytest.approx(0, abs=1e-4) and comp.kl_teacher[-1] > 1e-3
    assert comp.kv_error.shape == (len(comp.full.steps), 30) and comp.kl_free.shape == (n,)
    assert comp.filled_kv_error() > 0.05  # a copied KV entry is not what the layer would have computed
    ran = comp.teacher_grid == 1
    assert np.nanmax(comp.kv_error[1][ran[1]]) < 1e-3 or comp.kv_error[0].max() < 1e-4


def test_perplexity_rises_under_skipping(smol_engine):
    from d3.research.data import ppl_text

    text = ppl_text()
    full = perplexity(smol_engine, text, FullConfig(), max_tokens=96)
    skip = perplexity(smol_engine, text, D3Config(alpha=0.97), max_tokens=96)
    assert 1 < full < 200 and skip > full


def test_gemma3_second_architecture():
    from d3.models import get_model

    engine = Engine.from_loaded(get_model("gemma3-270m"))
    assert engine.num_layers == 18
    prompt = "The capital of France is"
    trace = engine.generate(prompt, FullConfig(), GenerationConfig(max_new_tokens=12), TRACE_OFF)
    assert trace.token_ids == reference(engine, prompt, 12)
    skip = engine.generate(prompt, D3Config(alpha=0.9, fill="propagate", drop_order="strided"),
                           GenerationConfig(max_new_tokens=12), TraceConfig())
    assert [s.n_layers for s in skip.steps] == [len(plan(D3Config(alpha=0.9), 18, i).run) for i in range(len(skip.steps))]
