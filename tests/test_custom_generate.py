"""hub/d3-generate: `model.generate(custom_generate=...)` runs D3 and the baselines through the engine, token for token."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest
import torch

from d3.config import TRACE_OFF, D3Config, GenerationConfig, strategy_from_dict
from d3.engine import Engine

CUSTOM = str(Path(__file__).resolve().parent.parent / "hub" / "d3-generate")
N = 12


def custom(model, ids, mask=None, **kwargs):
    mask = torch.ones_like(ids) if mask is None else mask
    return model.generate(input_ids=ids, attention_mask=mask, custom_generate=CUSTOM, trust_remote_code=True,
                          do_sample=False, **kwargs)


def engine_tokens(engine: Engine, prompts: list[list[int]], settings: dict, n: int) -> list[list[int]]:
    traces = engine.generate_batch(prompts, strategy_from_dict(settings), GenerationConfig(max_new_tokens=n), TRACE_OFF)
    return [list(t.token_ids) for t in traces]


SETTINGS = [
    {"strategy": "d3", "alpha": 0.8},
    {"strategy": "d3", "alpha": 0.85, "start": 2, "core_head": 1, "core_tail": 2, "drop_order": "top_down", "fill": "propagate"},
    {"strategy": "d3", "alpha": 0.7, "fill": "none"},
    {"strategy": "skipdecode", "max_layers": 6, "min_layers": 3},
    {"strategy": "unified", "ratio": 2.0},
    {"strategy": "early_exit", "threshold": 0.5},
]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(f"{v}" for v in s.values()))
def test_equals_the_engine_for_the_same_settings(tiny_engine, settings):
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    out = custom(tiny_engine.model, ids, max_new_tokens=N, **settings)
    assert out[0, :6].tolist() == ids[0].tolist()
    assert out[0, 6:].tolist() == engine_tokens(tiny_engine, [ids[0].tolist()], settings, N)[0]


def test_alpha_one_equals_plain_generate(tiny_engine):
    ids = torch.tensor([[11, 12, 13, 14]])
    ref = tiny_engine.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=N, do_sample=False)
    assert torch.equal(custom(tiny_engine.model, ids, alpha=1.0, max_new_tokens=N), ref)


def test_a_left_padded_batch_equals_the_engine_row_by_row(tiny_engine):
    ids = torch.tensor([[0, 0, 21, 22, 23], [31, 32, 33, 34, 35]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    out = custom(tiny_engine.model, ids, mask, alpha=0.8, max_new_tokens=N)
    assert out.shape == (2, 5 + N) and torch.equal(out[:, :5], ids)
    settings = {"strategy": "d3", "alpha": 0.8}
    assert out[:, 5:].tolist() == engine_tokens(tiny_engine, [[21, 22, 23], [31, 32, 33, 34, 35]], settings, N)


def test_return_dict_in_generate_gives_sequences_and_scores(tiny_engine):
    ids = torch.tensor([[5, 6, 7]])
    out = custom(tiny_engine.model, ids, alpha=0.8, max_new_tokens=4, return_dict_in_generate=True, output_scores=True)
    assert out.sequences.shape == (1, 7) and len(out.scores) == 4
    assert [int(s.argmax(-1)) for s in out.scores] == out.sequences[0, 3:].tolist()  # greedy picks the top score


def test_every_d3_config_field_is_a_keyword(tiny_engine):
    """Fields are read from the strategy configs, so one added to D3Config (a calibrated layer order) passes through."""
    fn = tiny_engine.model.load_custom_generate(CUSTOM, trust_remote_code=True)
    assert {f.name for f in fields(D3Config)} <= fn.__globals__["STRATEGY_FIELDS"]


@pytest.mark.parametrize("kwargs,error,match", [
    ({"strategy": "full", "alpha": 0.9}, ValueError, "alpha"),
    ({"alpha": 1.5}, ValueError, "alpha"),
    ({"num_beams": 2}, ValueError, "num_beams"),
    ({"not_a_setting": 1}, ValueError, "not_a_setting"),  # generate's own check of unused keyword arguments
    ({"output_hidden_states": True, "return_dict_in_generate": True}, ValueError, "skipped layer has no hidden state"),
    ({"output_attentions": True, "return_dict_in_generate": True}, ValueError, "output_attentions"),
    ({"guidance_scale": 1.5}, ValueError, "guidance_scale"),
])
def test_mistakes_are_clear_errors(tiny_engine, kwargs, error, match):
    with pytest.raises(error, match=match):
        custom(tiny_engine.model, torch.tensor([[5, 6, 7]]), max_new_tokens=2, **kwargs)


def sampled(model, ids, global_seed=0, **kwargs):
    """generate under torch.manual_seed(global_seed), as a user reproduces a sampled generation."""
    torch.manual_seed(global_seed)
    return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=N, do_sample=True, **kwargs)


def test_sampling_at_alpha_one_equals_plain_generate_under_the_global_seed(tiny_engine):
    """The issue's own check: top_k, repetition_penalty and num_return_sequences honoured, torch.manual_seed followed."""
    model, ids = tiny_engine.model, torch.tensor([[5, 6, 7, 8, 9]])
    kwargs = dict(top_k=50, repetition_penalty=1.2, num_return_sequences=2)
    ref = sampled(model, ids, **kwargs)
    out = sampled(model, ids, custom_generate=CUSTOM, trust_remote_code=True, alpha=1.0, **kwargs)
    assert out.shape == (2, 5 + N) and torch.equal(out, ref)
    assert not torch.equal(sampled(model, ids, global_seed=1, custom_generate=CUSTOM, trust_remote_code=True, alpha=1.0,
                                   **kwargs), out)  # another global seed, other samples


