"""The drop-order study's report (d3.reports.drop_order): interpolation at common depths, the headline from the
paired interval's bound, winners and whether they survive, the SUMMARY section and the README rows; on hand data."""

from __future__ import annotations

import pytest

from d3.reports import drop_order as rep


def _row(layers: float, diff: float, low: float, high: float, speedup: float = 0.0) -> dict:
    return {"mean_layers": layers, "accuracy": 0.8 + diff, "diff": {"diff": diff, "low": low, "high": high, "n": 200},
            "fidelity": {"rate": 0.9, "low": 0.85, "high": 0.94, "same": 180, "n": 200}, "asked": 200,
            "qps": 3.0, "qps_cpu": 6.0, "stage": 2}


STUDY = {
    "model": "m", "num_layers": 10, "fixed_cost_layers": 2.0, "tasks": ["a"], "test_sizes": [200],
    "screen_rule": {"questions": 32, "min": 0.8},
    "screen": {"a": {"validation_accuracy": 0.8, "chance": 0.1, "kept": True},
               "b": {"validation_accuracy": 0.05, "chance": 0.1, "kept": False}},
    "settings": {
        "full depth": {"mean_layers": 10.0, "accuracy": 0.8, "asked": 200, "qps": 2.0,
                       "bits": "1" * 10 + "0" * 10 + "1" * 150 + "0" * 30},
        "d3 good @0.95": _row(9.6, -0.005, -0.009, 0.0, 1.03),
        "d3 good @0.9": _row(8.8, -0.02, -0.035, -0.01, 1.10),
        "d3 bad @0.95": _row(9.4, -0.05, -0.08, -0.03, 1.05),
        "d3 bad @0.9": _row(8.5, -0.30, -0.36, -0.25, 1.15),
        "unified @0.9": _row(9.0, -0.40, -0.46, -0.34, 1.12),
        "unified @0.99": _row(10.0, 0.0, 0.0, 0.0, 1.5),  # skips nothing: timing noise, never a headline
    },
}


def test_a_curve_is_interpolated_between_the_settings_around_a_depth_and_not_beyond() -> None:
    good = rep.curves(STUDY)["d3 good"]
    assert [r["layers"] for r in good] == [8.8, 9.6]
    at9 = rep.at_depth(good, 9.0)  # a quarter of the way from 8.8 to 9.6
    assert at9["diff"] == pytest.approx(-0.02 + 0.25 * 0.015) and at9["low"] == pytest.approx(-0.035 + 0.25 * 0.026)
    assert rep.at_depth(good, 9.7) is None and rep.at_depth(good, 8.7) is None
    assert rep.common_depths(STUDY) == [9.0]  # both orders cover 9 layers only


def test_the_headline_reads_the_upper_bound_of_the_loss_and_picks_the_fewest_layers_not_the_fastest_timing() -> None:
    one = rep.headline(STUDY, 0.01)
    assert "**d3 good @0.95** at 9.60 of 10" in one and "-0.5 [-0.9, +0.0]" in one
    assert "same answer as full depth 90.0% [85.0, 94.0]" in one and "speed not measured" in one
    three = rep.headline(STUDY, 0.03)  # 8.8 layers loses up to 3.5 points: not within 3
    assert "**d3 good @0.95**" in three
    assert "unified @0.99" not in one  # skips nothing: never a headline
    strict = rep.headline(STUDY, 0.005)
    assert "**none**" in strict and "closest is d3 good @0.95" in strict and "loss up to 0.9 points" in strict
    deeper = {**STUDY, "settings": {**STUDY["settings"], "d3 bad @0.9": _row(8.5, -0.001, -0.008, 0.005)}}
    assert "**d3 bad @0.9** at 8.50" in rep.headline(deeper, 0.01)  # fewer layers within the bound wins


def _timed(ratio: float, low: float, high: float, fixed: float, plain: float) -> dict:
    from d3.research.stats import speed_flag

    return {"ratio": ratio, "low": low, "high": high, "pairs": 8, "threads": 1, "questions": 64, "mean_layers": 9.6,
            "theory_fixed": fixed, "theory_plain": plain, "flag": speed_flag(low, fixed, plain)}


