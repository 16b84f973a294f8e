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
    summary = tmp_path / "SUMMARY.md"
    summary.write_text("# older results\n")
    write_summary(summary, {"toy": rep})
    write_summary(summary, {"toy": rep})  # replaced, not repeated
    text = summary.read_text()
    assert text.count("D3 on real work") == 1 and text.endswith("# older results\n")