@pytest.mark.parametrize("processor", [
    {"top_k": 5}, {"top_p": 0.6}, {"top_p": 0.0}, {"min_p": 0.2}, {"temperature": 0.5}, {"typical_p": 0.7},
    {"repetition_penalty": 1.5}, {"no_repeat_ngram_size": 2}, {"bad_words_ids": [[20], [30]]},
    {"suppress_tokens": list(range(40, 90))}, {"begin_suppress_tokens": list(range(3, 60))},
    {"epsilon_cutoff": 0.01}, {"eta_cutoff": 0.01},
], ids=lambda p: next(iter(p)))
def test_each_logits_processor_at_alpha_one_equals_plain_generate(tiny_engine, processor):
    model, ids = tiny_engine.model, torch.tensor([[11, 12, 13, 11, 12]])
    ref = sampled(model, ids, **processor)
    assert torch.equal(sampled(model, ids, custom_generate=CUSTOM, trust_remote_code=True, alpha=1.0, **processor), ref)


def test_min_new_tokens_keeps_decoding_past_eos(tiny_engine):
    model, ids = tiny_engine.model, torch.tensor([[5, 6, 7]])
    first = int(custom(model, ids, alpha=1.0, max_new_tokens=1)[0, -1])  # make the first greedy token the EOS
    stops = custom(model, ids, alpha=0.8, max_new_tokens=N, eos_token_id=first)
    assert stops.shape[1] == 3 + 1
    ref = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=N, min_new_tokens=5,
                         eos_token_id=first, do_sample=False)
    out = custom(model, ids, alpha=1.0, max_new_tokens=N, min_new_tokens=5, eos_token_id=first)
    assert out.shape[1] >= 3 + 5 and torch.equal(out, ref)


def test_callers_processors_and_stopping_criteria_are_honoured(tiny_engine):
    from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList, SuppressTokensLogitsProcessor

    class AfterThree(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= 3 + 3, dtype=torch.bool)

    model, ids = tiny_engine.model, torch.tensor([[5, 6, 7]])
    banned = custom(model, ids, alpha=1.0, max_new_tokens=N)[0, 3:].tolist()
    processors = LogitsProcessorList([SuppressTokensLogitsProcessor(banned)])
    out = custom(model, ids, alpha=0.8, max_new_tokens=N, logits_processor=processors,
                 stopping_criteria=StoppingCriteriaList([AfterThree()]))
    assert out.shape == (1, 6) and not set(out[0, 3:].tolist()) & set(banned)


