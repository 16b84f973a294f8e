"""d3/compare.py: a lower-precision copy of a model runs the whole engine on CPU and is measured against float32."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from d3.compare import dtype_gap
from d3.config import TRACE_OFF, D3Config, GenerationConfig
from d3.engine import Engine

PROMPT = [5, 6, 7, 8, 9, 10, 11]
GEN = GenerationConfig(max_new_tokens=10, stop_at_eos=False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_on_cpu_runs_every_fill_and_says_how_far_it_is_from_float32(tiny_model, tiny_tok, dtype):
    half = copy.deepcopy(tiny_model).to(dtype)
    reference, engine = Engine(tiny_model, tiny_tok), Engine(half, tiny_tok)
    for fill in ("copy", "propagate", "none"):
        trace = engine.generate_batch([PROMPT], D3Config(alpha=0.7, drop_order="strided", fill=fill), GEN, TRACE_OFF)[0]
        assert len(trace.token_ids) == GEN.max_new_tokens and all(math.isfinite(s.logprob) for s in trace.steps)
    gap = dtype_gap(reference, engine, PROMPT, GEN)
    assert gap.dtype == str(dtype).removeprefix("torch.") and gap.tokens == GEN.max_new_tokens
    assert 0.0 <= gap.token_agreement <= 1.0
    assert 0.0 < gap.max_logit_diff < 10.0 and gap.mean_logit_diff <= gap.max_logit_diff  # rounded, not broken
    assert f"{gap.token_agreement:.0%} agree" in gap.line()


def test_the_same_model_is_no_distance_from_itself(tiny_model, tiny_tok):
    gap = dtype_gap(Engine(tiny_model, tiny_tok), Engine(tiny_model, tiny_tok), PROMPT, GEN)
    assert gap.token_agreement == 1.0 and gap.first_divergence is None and gap.max_logit_diff == 0.0
