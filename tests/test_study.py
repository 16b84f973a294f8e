"""The drop-order study's measuring pieces (d3.research.study) on a tiny model: paired rows, ABBA timing, the sweep's
settings at each target, and the task screen."""

from __future__ import annotations

import pytest

from d3.config import D3Config, FullConfig, SkipDecodeConfig, UnifiedConfig
from d3.research.answers import PrefilledQuestions
from d3.research.gentasks import get_generation_task
from d3.research.study import Eta, QuestionSet, paired_row, screen_tasks, settings, timing_pairs

TASKS = ("gen_1_digit_addition", "gen_word_sorting")


@pytest.fixture(scope="module")
def test_set(tiny_engine) -> QuestionSet:
    return QuestionSet(tiny_engine, TASKS, "test", limit=3, batch=2)


def test_a_row_pairs_each_question_with_full_depths_answer(test_set) -> None:
    full = test_set.run(FullConfig())
    same = test_set.run(D3Config(alpha=1.0))
    shallow = test_set.run(D3Config(alpha=0.5, core_head=1, core_tail=1))
    assert test_set.sizes == [3, 3] and len(full.correct) == 6 and full.mean_layers == 6.0
    row = paired_row(full, same, test_set.sizes)
    assert row["diff"]["low"] == row["diff"]["high"] == 0.0 and row["same_answer"]["diff"] == 0.0
    low = paired_row(full, shallow, test_set.sizes)
    assert low["mean_layers"] < 6.0 and low["asked"] == 6 and len(low["bits"]) == 6 and len(low["per_task"]) == 2
    disagree = sum(a != b for a, b in zip(full.answers, shallow.answers)) / 6
    assert low["same_answer"]["diff"] == pytest.approx(-disagree)  # the same-answer rate, as a difference from 100%
    assert low["diff"]["won"] + low["diff"]["lost"] == sum(a != b for a, b in zip(full.correct, shallow.correct))


def test_timing_alternates_full_depth_and_the_setting(tiny_engine) -> None:
    task = get_generation_task(TASKS[0])
    questions = PrefilledQuestions(tiny_engine, task, task.split("test")[:2], batch=2)
    calls = []
    original = questions.answer
    questions.answer = lambda cfg: calls.append(cfg.name) or original(cfg)  # type: ignore[method-assign]
    t = timing_pairs(questions, D3Config(alpha=0.9), pairs=3)
    assert calls == ["full", "d3", "d3", "full", "full", "d3"]  # ABBA...: neither side always goes first
    assert t["timing_pairs"] == 3 and t["speedup_spread"][0] <= t["measured_speedup"] <= t["speedup_spread"][1]
    assert t["qps_full"] > 0 and t["qps_method"] > 0 and t["timing_questions"] == 2


def test_the_sweep_has_every_order_and_baseline_at_every_target() -> None:
    orders = {"bottom_up": {"drop_order": "bottom_up"}, "cal": {"drop_order": "calibrated", "layer_order": tuple(range(3, 27))}}
    got = settings(30, orders, (0.97, 0.9))
    assert list(got) == ["d3 bottom_up @0.97", "d3 cal @0.97", "unified @0.97", "skipdecode @0.97",
                         "d3 bottom_up @0.9", "d3 cal @0.9", "unified @0.9", "skipdecode @0.9"]
    assert got["d3 bottom_up @0.97"].alpha == got["d3 cal @0.97"].alpha > got["d3 bottom_up @0.9"].alpha
    assert isinstance(got["unified @0.9"], UnifiedConfig) and isinstance(got["skipdecode @0.9"], SkipDecodeConfig)


def test_the_screen_reads_validation_only_and_drops_what_full_depth_cannot_do(tiny_engine) -> None:
    screen = screen_tasks(tiny_engine, TASKS, limit=2, batch=2)
    assert set(screen) == set(TASKS)
    for v in screen.values():  # a random tiny model answers nothing: every task is dropped
        assert v["asked"] == 2 and v["validation_accuracy"] == 0.0 and v["kept"] is False


def test_progress_estimates_the_time_left_from_the_settings_done() -> None:
    lines = []
    eta = Eta(total=4, say=lines.append, done=1)
    eta.tick("a", 60.0, "x")
    eta.tick("b", 180.0, "y")
    assert lines == ["[2/4] a: x (60 s; about 2 min left)", "[3/4] b: y (180 s; about 2 min left)"]
