"""d3/engine.py: the generation loop on tiny random Llamas: parity with model.generate, batching, sampling, stopping,
bad input, teacher forcing and continuation scoring."""

from __future__ import annotations

import pytest
import torch

from d3.config import TRACE_OFF, D3Config, EarlyExitConfig, FullConfig, GenerationConfig, TraceConfig, UnifiedConfig
from d3.engine import Engine
from tests.tiny import tiny_llama

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


def test_partial_utf8_tokens_are_decoded_incrementally() -> None:
    """A byte-level BPE splits one emoji into several tokens; joining the per-token texts gives the text back."""
    from transformers import AutoTokenizer

    from d3.models import cache_root

    found = sorted((cache_root() / "smollm2-135m").glob("*/tokenizer.json"))
    if not found:
        pytest.skip("SmolLM2's tokenizer is not cached")
    tok = AutoTokenizer.from_pretrained(str(found[0].parent))
    from d3.engine import Engine

    text = "ok 🙂 café 北京"
    ids = tok.encode(text, add_special_tokens=False)
    pieces = [Engine.token_text(type("E", (), {"tokenizer": tok})(), ids, i) for i in range(len(ids))]
    assert "\ufffd" not in "".join(pieces)
    assert "".join(pieces) == text
