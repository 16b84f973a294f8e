"""Qwen2.5-Coder-1.5B-Instruct (28 layers) through the engine: full depth equals transformers' greedy `generate` on
the same weights with the chat template, D3's layer counts are floor(28·α^i) above the core, `propagate` writes each
layer's own keys and values, and `d3 info` reports 28 layers. Skipped when the model is not installed
(`d3 install qwen2.5-coder-1.5b`; `scripts/setup.sh --dev` installs it, so CI runs these)."""

from __future__ import annotations

import contextlib
import io
import json
import math

import pytest
import torch

from d3.config import TRACE_OFF, D3Config, FullConfig, GenerationConfig
from d3.engine import Engine
from d3.model_cache import ready_conversion
from d3.models import KNOWN_MODELS, QWEN_CODER, QWEN_CODER_CHUNKS, get_model, known_key


def _installed() -> bool:
    try:
        return ready_conversion(QWEN_CODER, known_key(QWEN_CODER)) is not None or QWEN_CODER_CHUNKS.check() is None
    except ValueError:
        return False


pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not _installed(), reason=f"not installed: {KNOWN_MODELS[QWEN_CODER].install}")]
XDIST_GROUP = "deep-model"  # one worker at a time holds the 28-layer model (tests/conftest.py)
# 16 tokens: on the shared 2-core CPU full depth runs at 0.2-1 token/s in float32 (docs/models.md), and this test
# runs it twice; scripts/qwen_exact.py checks 64 tokens against transformers on the GGUF itself.
TOKENS = 16
PROMPT = "Explain in two sentences why the sky is blue."


@pytest.fixture(scope="module")
def qwen() -> Engine:
    """The stored (bfloat16) weights computed in float32, as every family's exactness test runs (docs/models.md).
    The same key as `d3 info --dtype float32`'s load, so the module holds one copy."""
    return Engine.from_loaded(get_model(QWEN_CODER, device="auto", dtype="float32"))


def test_d3_info_reports_28_layers(qwen: Engine) -> None:
    from d3.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["info", "--model", QWEN_CODER, "--dtype", "float32", "--json"]) == 0
    info = json.loads(out.getvalue())
    assert info["num_layers"] == 28 and info["arch"] == "qwen2" and info["chat_template"] is True
    assert KNOWN_MODELS[QWEN_CODER].facts.num_layers == 28 and KNOWN_MODELS[QWEN_CODER].facts.num_heads == 12


def test_full_depth_equals_generate_with_the_chat_template(qwen: Engine) -> None:
    ids, mask = qwen.encode([PROMPT], chat_template=True)
    assert "<|im_start|>assistant" in qwen.tokenizer.decode(ids[0])  # the chat template was applied
    ref = qwen.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=TOKENS, do_sample=False,
                              return_dict_in_generate=True, output_logits=True)  # to its end-of-text token, if sooner
    logits: list[torch.Tensor] = []
    trace = list(qwen.run([PROMPT], FullConfig(), GenerationConfig(max_new_tokens=TOKENS), TRACE_OFF,
                          observer=lambda step, out, state: logits.append(out.logits)))[-1][0]
    assert list(trace.token_ids) == ref.sequences[0, ids.shape[1]:].tolist() and len(trace.token_ids) >= 8
    torch.testing.assert_close(torch.stack(logits).float(), torch.stack(ref.logits).float())


# A few-shot prompt in raw text (as the drop-order study asks its tasks): Qwen ends the answer with <|endoftext|>,
# not the chat turn's <|im_end|>, the one eos the GGUF kept.
FEW_SHOT = ("Q: What is 9 plus 5?\nA: 9 plus 5 is 14. So the answer is 14.\n\n"
            "Q: What is 0 plus 2?\nA: 0 plus 2 is 2. So the answer is 2.\n\n"
            "Q: What is 1 plus 8?\nA: 1 plus 8 is 9. So the answer is 9.\n\nQ: What is 6 plus 6?\nA:")


def test_a_raw_text_answer_ends_at_endoftext_as_generate_ends_it(qwen: Engine) -> None:
    tok = qwen.tokenizer
    stops = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    assert qwen.model.generation_config.eos_token_id == stops and qwen.eos_ids == set(stops)
    ids, mask = qwen.encode([FEW_SHOT], chat_template=False)
    ref = qwen.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=32, do_sample=False)
    trace = qwen.generate(FEW_SHOT, FullConfig(), GenerationConfig(max_new_tokens=32), TRACE_OFF, chat_template=False)
    assert list(trace.token_ids) == ref[0, ids.shape[1]:].tolist()
    assert trace.token_ids[-1] == stops[1] and len(trace.token_ids) < 32  # it stopped at <|endoftext|>, not the cap
    assert tok.decode(trace.token_ids, skip_special_tokens=True).strip() == "6 plus 6 is 12. So the answer is 12."


def test_d3_runs_floor_28_alpha_i_layers_above_the_core(qwen: Engine) -> None:
    trace = qwen.generate(PROMPT, D3Config(alpha=0.97, core_head=3, core_tail=3),
                          GenerationConfig(max_new_tokens=8, stop_at_eos=False), TRACE_OFF)
    assert [len(s.layers_run) for s in trace.steps][1:] == [max(6, math.floor(28 * 0.97 ** i)) for i in range(1, 8)]


def test_propagate_computes_each_layers_own_keys_and_values(qwen: Engine) -> None:
    from d3.decoder import left_padded_positions

    adapter = qwen.adapter
    inputs = {}
    handles = [layer.register_forward_pre_hook(lambda m, args, i=i: inputs.__setitem__(i, args[0]))
               for i, layer in enumerate(adapter.layers)]
    ids, mask = qwen.encode([PROMPT], chat_template=True)
    try:
        with torch.inference_mode():
            out = qwen.model(input_ids=ids, attention_mask=mask, use_cache=True)
    finally:
        for h in handles:
            h.remove()
    ropes = adapter.rope(inputs[0], left_padded_positions(mask))
    for idx in range(adapter.num_layers):
        keys, values = adapter.project_kv(idx, inputs[idx], ropes[adapter.layer_types[idx]])
        torch.testing.assert_close(keys, out.cache.layers[idx].keys, msg=f"layer {idx} keys")
        torch.testing.assert_close(values, out.cache.layers[idx].values, msg=f"layer {idx} values")
