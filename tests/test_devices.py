"""Multi-device paths (device_map="auto" puts layers, the final norm and the LM head on several devices): each
function that combines tensors from different layers, or a layer's output with the inputs' mask, moves them to the
device of the one that consumes them. No second accelerator here: the "other device" is torch's meta device, where
an operation mixing devices raises just as it does between two GPUs, and the result's device says where it ran."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from d3 import decoder, hooks
from d3.hooks import LAYER_STATS, StatsRecorder

META = torch.device("meta")


def test_a_prefill_layers_mean_reads_the_mask_on_the_layers_device() -> None:
    values = torch.ones(2, 5, device=META)  # [batch, pos] from a layer on another device
    valid = torch.ones(2, 5, dtype=torch.long)  # the inputs' mask, on the first device
    out = hooks._mean(values, valid)
    assert out.device == META and out.shape == (2,)


def test_a_prefill_layer_whose_input_comes_from_another_device_is_reduced() -> None:
    rec = StatsRecorder(num_layers=3)
    rec.begin(2, META, torch.ones(2, 4, dtype=torch.long))
    rec.on("resid_pre", 1, torch.ones(2, 4, 8))  # the layer below's output, on the first device
    rec.on("resid_mid", 1, torch.ones(2, 4, 8, device=META))  # this layer's own, on its device
    rec.on("resid_post", 1, torch.ones(2, 4, 8, device=META))
    assert all(rec.stats[name].device == META for name in LAYER_STATS)


def test_one_token_layers_on_several_devices_are_reduced_together() -> None:
    rec = StatsRecorder(num_layers=2)
    rec.begin(1, META)
    for idx, device in ((0, torch.device("cpu")), (1, META)):
        for point in ("resid_pre", "resid_mid", "resid_post"):
            rec.on(point, idx, torch.ones(1, 1, 8, device=device))
    rec._reduce_deferred()
    assert all(rec.stats[name].device == META and rec.stats[name].shape == (1, 2) for name in LAYER_STATS)


def test_early_exits_cosine_reads_the_layer_below_on_this_layers_device() -> None:
    out = decoder._cosine_last(torch.ones(2, 1, 8, device=META), torch.ones(2, 1, 8))
    assert out.device == META and out.shape == (2,)


def test_the_logit_lens_gathers_every_layer_on_the_heads_device() -> None:
    seen = []
    adapter = SimpleNamespace(head_device=lambda: META, logits=lambda h: seen.append(h) or h)
    outputs = {0: torch.ones(1, 1, 8), 1: torch.ones(1, 1, 8, device=META)}  # layers 0 and 1 on two devices
    decoder._logit_lens(adapter, outputs)
    assert seen[0].device == META and seen[0].shape == (2, 1, 8)


def test_sampling_uses_a_generator_where_the_logits_are() -> None:
    """A generator on the logits' device: no vocabulary-wide copy to the CPU; one elsewhere still works (old
    callers), and the engine's picker makes its generator on the logits' device, the same draw on the CPU as
    before."""
    from d3.config import GenerationConfig
    from d3.engine import _picker

    gen = GenerationConfig(temperature=0.8, seed=3)
    logits = torch.randn(2, 50)
    pick = _picker(gen, None)
    first = [pick(0, logits).tolist() for _ in range(3)]
    again = _picker(gen, None)
    assert [again(0, logits).tolist() for _ in range(3)] == first
    cpu = torch.Generator().manual_seed(3)
    assert decoder.sample(logits, gen, cpu).tolist() == first[0]


@pytest.mark.parametrize("rows", [1, 3])
def test_a_steps_log_probs_entropy_and_top_k_are_read_for_the_whole_batch(rows, tiny_tok) -> None:
    """The trace builder reads every row's picked log-prob, entropy and top-k from one batched computation:
    the same values as reading them row by row."""
    import math

    from d3.config import TraceConfig
    from d3.trace_builder import TraceBuilder

    builder = TraceBuilder.__new__(TraceBuilder)
    builder.trace, builder.tokenizer = TraceConfig(top_k=3), tiny_tok
    lp = torch.log_softmax(torch.randn(rows, 40), dim=-1)
    picked = [5 + r for r in range(rows)]
    read = builder._read(lp, picked)
    for b in range(rows):
        assert read[b]["logprob"] == pytest.approx(float(lp[b, picked[b]]))
        assert read[b]["entropy"] == pytest.approx(float(-(lp[b].exp() * lp[b]).sum()), rel=1e-5)
        top = lp[b].topk(3)
        assert [t[0] for t in read[b]["topk"]] == top.indices.tolist()
        assert [t[2] for t in read[b]["topk"]] == pytest.approx([math.exp(v) for v in top.values.tolist()])
