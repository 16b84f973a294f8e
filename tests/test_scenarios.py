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