def test_a_speed_above_its_theoretical_bound_beyond_its_interval_is_flagged_and_never_bold() -> None:
    from d3.research.stats import speed_flag

    assert speed_flag(1.01, 1.03, 1.04) == ""  # the interval reaches the bound
    assert speed_flag(1.035, 1.03, 1.04) == "above the LM-head bound"
    # the withdrawn 1.11x (pairs 1.07-1.15) at 27.82 of 30 layers: above the LM-head bound (1.061x), flagged
    assert speed_flag(1.07, 1.061, 1.078) == "above the LM-head bound"
    assert speed_flag(1.08, 1.061, 1.078) == "above theory"
    fine = rep.headline({**STUDY, "speed": {"d3 good @0.95": _timed(1.02, 0.99, 1.05, 1.03, 1.04)}}, 0.01)
    assert "speed 1.020x [0.990, 1.050] per generated token (8 ABBA pairs, 1 thread each side" in fine
    assert "theory at 9.60 layers 1.030x with the LM head as fixed cost, 1.040x with none" in fine and "FLAG" not in fine
    above = rep.headline({**STUDY, "speed": {"d3 good @0.95": _timed(1.11, 1.07, 1.15, 1.03, 1.04)}}, 0.01)
    assert "FLAG: above theory beyond its interval" in above and "**1.1" not in above and "1.110x" in above
    study = {**STUDY, "speed": {"d3 good @0.95": _timed(1.11, 1.07, 1.15, 1.03, 1.04)}}
    assert "FLAG: above theory" in rep.readme_rows([study])


def test_the_fresh_seed_says_whether_each_headline_replicates() -> None:
    from d3.research.stats import replication

    meets = {"diff": 0.0, "low": -0.008, "high": 0.01}
    assert replication(0.01, meets, {"diff": 0.0, "low": -0.009, "high": 0.01}) == "replicates"
    assert replication(0.01, meets, {"diff": -0.01, "low": -0.03, "high": 0.0}) == "does not replicate"
    assert replication(0.01, meets, {"diff": -0.035, "low": -0.059, "high": -0.014}) == "refuted"
    assert replication(0.01, {"low": -0.05}, meets) == "no headline to replicate"
    fresh = {"seed": 1, "full": {"200": {"accuracy": 0.75}},
             "settings": {"d3 good @0.95": {"diff": {"diff": -0.035, "low": -0.059, "high": -0.014, "n": 200},
                                            "fidelity": {"rate": 0.8, "low": 0.74, "high": 0.85}, "per_task_questions": 200}}}
    line = rep.headline({**STUDY, "fresh": fresh}, 0.01)
    assert "fresh questions (seed 1, 200 new test questions, full depth 75.0% there): -3.5 [-5.9, -1.4] pts" in line
    assert "**refuted**" in line
    assert "fresh questions -3.5 [-5.9, -1.4] (refuted)" in rep.readme_rows([{**STUDY, "fresh": fresh}])


def test_the_winner_at_a_depth_says_whether_it_survives_the_intervals() -> None:
    (line,) = rep.winners(STUDY)
    assert line.startswith("9 layers: **good**") and "does not survive" not in line and "survives" in line
    close = {**STUDY, "settings": {**STUDY["settings"], "d3 bad @0.95": _row(9.4, -0.02, -0.04, 0.0, 1.05),
                                   "d3 bad @0.9": _row(8.5, -0.03, -0.05, -0.01, 1.15)}}
    assert "does not survive" in rep.winners(close)[0]


def test_the_section_states_realized_depth_screen_and_intervals_and_replaces_its_old_self(tmp_path) -> None:
    text = rep.section(STUDY)
    assert "a 80% (kept)" not in text and "a 80%; b 5% (dropped)" in text
    assert "a task is kept for the model when it answers at least 80% of them" in text and "32 validation" in text
    assert ("| d3 good @0.9 | 8.80 | 200 | 78.0% | 80.0% | -2.0 [-3.5, -1.0] | 90.0% [85.0, 94.0] | "
            f"{12 / 10.8:.3f} / {10 / 8.8:.3f} |") in text
    summary = tmp_path / "SUMMARY.md"
    summary.write_text("# S\n\n## Drop order: which layers m can spare\nold\n\n## Other\nkept\n")
    rep.write_section(summary, STUDY)
    rep.write_section(summary, STUDY)
    out = summary.read_text()
    assert out.count("## Drop order: which layers m") == 1 and "old" not in out and "## Other\nkept" in out
    rep.write_section(summary, {**STUDY, "model": "other"})  # another model's section goes beside it
    assert summary.read_text().count(rep.HEADING) == 2


