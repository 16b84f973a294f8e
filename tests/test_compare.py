"""d3/compare.py: a skipping run against full depth on one prompt (stoppable between decode steps, with its measured
speedup), and a lower-precision copy of a model measured against float32."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from d3.compare import compare, dtype_gap
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


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a lent GPU machine)")


@CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compare_and_the_traced_views_run_on_cuda(tiny_model, tiny_tok, dtype):
    """compare() (filled-KV error, KL), the logit lens, attention capture and every fill, with the model on the GPU."""
    from d3.compare import compare
    from d3.config import TraceConfig

    engine = Engine(copy.deepcopy(tiny_model).to("cuda", dtype), tiny_tok)
    trace = TraceConfig(logit_lens=True, attention_layers=(1, 3))
    for fill in ("copy", "propagate", "none"):
        comp = compare(engine, "hello there", D3Config(alpha=0.7, drop_order="strided", fill=fill), GEN, trace)
        assert comp.summary()


@CUDA
def test_layers_split_between_cuda_and_cpu_keep_each_fill_on_the_layers_device(tiny_model, tiny_tok, tmp_path):
    """device_map puts half the layers on the GPU and half on the CPU: copy / propagate fills cross devices."""
    from transformers import AutoModelForCausalLM

    tiny_model.save_pretrained(tmp_path)
    n = tiny_model.config.num_hidden_layers
    device_map = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.norm": "cpu", "lm_head": "cpu",
                  **{f"model.layers.{i}": 0 if i < n // 2 else "cpu" for i in range(n)}}
    split = AutoModelForCausalLM.from_pretrained(tmp_path, device_map=device_map, dtype=torch.float32)
    reference, engine = Engine(tiny_model, tiny_tok), Engine(split, tiny_tok)
    for fill in ("copy", "propagate", "none"):
        strategy = D3Config(alpha=0.7, drop_order="strided", fill=fill)
        want = reference.generate_batch([PROMPT], strategy, GEN, TRACE_OFF)[0].token_ids
        assert engine.generate_batch([PROMPT], strategy, GEN, TRACE_OFF)[0].token_ids == want


def test_compare_measures_agreement_kl_and_the_speedup_with_its_interval(tiny_engine) -> None:
    comp = compare(tiny_engine, "hello there", D3Config(alpha=0.9), GenerationConfig(max_new_tokens=10), TRACE_OFF)
    assert comp is not None and len(comp.skip.steps) == len(comp.full.steps) == 10
    assert comp.kl_teacher.shape == (10,) and 0 <= comp.agreement <= 1
    sp = comp.speedup
    assert sp is not None and sp.steps == 9 and sp.low <= sp.ratio <= sp.high
    summary = comp.summary()
    assert summary["measured_speedup"] == sp.ratio and summary["speedup_resolvable"] == sp.resolvable


def test_compare_stops_between_steps_when_asked(tiny_engine) -> None:
    """should_stop is read before every decode step of every run compare makes: stopped after 3 reads, it has run
    at most 3 steps and returns no comparison (the page's Stop button and a closed tab rely on it)."""
    reads = []

    def should_stop() -> bool:
        reads.append(1)
        return len(reads) > 3

    comp = compare(tiny_engine, "hello there", D3Config(alpha=0.9), GenerationConfig(max_new_tokens=40), TRACE_OFF,
                   should_stop=should_stop)
    assert comp is None
    assert 4 <= len(reads) < 40  # far fewer reads than the 3 x 40 steps of an unstopped comparison


def test_compare_without_a_stop_reads_it_at_every_step(tiny_engine) -> None:
    reads = []
    comp = compare(tiny_engine, "hello there", D3Config(alpha=0.9), GenerationConfig(max_new_tokens=6), TRACE_OFF,
                   should_stop=lambda: reads.append(1) is not None)
    assert comp is not None and not math.isnan(comp.kl_teacher.mean())
    assert len(reads) >= 3 * 6  # full, skip and the teacher-forced run each read it every step
