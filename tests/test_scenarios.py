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