def test_temperature_zero_with_sampling_is_refused_as_plain_generate_refuses_it(tiny_engine):
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match="temperature") as plain:
        sampled(tiny_engine.model, ids, temperature=0.0)
    with pytest.raises(ValueError, match="temperature") as ours:
        sampled(tiny_engine.model, ids, temperature=0.0, custom_generate=CUSTOM, trust_remote_code=True, alpha=0.9)
    assert str(ours.value) == str(plain.value)


def test_a_d3_run_returns_num_return_sequences_rows_per_prompt(tiny_engine):
    ids = torch.tensor([[0, 21, 22], [31, 32, 33]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    torch.manual_seed(0)
    out = tiny_engine.model.generate(input_ids=ids, attention_mask=mask, custom_generate=CUSTOM, trust_remote_code=True,
                                     alpha=0.8, max_new_tokens=N, do_sample=True, num_return_sequences=3)
    assert out.shape == (6, 3 + N) and torch.equal(out[:, :3], ids.repeat_interleave(3, dim=0))


def test_seed_gives_the_same_sample_whatever_the_global_seed(tiny_engine):
    model, ids = tiny_engine.model, torch.tensor([[5, 6, 7]])
    a, b = (sampled(model, ids, global_seed=g, custom_generate=CUSTOM, trust_remote_code=True, alpha=0.9, seed=7)
            for g in (0, 1))
    assert torch.equal(a, b)


@pytest.mark.integration
def test_smollm2_equals_the_engine_and_plain_generate_at_alpha_one(smol_engine):
    model, tok = smol_engine.model, smol_engine.tokenizer
    ids = tok("The three primary colors are", return_tensors="pt")["input_ids"]
    n = 10
    settings = {"strategy": "d3", "alpha": 0.9, "fill": "copy"}
    out = custom(model, ids, max_new_tokens=n, tokenizer=tok, **settings)
    assert out[0, ids.shape[1]:].tolist() == engine_tokens(smol_engine, [ids[0].tolist()], settings, n)[0]
    ref = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
    assert torch.equal(custom(model, ids, alpha=1.0, max_new_tokens=n), ref)


def test_a_streamer_sees_what_plain_generate_shows_it(tiny_engine):
    from transformers.generation.streamers import BaseStreamer

    class Collect(BaseStreamer):
        def __init__(self):
            self.puts, self.ended = [], False

        def put(self, value):
            self.puts.append(value.tolist())

        def end(self):
            self.ended = True

    model, ids = tiny_engine.model, torch.tensor([[5, 6, 7]])
    plain, ours = Collect(), Collect()
    model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=N, do_sample=False, streamer=plain)
    custom(model, ids, alpha=1.0, max_new_tokens=N, streamer=ours)
    assert ours.puts == plain.puts and ours.ended and len(ours.puts) == 1 + N


def test_stop_strings_with_a_tokenizer_stop_where_plain_generate_stops(tiny_engine):
    """transformers drops `tokenizer` when custom_generate is a callable (it keeps only the callable's own
    keywords): the method takes it and the stop strings itself, with transformers' own StopStringCriteria."""
    model, tok = tiny_engine.model, tiny_engine.tokenizer
    ids = torch.tensor([[5, 6, 7, 8]])
    mask = torch.ones_like(ids)
    free = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=N, do_sample=False)[0, 4:].tolist()
    k, stop = next((k, tok.decode([t])) for k, t in enumerate(free) if k >= 1 and tok.decode([t]).strip())
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=N, do_sample=False, stop_strings=[stop],
                         tokenizer=tok)
    assert ref.shape[1] < 4 + N  # the stop string ends plain generate early
    out = custom(model, ids, alpha=1.0, max_new_tokens=N, stop_strings=[stop], tokenizer=tok)
    assert torch.equal(out, ref)
    d3 = custom(model, ids, alpha=0.8, max_new_tokens=N, stop_strings=stop, tokenizer=tok)
    assert tok.decode(d3[0, 4:].tolist()).endswith(stop) or d3.shape[1] == 4 + N  # stopped at the string, or ran out
    with pytest.raises(ValueError, match="stop_strings needs tokenizer="):
        custom(model, ids, alpha=0.8, max_new_tokens=N, stop_strings=[stop])
