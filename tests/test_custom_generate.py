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
    ({"not_a_setting": 1}, TypeError, "not_a_setting"),
])
def test_mistakes_are_clear_errors(tiny_engine, kwargs, error, match):
    with pytest.raises(error, match=match):
        custom(tiny_engine.model, torch.tensor([[5, 6, 7]]), max_new_tokens=2, **kwargs)


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
