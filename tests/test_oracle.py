"""The oracle on the tiny random Llama: its definition checked by brute force through D3's own decoder, the fast
path against it, the lens, KL at D3's budget, the CLI; and a short run on the embedded SmolLM2."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from d3 import cli
from d3.config import D3Config
from d3.decoder import decode_one_token, prefill
from d3.research.oracle import _check_window, budget_logprobs, lens_depth, lens_top1, measure
from d3.research.oracle_fit import need_and_stable, prediction_depth
from d3.schedule import LayerPlan, d3_layers, plan

PROMPT = "hello there"


def brute_logits(engine, answer, i: int, layers) -> torch.Tensor:
    """Token i's logits through D3's own decode step, from a cache built by a full-depth prefill of what precedes it."""
    ids = answer.prompt_ids + list(answer.fp.answer)
    q = answer.fp.query(i)
    with torch.inference_mode():
        before = torch.tensor([ids[:q]])
        state, _ = prefill(engine.adapter, before, torch.ones_like(before))
        out = decode_one_token(engine.adapter, state, torch.tensor([ids[q]]), LayerPlan(tuple(layers), len(layers)), "copy")
    return out.logits[0]


@pytest.fixture(scope="module", params=["middle_out", "strided"])
def measured(request, tiny_engine):
    cfg = D3Config(drop_order=request.param, core_head=1, core_tail=1)
    return cfg, measure(tiny_engine, PROMPT, cfg, 10)


def test_need_is_the_smallest_budget_that_keeps_full_depths_top1(tiny_engine, measured):
    cfg, answer = measured
    L = tiny_engine.num_layers
    top1 = answer.fp.top1
    assert top1 == list(answer.fp.answer)  # greedy: full depth's top-1 is the answer itself
    for i, (need, stable) in enumerate(zip(answer.oracle_depth, answer.stable_depth)):
        keeps = {n: int(brute_logits(tiny_engine, answer, i, d3_layers(cfg, L, n)).argmax()) == top1[i]
                 for n in range(2, L + 1)}
        assert keeps[need] and not any(keeps[n] for n in range(2, need)), (i, keeps)
        assert all(keeps[n] for n in range(stable, L + 1)) and (stable == need or not keeps[stable - 1]), (i, keeps)
    # The tiny model is deep enough to need different depths: the check above is not all-L.
    assert len(set(answer.oracle_depth)) > 2


def test_fast_path_log_probs_equal_the_decoders(tiny_engine, measured):
    cfg, answer = measured
    L = tiny_engine.num_layers
    sets = [d3_layers(cfg, L, n) for n in (2, 4, L - 1, L)]
    for i in (0, 3, 9):
        with torch.inference_mode():
            fast = budget_logprobs(tiny_engine.adapter, answer.fp, i, sets)  # [4, vocab], one batch
        for row, layers in zip(fast, sets):
            torch.testing.assert_close(row, torch.log_softmax(brute_logits(tiny_engine, answer, i, layers), -1),
                                       atol=2e-4, rtol=1e-4)


def test_need_and_stable_by_hand():
    # budgets 2..6: 2 misses, 3 keeps (by luck), 4 misses, 5 and 6 keep
    assert need_and_stable([False, True, False, True, True], 2) == (3, 5)
    assert need_and_stable([True] * 5, 2) == (2, 2)
    assert need_and_stable([False] * 4 + [True], 2) == (6, 6)  # only full depth keeps it
    with pytest.raises(ValueError, match="end with True"):
        need_and_stable([True, False], 2)


def test_lens_ends_at_full_depths_top1(tiny_engine, measured):
    _, answer = measured
    lens = lens_top1(tiny_engine.adapter, answer.fp)
    assert lens.shape == (tiny_engine.num_layers + 1, len(answer.fp.answer))
    assert lens[-1].tolist() == answer.fp.top1
    depth = np.array(answer.prediction_depth)
    assert ((depth >= 0) & (depth <= tiny_engine.num_layers)).all()
    for t, k in enumerate(depth):  # from depth k on, the lens shows the final top-1; just below it, it does not
        assert (lens[k:, t] == answer.fp.top1[t]).all() and (k == 0 or lens[k - 1, t] != answer.fp.top1[t])
    # The top-down reading gives the same depths as the whole lens.
    assert lens_depth(tiny_engine.adapter, answer.fp) == prediction_depth(lens, np.array(answer.fp.top1)).tolist()
    assert len(set(answer.prediction_depth)) > 1


def test_kl_at_budget_matches_the_decoder_and_is_zero_at_full_depth(tiny_engine, measured):
    cfg, answer = measured
    L = tiny_engine.num_layers
    assert answer.scan.kl_at(cfg.with_(alpha=1.0), L) == [0.0] * 10
    decayed = cfg.with_(alpha=0.7)
    kl = answer.scan.kl_at(decayed, L)
    for i in (1, 5):
        logp = torch.log_softmax(brute_logits(tiny_engine, answer, i, plan(decayed, L, i).run), -1)
        full = answer.fp.logprobs[i]
        assert kl[i] == pytest.approx(float((full.exp() * (full - logp)).sum()), rel=1e-3, abs=1e-5)
    assert kl[0] == 0 and max(kl) > 0.01  # step 0 comes from the full-depth prefill; later steps lose something
    with pytest.raises(ValueError, match="core and drop order"):
        answer.scan.kl_at(cfg.with_(core_head=2), L)


def test_kept_at_budget_is_the_scan_at_d3s_own_budget(tiny_engine, measured):
    cfg, answer = measured
    L = tiny_engine.num_layers
    assert answer.scan.kept_at(cfg.with_(alpha=1.0), L) == [True] * 10
    decayed = cfg.with_(alpha=0.7)
    kept = answer.scan.kept_at(decayed, L)
    for i in range(10):
        top = int(brute_logits(tiny_engine, answer, i, plan(decayed, L, i).run).argmax())
        assert kept[i] == (top == answer.fp.top1[i])
        # Under-served (budget below need) always loses the top-1; served may still lose it (need < stable).
        if plan(decayed, L, i).budget < answer.oracle_depth[i]:
            assert not kept[i]
    bits = answer.to_dict()["kept_by_token"]
    assert len(bits) == 10 and all(len(b) == L - 1 and b[-1] == "1" for b in bits)


def test_sliding_window_limit_is_a_clear_error():
    adapter = SimpleNamespace(config=SimpleNamespace(sliding_window=16), layer_types=["sliding_attention"])
    _check_window(adapter, 10)
    with pytest.raises(ValueError, match="fewer than 15"):
        _check_window(adapter, 15)


# -- the CLI ---------------------------------------------------------------------------------


@pytest.fixture
def tiny_cli(monkeypatch, tiny_engine):
    monkeypatch.setattr(cli, "load_engine", lambda args: tiny_engine)


def test_cli_json_has_every_key(tiny_cli, capsys):
    assert cli.main(["oracle", "--prompt", PROMPT, "--max-new-tokens", "6", "--core-head", "1", "--core-tail", "1",
                     "--alpha", "0.8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("oracle_depth", "stable_depth", "prediction_depth", "kl_at_budget"):
        assert len(out[key]) == 6 and all(isinstance(x, (int, float)) for x in out[key])
    assert all(2 <= n <= 6 for n in out["oracle_depth"])
    assert set(out["alpha_fit"]) == {"least_squares", "coverage"}
    assert out["alpha"] == 0.8 and out["alpha_source"] == "given"
    budgets = [plan(D3Config(alpha=0.8, core_head=1, core_tail=1), 6, i).budget for i in range(6)]
    assert out["underserved_fraction"] == pytest.approx(np.mean(np.array(budgets) < np.array(out["oracle_depth"])))
    assert {"generate", "oracle", "total"} <= set(out["prompts"][0]["seconds"]) and out["seconds"] > 0


def test_cli_prompts_file_writes_one_entry_per_prompt(tiny_cli, capsys, tmp_path):
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([{"title": "a", "prompt": "abc"}, {"title": "b", "prompt": "xyz"},
                                   {"title": "c", "prompt": "no"}]))
    out = tmp_path / "res" / "oracle.json"
    assert cli.main(["oracle", "--prompts-file", str(prompts), "--count", "2", "--max-new-tokens", "4",
                     "--out", str(out), "--underserved-at", "0.9,0.5@2"]) == 0
    data = json.loads(out.read_text())
    assert [p["title"] for p in data["prompts"]] == ["a", "b"]
    assert len(data["oracle_depth"]) == 2 and all(len(row) == 4 for row in data["oracle_depth"])
    assert data["alpha_source"] == "least_squares fit" and data["alpha"] == data["alpha_fit"]["least_squares"]["alpha"]
    assert [(r["alpha"], r["start"]) for r in data["underserved_at"]] == [(0.9, 0), (0.5, 2)]
    assert all(r["underserved_fraction"] <= r["top1_lost_fraction"] <= 1 for r in data["underserved_at"])
    assert "least-squares fit" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    ([], "exactly one of --prompt and --prompts-file"),
    (["--prompt", "a", "--prompts-file", "assets/prompts.json"], "exactly one of"),
    (["--prompt", ""], "prompt is empty"),
    (["--prompts-file", "nope.json"], "nope.json not found"),
    (["--prompt", "a", "--drop-order", "random"], "invalid choice"),
    (["--prompt", "a", "--alpha", "2"], "argument --alpha: '2' is not allowed: --alpha must be a number in (0, 1]"),
    (["--prompt", "a", "--k", "200"], "--k must be a percentage in [0, 100]"),
    (["--prompt", "a", "--underserved-at", "0.9@x"], "--underserved-at"),
    (["--prompt", "a", "--max-new-tokens", "0"], "--max-new-tokens must be an integer in [1, 1024]"),
    (["--prompt", "a", "--core-head", "4", "--core-tail", "4"], "at most 5: the model's 6 layers less one flex layer"),
])
def test_cli_bad_input_exits_2_with_one_line(tiny_cli, capsys, argv, message):
    assert cli.main(["oracle", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


# -- the embedded model ----------------------------------------------------------------------


@pytest.mark.integration
def test_smollm2_oracle_on_a_short_answer(smol_engine):
    cfg = D3Config()
    answer = measure(smol_engine, "What is the capital of France?", cfg, 8)
    L = smol_engine.num_layers
    assert len(answer.oracle_depth) == len(answer.fp.answer) == 8
    assert all(6 <= n <= s <= L for n, s in zip(answer.oracle_depth, answer.stable_depth))
    assert all(0 <= d <= L for d in answer.prediction_depth)
    i = int(np.argmax(answer.oracle_depth[1:])) + 1  # the neediest token after the first: check it by brute force
    need = answer.oracle_depth[i]
    top1 = answer.fp.top1[i]
    assert int(brute_logits(smol_engine, answer, i, d3_layers(cfg, L, need)).argmax()) == top1
    if need > 6:
        assert int(brute_logits(smol_engine, answer, i, d3_layers(cfg, L, need - 1)).argmax()) != top1


@pytest.mark.parametrize("allowed", [0, 3, 12])
def test_measure_stops_within_one_step_of_should_stop(tiny_engine, allowed):
    """should_stop() is asked before every token generated and every token scanned: it stops at the first True."""
    from d3.research import Stopped

    asked = []

    def should_stop() -> bool:
        asked.append(1)
        return len(asked) > allowed

    with pytest.raises(Stopped):
        measure(tiny_engine, "hello there", D3Config(alpha=0.9, core_head=1, core_tail=1), 8,
                       should_stop=should_stop)
    assert allowed + 1 <= len(asked) <= allowed + 2  # asked once more after the loop it ended; nothing ran between