def test_readme_rows_replace_the_studys_own_rows_only(tmp_path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"| q | a |\n|---|---|\n| other | 1 |\n{rep.README_ROW}m: stale | x |\n| last | 2 |\n")
    rep.write_readme(readme, [STUDY, {**STUDY, "model": "n", "partial": "2 of 3 settings"}])
    out = readme.read_text().splitlines()
    assert out[:3] == ["| q | a |", "|---|---|", "| other | 1 |"] and out[-1] == "| last | 2 |" and "stale" not in "".join(out)
    assert out[3].startswith(f"{rep.README_ROW}m: fewest layers") and out[4].startswith(f"{rep.README_ROW}n (partial run):")
    r, met = rep.headline_pick(STUDY, rep.BOUNDS[0])  # the short row names the headline's setting, no more
    assert (f"{r['label']} at {r['layers']:.2f}" if met else "<= 1 pt: none") in out[3] and len(out[3]) < 700
    plain = tmp_path / "plain.md"
    plain.write_text("no rows\n")
    rep.write_readme(plain, [STUDY])
    assert plain.read_text() == "no rows\n"


def test_curve_points_give_each_order_its_settings_with_their_intervals() -> None:
    points = rep.curve_points(STUDY, "layers")
    assert points["d3 good"][0] == {"layers": 8.8, "diff": -0.02, "low": -0.035, "high": -0.01}
    assert [p["layers"] for p in points["d3 bad"]] == [8.5, 9.4]


def test_orders_at_the_same_depth_are_paired_question_by_question() -> None:
    settings = {"d3 a @0.9": {**_row(9.0, -0.02, -0.05, 0.0, 1.1), "accuracy": 0.9, "bits": "1" * 18 + "00"},
                "d3 b @0.9": {**_row(9.05, -0.5, -0.6, -0.4, 1.1), "accuracy": 0.4, "bits": "1" * 8 + "0" * 12},
                "d3 c @0.8": {**_row(8.0, -0.5, -0.6, -0.4, 1.2), "accuracy": 0.4, "bits": "0" * 20}}
    (line,) = rep.paired_orders({**STUDY, "settings": settings})
    # a wins 10 of 20 questions and loses none; by hand: Clopper-Pearson(10 of 10) starts at 0.025 ** (1 / 10)
    low = 100 * 10 * (2 * 0.025 ** 0.1 - 1) / 20
    assert line == (f"d3 a @0.9 over d3 b @0.9 at 9.00 / 9.05 layers: +50.0 [{low:+.1f}, +50.0] pts on 20 questions "
                    "(beyond the interval)")
    few = {k: {**v, "bits": v["bits"][:10]} for k, v in settings.items()}  # 5 wins of 10: not enough to resolve
    assert "not resolved" in rep.paired_orders({**STUDY, "settings": few})[0]


def test_a_setting_stopped_after_the_first_stage_prints_full_depths_accuracy_on_the_same_questions() -> None:
    """A first-stage row ran the first 20 questions, where full depth scored 50% (10 of 20), not its 80% on all
    200: the row prints 50% beside its own, so it cannot read as above full depth while below it."""
    stopped = {**_row(8.6, -0.3, -0.4, -0.2), "diff": {"diff": -0.3, "low": -0.4, "high": -0.2, "n": 20},
               "stage": 1, "accuracy": 0.2, "asked": 20, "bits": "1" * 4 + "0" * 16}
    whole = {**_row(8.65, -0.01, -0.03, 0.0), "accuracy": 0.79, "bits": "1" * 20 + "1" * 150 + "0" * 30}
    study = {**STUDY, "settings": {**STUDY["settings"], "d3 bad @0.85": stopped, "d3 good @0.85": whole},
             "stages": [[20], [180]], "go_on": 0.03, "collapse": 0.2, "curves_stopped": {"d3 bad": "d3 bad @0.85"},
             "cost": {"screen": {"wall_s": 600.0, "cpu_s": 120.0}, "sweep": {"wall_s": 1200.0, "cpu_s": 600.0}}}
    text = rep.section(study)
    assert "| d3 bad @0.85 | 8.60 | 20 (first stage) | 20.0% | 50.0% | -30.0 [-40.0, -20.0] |" in text
    assert "| d3 good @0.85 | 8.65 | 200 | 79.0% | 80.0% |" in text
    assert "12.0 CPU-minutes of this process" in text and "30.0 minutes of wall time" in text
    assert "every setting answered the first 20 test questions" in text and "went on to all 200" in text
    assert "d3 bad: lost 20 points or more at d3 bad @0.85; its deeper cuts were not run" in text
    line = next(x for x in rep.paired_orders(study) if x.startswith("d3 good @0.85"))
    assert "on 20 questions" in line  # the stopped setting's first stage: the questions both ran


