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
    got = settings(30, orders, (0.99, 0.97, 0.9))
    # at 0.99 D3 and Unified plan full depth (alpha 1, ratio 1): left out; SkipDecode's shape does not move: once
    assert list(got) == ["skipdecode @0.99", "d3 bottom_up @0.97", "d3 cal @0.97",
                         "d3 bottom_up @0.9", "d3 cal @0.9", "unified @0.9"]
    assert got["d3 bottom_up @0.97"].alpha == got["d3 cal @0.97"].alpha > got["d3 bottom_up @0.9"].alpha
    assert isinstance(got["unified @0.9"], UnifiedConfig) and isinstance(got["skipdecode @0.99"], SkipDecodeConfig)


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


def test_a_first_stage_and_the_rest_join_into_the_whole_test_set(tiny_engine, test_set) -> None:
    """QuestionSet's start splits each task's questions; the joined outcome pairs as the whole set does."""
    first = QuestionSet(tiny_engine, TASKS, "test", limit=1, batch=2)
    rest = QuestionSet(tiny_engine, TASKS, "test", limit=3, batch=2, start=1, keep=False)
    assert (first.sizes, rest.sizes, len(first) + len(rest)) == ([1, 1], [2, 2], 6)
    cfg = D3Config(alpha=0.5, core_head=1, core_tail=1)
    whole, staged = test_set.run(cfg), first.run(cfg).join(rest.run(cfg))
    order = [0, 3, 1, 2, 4, 5]  # the staged run asks task 1's first, task 2's first, then the rest of each
    assert staged.correct == tuple(whole.correct[i] for i in order)
    assert staged.answers == tuple(whole.answers[i] for i in order)
    assert staged.tokens == whole.tokens and staged.mean_layers == pytest.approx(whole.mean_layers)
    full = first.run(FullConfig()).join(rest.run(FullConfig()))
    row = paired_row(full, staged, [first.sizes, rest.sizes])
    assert row["per_task"] == paired_row(test_set.run(FullConfig()), whole, test_set.sizes)["per_task"]
    assert staged.head(2).correct == staged.correct[:2] and len(staged.head(2).answers) == 2


def test_a_setting_goes_on_only_while_its_interval_reaches_the_bound_and_an_order_stops_when_it_collapses() -> None:
    from d3.research.stats import exact_difference
    from d3.research.study import collapsed, curve_name, goes_on

    full = [True] * 100
    close = exact_difference(full, [True] * 99 + [False]).to_dict()  # -1 point, interval reaches 0
    far = exact_difference(full, [True] * 80 + [False] * 20).to_dict()  # -20 points, upper end about -12
    assert goes_on(close) and not goes_on(far) and goes_on(far, bound=0.2)
    assert collapsed(far) and not collapsed(close)
    assert curve_name("d3 calibrated agreement @0.93") == "d3 calibrated agreement" and curve_name("unified @0.9") == "unified"


def test_the_study_script_hands_each_model_its_own_command_line() -> None:
    """`--jobs 2`: each model measured in its own process, with this run's flags, only the measuring parts, and
    no second level of jobs (the report waits for both)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "drop_order_study.py"
    spec = importlib.util.spec_from_file_location("drop_order_study", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    argv = ["--models", "smollm2-135m,gemma3-270m", "--test-limit", "100", "--jobs=2", "--only", "sweep,report",
            "--stage1", "25"]
    assert script.child_argv(argv, "gemma3-270m", ["sweep"]) == \
        ["--test-limit", "100", "--stage1", "25", "--models", "gemma3-270m", "--only", "sweep", "--jobs", "1"]


def test_a_freed_core_gives_the_study_one_more_thread_up_to_the_machines_cores(monkeypatch) -> None:
    """`--jobs 2`: when one model's process ends, the parent signals the other (FREED), which takes the free core."""
    import importlib.util
    import os
    from pathlib import Path

    import torch

    path = Path(__file__).resolve().parents[1] / "scripts" / "drop_order_study.py"
    spec = importlib.util.spec_from_file_location("drop_order_study", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    threads = torch.get_num_threads()
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    try:
        torch.set_num_threads(1)
        script.take_a_freed_core()
        assert torch.get_num_threads() == 2
        script.take_a_freed_core()
        assert torch.get_num_threads() == 2  # no more threads than cores
    finally:
        torch.set_num_threads(threads)


def test_two_orders_that_drop_the_same_layers_for_a_whole_reply_are_one_run() -> None:
    """`same_run`: bottom_up and an order that drops 3 and 4 first are the same run while no token drops a third
    layer; a deeper cut (a third layer dropped) or another fill tells them apart."""
    from d3.config import D3Config
    from d3.research.study import same_run

    flex = tuple(range(3, 27))
    calibrated = dict(drop_order="calibrated", layer_order=(3, 4, 6, 5, *flex[4:]))
    mild, deep = 0.998, 0.97  # over 20 tokens: at most 2 layers dropped; many
    assert same_run(D3Config(alpha=mild, drop_order="bottom_up"), 30, 20) == same_run(D3Config(alpha=mild, **calibrated), 30, 20)
    assert same_run(D3Config(alpha=deep, drop_order="bottom_up"), 30, 20) != same_run(D3Config(alpha=deep, **calibrated), 30, 20)
    assert same_run(D3Config(alpha=mild, drop_order="bottom_up"), 30, 20) != \
        same_run(D3Config(alpha=mild, drop_order="bottom_up", fill="propagate"), 30, 20)
