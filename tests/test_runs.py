"""explorer/runs.py: a run's setup from the controls, parsed once per click (issue 23), and streamed side by side."""

from __future__ import annotations

import pytest

from explorer import controls as controls_module
from explorer.caps import Caps
from explorer.live import compare_fills, generate
from explorer.pool import ModelPool
from explorer.session import Session
from d3.config import D3Config
from explorer import views
from tests.apphelpers import run_pair


@pytest.fixture()
def pool(tiny_engine) -> ModelPool:
    pool = ModelPool(lambda _: tiny_engine, names=("tiny",), caps=Caps(max_new_tokens=8))
    controls_module.default_attention_layer(tiny_engine.num_layers, "tiny")  # a model's fact, worked out once
    return pool


@pytest.fixture()
def parses(monkeypatch) -> list[str]:
    """Every parse of a strategy from the controls, by the strategy parsed."""
    seen: list[str] = []
    original = controls_module.parse_strategy

    def counted(c, *args, **kwargs):
        seen.append(c.strategy)
        return original(c, *args, **kwargs)

    monkeypatch.setattr(controls_module, "parse_strategy", counted)
    return seen


def test_a_generate_click_parses_the_controls_once(pool, parses) -> None:
    for _ in generate(pool, Session(), prompt="hello", model="tiny", max_new_tokens=4, drop_order="middle_out"):
        pass
    assert parses == ["d3"]


def test_a_click_on_another_strategy_parses_it_once_and_d3_once_for_the_curve(pool, parses) -> None:
    for _ in generate(pool, Session(), prompt="hello", model="tiny", max_new_tokens=4, strategy="unified"):
        pass
    assert sorted(parses) == ["d3", "unified"]


def test_a_fill_comparison_parses_the_controls_once(pool, parses) -> None:
    for _ in compare_fills(pool, Session(), prompt="hello", model="tiny", max_new_tokens=4, drop_order="strided"):
        pass
    assert parses == ["d3"]


def test_a_finished_run_that_never_diverged_says_so_without_so_far(tiny_engine) -> None:
    last = run_pair(tiny_engine, D3Config(alpha=1.0))
    assert last.phase == "done"
    text = views.status_html(last.d3, last.full, "done", comparison=last.comparison)
    assert "so far" not in text and "No divergence" in text
