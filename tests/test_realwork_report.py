"""d3.research.realwork_report: each setting paired with full depth on the same problems, the figure, SUMMARY's
section replaced rather than repeated."""

from __future__ import annotations


def _rec(setting: str, pid: str, passed: bool, ids: list[int], layers: int = 28) -> dict:
    return {"setting": setting, "pid": pid, "passed": passed, "ids": ids, "tokens": len(ids),
            "layers": layers * len(ids), "completion": ",".join(map(str, ids)), "batch_id": f"{setting}{pid}",
            "elapsed": 1.0, "config": {"name": setting}}


def test_the_report_pairs_each_setting_with_full_depth_on_the_same_problems(tmp_path) -> None:
    from d3.research.realwork_report import curve, figure, report, write_summary

    recs = [_rec("full", f"p{i}", i % 2 == 0, [1, 2, 3, 4]) for i in range(6)]
    recs += [_rec("d3 calibrated a0.998", "p0", False, [1, 2, 9], 26),  # lost, changed at token 2
             _rec("d3 calibrated a0.998", "p1", True, [1, 2, 3, 4], 26),  # won, same code
             _rec("d3 calibrated a0.998", "p2", True, [1, 2, 3, 4], 26)]
    rep = report(recs)
    row = rep["settings"][0]
    assert rep["full"]["n"] == 6 and rep["full"]["passed"] == 3
    assert row["n"] == 3 and row["full_passed"] == 2 and row["passed"] == 2
    assert (row["diff"]["lost"], row["diff"]["won"]) == (1, 1)
    assert row["fidelity"]["same"] == 2 and row["first_changes"] == [2, None, None]
    assert row["mean_layers"] == 26 and row["theory_plain"] == round(28 / 26, 4)
    assert curve("d3 calibrated s24 a0.998") == "d3 calibrated s24" and curve("unified 0.95") == "unified"
    assert len(figure(rep, "toy").data) >= 3
    from d3.research.realwork_report import headline_text

    words = headline_text(rep)  # the one setting loses a point net of nothing (1 lost, 1 won): within 1 point
    assert "within 1 point (paired point estimate): d3 calibrated a0.998, 26.00 of 28 layers" in words
    assert "Nothing beats 1.1x within 1 point" in words  # 28 / 26 layers with the LM head as fixed cost: 1.06x
    summary = tmp_path / "SUMMARY.md"
    summary.write_text("# older results\n")
    write_summary(summary, {"toy": rep})
    write_summary(summary, {"toy": rep})  # replaced, not repeated
    text = summary.read_text()
    assert text.count("D3 on real work") == 1 and text.endswith("# older results\n")


def test_when_no_setting_keeps_the_answers_the_headline_names_the_deepest_and_its_loss() -> None:
    """GSM-Symbolic's first row (α 0.998 lost 10 points): the verdict does not say the settings that keep the answers
    run "at least 28 of 28 layers" (there are none); it names the deepest setting answered and what it lost."""
    from d3.research.realwork_report import headline_text, report

    recs = [_rec("full", f"p{i}", True, [1, 2, 3, 4]) for i in range(4)]
    recs += [_rec("d3 calibrated a0.998", f"p{i}", i > 0, [1, 2, 9, 4], 24) for i in range(4)]  # one lost
    recs += [_rec("d3 calibrated a0.99", f"p{i}", i > 1, [1, 9, 9, 4], 18) for i in range(4)]  # two lost
    words = headline_text(report(recs))
    assert "within 1 point (paired point estimate): no setting" in words
    assert "no setting answered so far keeps the answers within 1 point" in words
    assert "the deepest, d3 calibrated a0.998, runs 24.00 of 28 layers and loses 25.0 points" in words
    assert "at least 28.00" not in words


