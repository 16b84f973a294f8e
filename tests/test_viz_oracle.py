"""viz/oracle.py: the figures carry the needs, D3's schedule, the under-served tokens and the fits they are given."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from d3.config import D3Config
from d3.schedule import budgets
from viz.oracle import need_bands, needs_summary, token_needs

L = 12
CFG = D3Config(alpha=0.9, core_head=2, core_tail=2)  # budgets 12, 10, 9, 8, 7, 7, 6, 5, 5, 4


def by_role(fig, role):
    found = [t for t in fig.data if (t.meta or {}).get("role") == role]
    assert len(found) == 1, [t.meta for t in fig.data]
    return found[0]


def test_token_needs_marks_exactly_the_underserved_tokens():
    need = [12, 11, 5, 8, 9, 4, 4, 6, 4, 5]
    budget = budgets(CFG, L, 10)
    assert budget == [12, 10, 9, 8, 7, 7, 6, 5, 5, 4]
    fig = token_needs(need, L, CFG, texts=list("abcdefghij"), fitted=D3Config(alpha=0.95, start=1),
                      prediction_depth=[3] * 10)
    under = by_role(fig, "underserved")
    served = by_role(fig, "served")
    assert list(under.x) == [1, 4, 7, 9] and list(under.y) == [11, 9, 6, 5]  # need > budget
    assert list(served.x) == [0, 2, 3, 5, 6, 8]
    assert "token 1 " in under.text[0] and "needs 11" in under.text[0] and "D3 gives 10" in under.text[0]
    assert list(by_role(fig, "schedule").y) == budget
    assert list(by_role(fig, "fitted").y) == budgets(D3Config(alpha=0.95, start=1), L, 10)
    assert list(by_role(fig, "lens").y) == [3] * 10
    assert "4 of 10 tokens under-served" in fig.layout.title.text
    assert fig.layout.shapes[0].y0 == 4  # the core floor, 2 + 2


def test_token_needs_without_extras_has_only_schedule_and_dots():
    fig = token_needs([12, 4], L, CFG)
    assert sorted(t.meta["role"] for t in fig.data) == ["schedule", "served", "underserved"]
    assert len(by_role(fig, "underserved").x) == 0


def test_need_bands_by_hand():
    bands = need_bands([[10, 8, 6], [12, 4], [11]])
    assert bands["count"].tolist() == [3, 2, 1]
    assert bands["mean"].tolist() == [11, 6, 6]
    assert bands["q25"].tolist() == [10.5, 5, 6] and bands["q75"].tolist() == [11.5, 7, 6]


def test_needs_summary_draws_mean_band_schedule_and_fits():
    needs = [[12, 10, 8, 6], [12, 8, 6], [12, 12, 10, 8]]
    fits = {"least_squares": D3Config(alpha=0.93), "coverage": D3Config(alpha=0.97)}
    fig = needs_summary(needs, L, CFG, fits=fits, model="tiny")
    assert np.allclose(by_role(fig, "mean").y, [12, 10, 8, 7])
    assert list(by_role(fig, "mean").customdata) == [3, 3, 3, 2]
    band = by_role(fig, "band")
    assert len(band.x) == 8 and band.fill == "toself"
    assert list(by_role(fig, "schedule").y) == budgets(CFG, L, 4)
    assert list(by_role(fig, "fit:coverage").y) == budgets(D3Config(alpha=0.97), L, 4)
    assert "α=0.93" in by_role(fig, "fit:least_squares").name
    assert "tiny" in fig.layout.title.text and "3 answers" in fig.layout.title.text


def test_bad_config_raises():
    with pytest.raises(ValueError, match="core_head"):
        token_needs([12], L, D3Config(core_head=8, core_tail=8))


def test_viz_oracle_imports_neither_torch_nor_gradio():
    code = "import sys, viz.oracle; print(any(m in sys.modules for m in ('torch', 'gradio', 'transformers')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_summary_figure_script_writes_html_from_a_results_file(tmp_path):
    import json
    from pathlib import Path

    needs = [[12, 10, 8, 6], [12, 8, 6]]
    result = {"model": "tiny", "num_layers": L, "core": [2, 2], "drop_order": "middle_out", "oracle_depth": needs,
              "alpha_fit": {"least_squares": {"alpha": 0.93, "start": 0}, "coverage": {"alpha": 0.97, "start": 0}},
              "prompts": [{}, {}], "summary": {"oracle_depth": {"tokens": 7, "spearman_need_vs_position": -0.9}}}
    path = tmp_path / "oracle_tiny.json"
    path.write_text(json.dumps(result))
    out = tmp_path / "fig.html"
    script = Path(__file__).resolve().parent.parent / "scripts" / "oracle_figure.py"
    subprocess.run([sys.executable, str(script), str(path), "--out", str(out)], check=True, capture_output=True)
    page = out.read_text()
    assert "cdn.plot.ly" in page and "mean need" in page and "coverage fit: α=0.97" in page
    assert "Spearman(need, position) = -0.90" in page
