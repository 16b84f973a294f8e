"""explorer/runs.py: a run's setup from the controls, parsed once per click (issue 23), and streamed side by side."""

from __future__ import annotations

import pytest

from d3.config import D3Config
from explorer import controls as controls_module
from explorer import views
from explorer.caps import Caps
from explorer.live import compare_fills, generate
from explorer.pool import ModelPool
from explorer.session import Session
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

@pytest.fixture()
def slowed(tiny_engine, monkeypatch):
    """The tiny engine slowed to about 20 ms a decoding step, and the comparison's progress read every 2 ms."""
    import time

    from explorer import runs

    original = type(tiny_engine).run

    def run(self, *args, **kwargs):
        for item in original(self, *args, **kwargs):
            time.sleep(0.02)
            yield item

    monkeypatch.setattr(type(tiny_engine), "run", run)
    monkeypatch.setattr(runs, "MEASURING_EVERY_S", 0.002)
    return tiny_engine


def test_the_comparison_says_what_it_measures_and_how_far_it_is(slowed, pool) -> None:
    """Issue 24: the default run's last ~17 s of "measuring" showed no progress. While the comparison runs, the status
    line names what is measured and counts the teacher-forced run's tokens up to the run's length."""
    from explorer.live import GENERATE_OUTPUTS

    statuses = [dict(zip(GENERATE_OUTPUTS, out))["status"]
                for out in generate(pool, Session(), prompt="hello", model="tiny", max_new_tokens=6,
                                    drop_order="middle_out")]
    measuring = [s for s in statuses if isinstance(s, str) and "Teacher-forced D3 run" in s]
    counts = [int(s.split("token ")[-1].split(" of ")[0]) for s in measuring]
    assert len(set(counts)) >= 3 and counts == sorted(counts) and max(counts) <= 6, counts
    assert all(" of 6 " in s for s in measuring)
    assert "Done." in statuses[-1]


def test_closing_a_run_while_it_measures_stops_the_comparison(slowed) -> None:
    import threading

    from d3.config import D3Config, GenerationConfig
    from explorer.runs import side_by_side

    stream = side_by_side(slowed, "hello", D3Config(), GenerationConfig(max_new_tokens=6))
    next(u for u in stream if u.measuring is not None)
    stream.close()  # a new run or a closed tab
    assert not [t for t in threading.enumerate() if t.name.startswith("d3-compare")]