def test_a_setting_with_changed_problems_still_to_answer_is_shown_pending_not_paired() -> None:
    """The shortcut's passes say which problems a setting changes before they are answered: a setting with some
    left is not paired on its unchanged problems alone (that would read +0.0); its pass@1 is a range, its same-code
    count and first changes come from the passes, and it is left out of the headline and the frontier."""
    from d3.research.realwork_report import figure, report, table

    recs = [_rec("full", f"p{i}", i % 2 == 0, [1, 2, 3, 4]) for i in range(4)]
    recs += [_rec("d3 calibrated a0.995", "p0", True, [1, 2, 3, 4], 25),
             _rec("d3 calibrated a0.995", "p1", False, [1, 2, 3, 4], 25)]
    forced = [{"setting": "d3 calibrated a0.995", "pid": "p0", "first_change": None, "settled": True},
              {"setting": "d3 calibrated a0.995", "pid": "p1", "first_change": None, "settled": True},
              {"setting": "d3 calibrated a0.995", "pid": "p2", "first_change": 2, "settled": False},
              {"setting": "d3 calibrated a0.995", "pid": "p3", "first_change": 1, "settled": False},
              {"setting": "d3 bottom_up a0.99", "pid": "p0", "first_change": 0, "settled": False}]
    rep = report(recs, forced=forced)
    rows = {r["label"]: r for r in rep["settings"]}
    row = rows["d3 calibrated a0.995"]
    assert row["pending"] == ["p2", "p3"] and not row["complete"]
    assert row["forced"]["same"] == 2 and sorted(row["forced"]["first_changes"], key=str) == [1, 2, None, None]
    assert rows["d3 bottom_up a0.99"]["n"] == 0 and rows["d3 bottom_up a0.99"]["pending"] == ["p0"]
    assert rep["headline"]["1pt"] == {"bounded": None, "point": None}
    text = "\n".join(table(rep))
    assert "2 of 4 answered (2 changed, pending)" in text and "between 1/4 and 3/4 (full 2/4)" in text
    assert "| 2/4 |" in text  # the same code as full depth, from the passes
    fig = figure(rep, "toy")
    assert not [t for t in fig.data if t.type == "scatter"]  # no frontier point for a pending setting
    assert any(t.type == "histogram" and "2 of 4 changed" in t.name for t in fig.data)


def test_a_setting_run_on_the_first_n_problems_is_read_on_those_only(tmp_path, monkeypatch) -> None:
    """A run script's LABEL@N runs a setting on the first N problems of the seeded shuffle: its row pairs it with
    full depth on those, a pass or record outside them (from an earlier plan) neither counts nor leaves it pending."""
    from d3.research import realwork_report as rr

    script = tmp_path / "run.sh"
    script.write_text('SETTINGS="d3 calibrated a0.998@all|d3 calibrated a0.99@2"\nSETTINGS+=";unified 0.7@60"\n')
    monkeypatch.setitem(rr.RUN_SCRIPTS, "toy", script)
    assert rr.planned_stages("toy") == {"d3 calibrated a0.998": None, "d3 calibrated a0.99": 2, "unified 0.7": 60}
    assert rr.planned_settings("toy") == ["d3 calibrated a0.998", "d3 calibrated a0.99", "unified 0.7"]
    recs = [_rec("full", f"p{i}", True, [1, 2, 3, 4]) for i in range(4)]
    recs += [_rec("d3 calibrated a0.99", "p0", False, [1, 9], 20), _rec("d3 calibrated a0.99", "p3", True, [1, 2, 3, 4], 20)]
    forced = [{"setting": "d3 calibrated a0.99", "pid": p, "first_change": 1, "settled": False} for p in ("p0", "p1", "p3")]
    unscoped = {r["label"]: r for r in rr.report(recs, forced=forced)["settings"]}["d3 calibrated a0.99"]
    assert unscoped["pending"] == ["p1"] and unscoped["n"] == 2
    row = {r["label"]: r for r in rr.report(recs, forced=forced, scopes={"d3 calibrated a0.99": {"p0", "p2"}})[
        "settings"]}["d3 calibrated a0.99"]
    assert row["n"] == 1 and row["pending"] == [] and row["complete"] and (row["diff"]["lost"], row["diff"]["won"]) == (1, 0)