def test_a_study_where_no_two_curves_share_a_depth_says_so_instead_of_an_empty_table() -> None:
    study = {**STUDY, "settings": {"full depth": STUDY["settings"]["full depth"],
                                   "d3 good @0.95": STUDY["settings"]["d3 good @0.95"]}}
    text = rep.section(study)
    assert "No whole layer count is covered by two orders' curves" in text and "| order |  |" not in text
    assert "- no depth is covered by two orders' curves" in text


def test_the_better_of_two_orders_is_chosen_on_the_questions_both_ran() -> None:
    """A stopped setting's accuracy is over its first stage, another's over every question (a different mix of
    tasks): the one ahead on the shared questions is named first, so the difference reads as a gain."""
    stopped = {**_row(9.0, -0.3, -0.4, -0.2, 1.2), "accuracy": 0.5, "bits": "1" * 10 + "0" * 10}
    whole = {**_row(9.02, -0.5, -0.6, -0.4, 1.1), "accuracy": 0.075, "bits": "1" * 15 + "0" * 185}
    (line,) = rep.paired_orders({**STUDY, "settings": {"d3 a @0.9": stopped, "d3 b @0.9": whole}})
    assert line.startswith("d3 b @0.9 over d3 a @0.9 at 9.02 / 9.00 layers: +25.0 [") and "on 20 questions" in line


def test_per_task_differences_follow_the_stages_layout_of_the_bits() -> None:
    """Bits run stage by stage, task by task within a stage ([a a b b] then [b b b]): each task's paired difference
    is read from its own questions, and a stopped setting's from its first stage only."""
    study = {"tasks": ["a", "b"], "stages": [[2, 2], [0, 3]],
             "settings": {"full depth": {"bits": "11" + "00" + "000"},
                          "d3 x @0.9": {"bits": "10" + "11" + "111"},  # a: loses 1 of 2; b: gains all 5
                          "d3 y @0.9": {"bits": "11" + "01"}}}  # stopped after the first stage
    x = rep.per_task(study, "d3 x @0.9")
    assert x.startswith("a -50.0 [") and " on 2; b +100.0 [" in x and x.endswith("pts on 5")
    assert rep.per_task(study, "d3 y @0.9").startswith("a +0.0 [+0.0, +0.0] pts on 2; b +50.0 [")
    assert rep.per_task(study, "d3 y @0.9").endswith("pts on 2")


def test_across_models_says_where_the_deep_model_keeps_answers_the_small_one_loses_and_what_was_never_run(tmp_path) -> None:
    small = {**STUDY, "model": "small"}  # 10 layers: kept within 3 pts at 9.6 (96%), 8.8 (88%) loses 3.5 at most
    deep = {**STUDY, "model": "deep", "num_layers": 20, "settings": {
        "full depth": STUDY["settings"]["full depth"], "d3 x @0.9": _row(17.8, -0.005, -0.02, 0.01)}}  # 89%
    lines = rep.across_models([small, deep])  # the last named is the one compared with the others
    assert rep.across_models([deep, small], "deep") == lines and rep.across_models([deep, small])[0].startswith("small")
    assert lines[0].startswith("deep (20 layers) keeps its answers within 3 points at 17.80 of 20 layers per token (89.0%")
    assert "small (10 layers): its own fewest within 3 points: 9.60 of 10 (96.0%)" in lines[1]
    assert "d3 good @0.9 at 8.80 (88.0%), -2.0 [-3.5, -1.0] pts on 200 questions: **not within 3 points** (its loss may reach 3.5)" in lines[1]
    never = rep.across_models([{**small, "settings": {k: v for k, v in small["settings"].items() if "0.9" not in k
                                                      or "0.95" in k}}, deep])
    assert "never run at 89.0% of its depth or fewer, so whether it could is not measured" in never[1]
    lost = {**deep, "settings": {**deep["settings"], "d3 x @0.9": _row(17.8, -0.1, -0.2, -0.05)}}
    assert rep.across_models([small, lost]) == [
        "deep (20 layers): no setting kept its accuracy loss's 95% upper bound within 3 points, so no depth is claimed for it"]
    summary = tmp_path / "SUMMARY.md"
    summary.write_text("# S\n\n## Drop order: which layers m can spare\n\nold\n")
    rep.write_across(summary, [small, deep])
    rep.write_across(summary, [small, deep])  # replaces itself
    text = summary.read_text()
    assert text.count(rep.ACROSS) == 1 and "old" in text and "**not within 3 points**" in text
