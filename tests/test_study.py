"""The drop-order study's measuring pieces (d3.research.study) on a tiny model: paired rows, ABBA timing, the sweep's
settings at each target, and the task screen."""

from __future__ import annotations

import pytest

from d3.config import D3Config, FullConfig, SkipDecodeConfig, UnifiedConfig
from d3.research.answers import PrefilledQuestions
from d3.research.gentasks import get_generation_task
from d3.research.study import Eta, QuestionSet, paired_row, per_token_timing, screen_rule, screen_tasks, settings

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
    assert row["diff"]["low"] == row["diff"]["high"] == 0.0 and row["fidelity"]["rate"] == 1.0
    low = paired_row(full, shallow, test_set.sizes)
    assert low["mean_layers"] < 6.0 and low["asked"] == 6 and len(low["bits"]) == 6 and len(low["per_task"]) == 2
    same = sum(a == b for a, b in zip(full.answers, shallow.answers))
    fid = low["fidelity"]  # the same-answer rate with its exact (Clopper-Pearson) interval; full depth need not be right
    assert (fid["same"], fid["n"]) == (same, 6) and fid["rate"] == pytest.approx(same / 6)
    assert fid["low"] <= fid["rate"] <= fid["high"]
    assert low["diff"]["won"] + low["diff"]["lost"] == sum(a != b for a, b in zip(full.correct, shallow.correct))


def test_timing_is_per_token_in_abba_pairs_with_one_thread_each_side_beside_theory(tiny_engine) -> None:
    import torch

    task = get_generation_task(TASKS[0])
    questions = PrefilledQuestions(tiny_engine, task, task.split("test")[:2], batch=2)
    calls, threads = [], []
    original = questions.answer

    def answer(cfg):
        calls.append(cfg.name)
        threads.append(torch.get_num_threads())
        return original(cfg)
    questions.answer = answer  # type: ignore[method-assign]
    before = torch.get_num_threads()
    cfg = D3Config(alpha=0.5, core_head=1, core_tail=1)
    t = per_token_timing([questions], cfg, tiny_engine.num_layers, 2.0, pairs=8, threads=1)
    assert calls == ["full", "d3", "d3", "full"] * 4  # ABBA: neither side always goes first
    assert set(threads) == {1} and torch.get_num_threads() == before  # the same thread count both sides, restored
    assert t["pairs"] == len(t["ratios"]) == 8 and t["low"] == min(t["ratios"]) and t["high"] == max(t["ratios"])
    assert t["low"] <= t["ratio"] <= t["high"] and t["coverage"] > 0.99 and t["questions"] == 2
    L, depth = tiny_engine.num_layers, t["mean_layers"]
    assert depth < L and t["theory_plain"] == pytest.approx(L / depth, abs=1e-3)
    assert t["theory_fixed"] == pytest.approx((L + 2.0) / (depth + 2.0), abs=1e-3)
    assert t["theory_fixed"] < t["theory_plain"]
    with pytest.raises(ValueError, match="pairs must be at least 8"):
        per_token_timing([questions], cfg, L, 2.0, pairs=4)


def test_the_fresh_seed_draws_other_test_questions_and_only_generated_tasks_can_be_redrawn(tiny_engine) -> None:
    from d3.research.study import question_task

    old = question_task("gen_word_sorting").split("test")[:20]
    new = question_task("gen_word_sorting", seed=1).split("test")[:20]
    assert not {e.input for e in old} & {e.input for e in new}
    fresh = QuestionSet(tiny_engine, ("gen_word_sorting",), "test", limit=2, batch=2, seed=1)
    assert [e.input for e in fresh.sets[0].examples] == [e.input for e in new[:2]]
    with pytest.raises(ValueError, match="cannot be drawn with another seed"):
        question_task("arithmetic_1_digit_addition", seed=1)


def test_the_screen_keeps_a_task_full_depth_answers_at_70_percent_and_20_points_above_its_commonest_answer() -> None:
    assert screen_rule(0.7, 0.1) and screen_rule(0.95, 0.5) and screen_rule(23 / 32, 0.1)
    assert not screen_rule(22 / 32, 0.1)  # 68.75%
    assert not screen_rule(0.85, 0.7)  # near always giving the commonest answer


def test_the_sweep_has_every_order_and_baseline_at_every_target() -> None:
    orders = {"bottom_up": {"drop_order": "bottom_up"}, "cal": {"drop_order": "calibrated", "layer_order": tuple(range(3, 27))}}
    got = settings(30, orders, (0.99, 0.97, 0.9))
    # at 0.99 D3 and Unified plan full depth (alpha 1, ratio 1): left out; SkipDecode's shape does not move: once
    assert list(got) == ["skipdecode @0.99", "d3 bottom_up @0.97", "d3 cal @0.97",
                         "d3 bottom_up @0.9", "d3 cal @0.9", "unified @0.9"]
    assert got["d3 bottom_up @0.97"].alpha == got["d3 cal @0.97"].alpha > got["d3 bottom_up @0.9"].alpha
    assert isinstance(got["unified @0.9"], UnifiedConfig) and isinstance(got["skipdecode @0.99"], SkipDecodeConfig)


def test_start_is_an_axis_of_the_sweep_each_start_its_own_curve() -> None:
    """`start` keeps tokens 0..start at full depth: the gentle settings between full depth and a layer dropped
    from token 1 on. Each start is its own curve ("d3 bottom_up s8"), at the same alphas."""
    from d3.research.study import curve_name
    from d3.schedule import planned_mean_layers

    got = settings(30, {"bottom_up": {"drop_order": "bottom_up"}}, (0.97, 0.9), baselines=(), starts=(0, 8))
    assert list(got) == ["d3 bottom_up @0.97", "d3 bottom_up s8 @0.97", "d3 bottom_up @0.9", "d3 bottom_up s8 @0.9"]
    assert got["d3 bottom_up s8 @0.9"].start == 8 and got["d3 bottom_up s8 @0.9"].alpha == got["d3 bottom_up @0.9"].alpha
    assert curve_name("d3 bottom_up s8 @0.9") == "d3 bottom_up s8"
    gentle, plain = (planned_mean_layers(got[k], 30, 20) for k in ("d3 bottom_up s8 @0.97", "d3 bottom_up @0.97"))
    assert plain < gentle < 30


def test_the_screen_reads_validation_only_and_drops_what_full_depth_cannot_do(tiny_engine) -> None:
    screen = screen_tasks(tiny_engine, TASKS, limit=2, batch=2)
    assert set(screen) == set(TASKS)
    for v in screen.values():  # a random tiny model answers nothing: every task is dropped
        assert v["asked"] == 2 and v["validation_accuracy"] == 0.0 and v["kept"] is False
    early = screen_tasks(tiny_engine, TASKS[:1], limit=4, batch=2, step=2)[TASKS[0]]
    assert early["asked"] == 2 and not early["kept"]  # 0 of 2: even 2 more right cannot reach 70% of 4: stopped


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
