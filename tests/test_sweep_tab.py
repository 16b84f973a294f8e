"""The Sweep tab's handlers called directly (no server): a small bounded sweep, loading a row, CSV export."""

from __future__ import annotations

import json
import re
from pathlib import Path

import gradio as gr
import numpy as np
import pandas as pd
import pytest

import app
from d3.research.sweep.grid import d3_for_depth, planned_mean_layers
from explorer import export, sweep_tab
from explorer.caps import Caps
from explorer.pool import ModelPool
from explorer.sweep_tab import SWEEP_MAX_SETTINGS, sweep_spec
from tests.apphelpers import tiny_factory

pytestmark = [pytest.mark.usefixtures("exports_in_tmp"), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

ROOT = Path(__file__).resolve().parent.parent
REQUEST = dict(model="tiny", chat_template=True, sweep_prompts="hello there", sweep_settings=["d3_75", "d3_67", "skipdecode_67", "unified_67"],
               sweep_tokens=6)
OUT = {name: i for i, name in enumerate(sweep_tab.SWEEP_OUTPUTS)}
LOAD = {name: i for i, name in enumerate(sweep_tab.SWEEP_LOAD_OUTPUTS)}


@pytest.fixture(scope="module")
def pool(tiny_engine) -> ModelPool:
    return ModelPool(tiny_factory(tiny_engine), names=("tiny",), caps=Caps(max_new_tokens=64))


@pytest.fixture(scope="module")
def swept(pool) -> tuple:
    reports = []
    out = sweep_tab.run_sweep(pool, **REQUEST, progress=lambda fraction, desc=None: reports.append((fraction, desc)))
    return out, reports


def _select(index: int) -> gr.SelectData:
    return gr.SelectData(None, {"index": [index, 0], "value": None, "row_value": [], "col_value": []})


def test_sweep_gives_one_row_per_setting_and_a_matching_pareto_view(swept) -> None:
    out, reports = swept
    results, table, figure = out[OUT["sweep_results"]], out[OUT["sweep_table"]], out[OUT["sweep_pareto"]]
    assert len(results) == len(table) == 1 + len(REQUEST["sweep_settings"])  # the full-depth reference + each setting
    assert list(table.columns) == sweep_tab.SWEEP_TABLE_COLUMNS
    assert table["strategy"].tolist() == ["full", "d3", "d3", "skipdecode", "unified"]
    assert table["setting"].tolist() == results["label"].tolist()
    points = [t for t in figure.data if (t.meta or {}).get("role") == "points"]
    xs = np.concatenate([np.asarray(t.x, dtype=float) for t in points])
    ys = np.concatenate([np.asarray(t.y, dtype=float) for t in points])
    assert sorted(zip(xs, ys)) == sorted(zip(results["measured_speedup"], results["agreement"]))
    assert reports and reports[-1][0] == 1.0  # the progress bar reached the end
    assert "Click a point or a row" in out[OUT["sweep_note"]]


def test_two_prompts_give_agreement_its_paired_interval_in_the_table_and_as_error_bars(pool) -> None:
    """Two prompts: each row's agreement with its 95% interval over prompts, in the table and on the plot; one
    prompt (the module's sweep) says why it has none."""
    request = {**REQUEST, "sweep_prompts": "hello there\nthe sky is", "sweep_settings": ["d3_67"]}
    out = sweep_tab.run_sweep(pool, **request, progress=lambda fraction, desc=None: None)
    table, figure, note = out[OUT["sweep_table"]], out[OUT["sweep_pareto"]], out[OUT["sweep_note"]]
    assert (table["agreement 95% low"] <= table["agreement"]).all() and (table["agreement"] <= table["agreement 95% high"]).all()
    assert table.loc[table["strategy"] == "full", ["agreement 95% low", "agreement 95% high"]].values.tolist() == [[1.0, 1.0]]
    bars = {}
    for t in figure.data:
        if (t.meta or {}).get("role") == "points":
            for y, up, down in zip(t.y, t.error_y.array, t.error_y.arrayminus):
                bars[round(float(y), 4)] = (round(float(y) - down, 4), round(float(y) + up, 4))
    for row in table.to_dict("records"):
        assert bars[round(row["agreement"], 4)] == (round(row["agreement 95% low"], 4), round(row["agreement 95% high"], 4))
    assert "95% interval (paired bootstrap over the 2 prompts" in note


def test_one_prompt_says_agreement_has_no_interval(swept) -> None:
    out, _ = swept
    assert out[OUT["sweep_table"]]["agreement 95% low"].isna().all()
    assert "on one prompt: no interval" in out[OUT["sweep_note"]]


@pytest.mark.parametrize("index", [1, 2, 3, 4])
def test_selecting_a_row_loads_its_params_into_the_controls(swept, index) -> None:
    results = swept[0][OUT["sweep_results"]]
    row = results.iloc[index]
    params = json.loads(row["params"])
    values = sweep_tab.load_sweep_setting(results, _select(index))
    assert values[LOAD["strategy"]] == params["strategy"] and values[LOAD["fill"]] == params["fill"]
    assert values[LOAD["max_new_tokens"]] == REQUEST["sweep_tokens"]
    if params["strategy"] == "d3":
        assert values[LOAD["alpha"]] == params["alpha"]
        for name in ("start", "drop_order"):
            assert values[LOAD[name]] == params[name]
        for name in ("core_head", "core_tail"):
            assert params[name] is None or values[LOAD[name]] == params[name]
    elif params["strategy"] == "skipdecode":
        assert values[LOAD["skipdecode_max"]] >= values[LOAD["skipdecode_min"]] >= 1
        assert params["max_layers"] is None or values[LOAD["skipdecode_max"]] == params["max_layers"]
        assert params["min_layers"] is None or values[LOAD["skipdecode_min"]] == params["min_layers"]
    else:
        assert values[LOAD["unified_ratio"]] == params["ratio"]
    assert row["label"] in values[LOAD["sweep_note"]]


def test_a_row_outside_the_pages_alpha_range_is_not_loaded_and_says_why(pool, swept) -> None:
    """A tuned α below the page's α range (explorer.controls.PAGE_RANGES) would load into a slider that the next
    move of any control then refuses: the row is not loaded, and the note says the range and where to run it."""
    from explorer.controls import DEFAULTS, check_sliders

    results = swept[0][OUT["sweep_results"]].copy()
    index = next(i for i, p in enumerate(results["params"]) if json.loads(p)["strategy"] == "d3")
    params = {**json.loads(results.loc[index, "params"]), "alpha": 0.62}
    results.loc[index, "params"] = json.dumps(params)
    values = sweep_tab.load_sweep_setting(results, _select(index))
    assert "outside the page's range" in values[LOAD["sweep_note"]] and "python -m d3 generate" in values[LOAD["sweep_note"]]
    assert values[LOAD["alpha"]] == gr.skip()  # the controls keep what they held
    with pytest.raises(ValueError, match="out of range"):  # what the page would have said at the next move
        check_sliders(DEFAULTS.with_(alpha=0.62), 4, pool.caps)


def test_selecting_the_full_depth_row_or_nothing_says_why_in_the_note(swept) -> None:
    """Out of the queue an error would be an HTTP 500 the page never shows: the note under the plot says it."""
    results = swept[0][OUT["sweep_results"]]
    full = sweep_tab.load_sweep_setting(results, _select(0))
    assert "full-depth reference" in full[LOAD["sweep_note"]]
    assert all(v is gr.skip() or type(v) is type(gr.skip()) for k, v in enumerate(full) if k != LOAD["sweep_note"])
    assert "No sweep results" in sweep_tab.load_sweep_setting(None, _select(0))[LOAD["sweep_note"]]


@pytest.mark.parametrize("event", [gr.EventData(None, None), None], ids=["no-data", "no-event"])
def test_a_row_load_with_no_select_event_says_so(swept, event) -> None:
    """Through the API the table's select handler gets no event data: Gradio builds the handler's event argument
    from none (gr.SelectData raised TypeError there, and the caller got {"error": null}); the note says what to do."""
    from gradio.helpers import special_args

    results = swept[0][OUT["sweep_results"]]
    inputs, _, _, _ = special_args(sweep_tab.load_sweep_setting, [results], event_data=event)
    out = sweep_tab.load_sweep_setting(*inputs)
    assert out[LOAD["sweep_note"]] == "Click a row of the sweep's table to load its setting."
    assert all(type(v) is type(gr.skip()) for k, v in enumerate(out) if k != LOAD["sweep_note"])


def test_clicking_a_pareto_point_loads_the_row_it_was_drawn_from(swept) -> None:
    results, figure = swept[0][OUT["sweep_results"]], swept[0][OUT["sweep_pareto"]]
    points = [t for t in figure.data if (t.meta or {}).get("role") == "points"]
    drawn = sorted(int(i) for t in points for i in t.customdata)
    assert drawn == list(range(len(results)))  # every row is exactly one point
    for trace in points:
        for i, x in zip(trace.customdata, trace.x):
            assert x == results.iloc[int(i)]["measured_speedup"]
            if int(i) == 0:
                continue  # the full-depth reference loads nothing (tested below)
            by_point = sweep_tab.load_sweep_point(results, f"{int(i)}@1732350000000")
            by_row = sweep_tab.load_sweep_setting(results, _select(int(i)))
            assert [v for k, v in enumerate(by_point) if k != LOAD["modes"]] == \
                [v for k, v in enumerate(by_row) if k != LOAD["modes"]]
            assert "Loaded from the sweep" in by_point[LOAD["status"]]
            assert by_point[LOAD["modes"]].selected == "live"  # and the page goes to the Live tab


@pytest.mark.parametrize("value", ["", "@5", "x@1", "-1@2", "99@1", "1.5"])
def test_a_bad_point_value_is_a_clear_message(swept, value) -> None:
    note = sweep_tab.load_sweep_point(swept[0][OUT["sweep_results"]], value)[LOAD["sweep_note"]]
    assert "not in the sweep's results" in note


def test_export_writes_a_csv_with_the_same_rows(swept) -> None:
    results = swept[0][OUT["sweep_results"]]
    path = export.export_sweep(results)
    assert path.endswith(".csv") and str(export.EXPORT_ROOT) in path
    back = pd.read_csv(path)
    assert len(back) == len(results) and back["label"].tolist() == results["label"].tolist()
    assert np.allclose(back["measured_speedup"], results["measured_speedup"])
    with pytest.raises(gr.Error, match="Nothing to export"):
        export.export_sweep(None)


@pytest.mark.parametrize("overrides, message", [
    ({"sweep_prompts": ""}, "Prompt is empty"),
    ({"sweep_prompts": " \n \n"}, "Prompt is empty"),
    ({"sweep_prompts": "a\nb\nc"}, "at most 2"),
    ({"sweep_settings": []}, "no settings chosen"),
    ({"sweep_settings": ["d3_85", "magic"]}, "setting must be one of"),
    ({"sweep_settings": list(sweep_tab.SWEEP_MENU)}, f"at most {SWEEP_MAX_SETTINGS}"),
    ({"sweep_tokens": 500}, r"New tokens per run \(sweep_tokens\) must be an integer in \[2, 24\]"),
    ({"model": "no-such-model"}, "unknown model|not allowed"),
])
def test_bad_sweep_requests_are_clear_gr_errors(pool, overrides, message) -> None:
    with pytest.raises(gr.Error, match=message):
        sweep_tab.run_sweep(pool, **{**REQUEST, **overrides}, progress=lambda *a, **k: None)


def test_every_sweep_event_is_named() -> None:
    fns = app.demo.fns.values() if isinstance(app.demo.fns, dict) else app.demo.fns
    names = {fn.api_name for fn in fns if fn.fn is not None}
    assert {"run_sweep", "load_sweep_setting", "load_sweep_point", "export_sweep"} <= names


def _stop_at_setting(number: int):
    """A progress callback and a should_stop that raises OutOfTime once the sweep starts its `number`-th row (D3's
    come first, full depth timed against itself last): deterministic, so no test waits on a clock."""
    state = {"started": 0}

    def progress(fraction, desc=None):
        if desc and f"row {number} of 5" in desc:
            state["started"] = number

    def should_stop() -> bool:
        if state["started"] >= number:
            raise sweep_tab.OutOfTime("the sweep reached its time limit of 7 s")
        return False
    return progress, should_stop


def test_a_sweep_stopped_at_its_time_limit_keeps_and_draws_the_rows_it_finished(tiny_engine, pool) -> None:
    spec = sweep_tab.sweep_spec("tiny", "hello there", REQUEST["sweep_settings"], 4, True, pool.caps)
    progress, should_stop = _stop_at_setting(3)
    df = sweep_tab.run_small_sweep(tiny_engine, spec, progress=progress, should_stop=should_stop)
    assert df.attrs["stopped"] == "the sweep reached its time limit of 7 s"
    # the reference runs (on top, not yet timed against themselves) and D3's two rows, nothing half-measured
    assert df["strategy"].tolist() == ["full", "d3", "d3"] and df["timing_pairs"].tolist()[0] == 0
    out = sweep_tab.sweep_outputs(df, spec, limit=7)
    note = out["sweep_note"]
    assert "Stopped: the sweep reached its time limit of 7 s" in note
    assert "Measured 2 of 5 rows within the 7 s limit (2 D3 and full depth's reference runs" in note
    assert "not timed against itself" in note and "read 1.00×" not in note
    assert out["sweep_table"]["setting"].tolist() == df["label"].tolist()
    points = [t for t in out["sweep_pareto"].data if (t.meta or {}).get("role") == "points"]
    assert sorted(int(i) for t in points for i in t.customdata) == [0, 1, 2]  # every row shown is drawn


def test_a_sweep_draws_a_table_after_each_row_and_keeps_them_when_its_limit_passes_after_the_second(
        tiny_engine, pool) -> None:
    """Issue 35, M4 and issue 44, M4: the reference runs first, then each setting as it is measured, D3's first;
    the limit keeps what was drawn."""
    spec = sweep_tab.sweep_spec("tiny", "hello there", REQUEST["sweep_settings"], 4, True, pool.caps)
    progress, should_stop = _stop_at_setting(3)
    tables = list(sweep_tab.iter_small_sweep(tiny_engine, spec, progress=progress, should_stop=should_stop))
    assert [len(t) for t in tables] == [1, 2, 3, 3]
    assert tables[0]["strategy"].tolist() == ["full"] and not tables[0].attrs.get("stopped")
    assert tables[-1]["strategy"].tolist() == ["full", "d3", "d3"] and "time limit" in tables[-1].attrs["stopped"]


def test_the_sweep_handler_yields_the_table_and_plot_after_each_row(pool) -> None:
    request = dict(REQUEST, sweep_settings=["d3_75", "unified_67"])
    outs = list(sweep_tab.stream_sweep(pool, **request, progress=lambda *a, **k: None))
    tables = [o[OUT["sweep_table"]] for o in outs]
    # the reference runs, each setting as it comes, full depth timed against itself (same row), then the end
    assert [len(t) for t in tables] == [1, 2, 3, 3, 3]
    assert tables[0]["strategy"].tolist() == ["full"]
    for done, (out, table) in enumerate(zip(outs[:-1], tables[:-1])):
        assert f"Measured {done} of 3 rows so far" in out[OUT["sweep_note"]]
        points = [t for t in out[OUT["sweep_pareto"]].data if (t.meta or {}).get("role") == "points"]
        assert sorted(int(i) for t in points for i in t.customdata) == list(range(len(table)))
    assert "Measured 3 of 3 rows within the 60 s limit" in outs[-1][OUT["sweep_note"]]
    assert tables[-1]["setting"].tolist() == outs[-1][OUT["sweep_results"]]["label"].tolist()


def test_a_sweep_out_of_time_before_its_reference_says_so_plainly(tiny_engine) -> None:
    pool = ModelPool(tiny_factory(tiny_engine), names=("tiny",), caps=Caps(max_new_tokens=64, max_run_s=0))
    out = sweep_tab.run_sweep(pool, **REQUEST, progress=lambda *a, **k: None)
    note = out[OUT["sweep_note"]]
    assert "Stopped: the sweep reached its time limit of 0 s" in note and "nothing to show" in note
    assert out[OUT["sweep_results"]].empty and out[OUT["sweep_pareto"]] is None


def test_the_sweep_limit_is_the_tabs_own_or_the_servers_if_lower() -> None:
    assert sweep_tab.sweep_time_limit(Caps(max_run_s=600)) == sweep_tab.SWEEP_MAX_S
    assert sweep_tab.sweep_time_limit(Caps(max_run_s=5)) == 5
    assert f"stops after {sweep_tab.SWEEP_MAX_S} s" in sweep_tab.sweep_bounds_text()


def test_full_depth_reads_one_against_itself_and_keeps_its_own_timing_as_noise(swept) -> None:
    results = swept[0][OUT["sweep_results"]]
    full = results[results["strategy"] == "full"].iloc[0]
    assert full["measured_speedup"] == 1.0 and full["decode_speedup"] == 1.0
    assert np.isfinite(full["self_speedup"]) and full["measured_speedup_min"] <= full["self_speedup"] <= full["measured_speedup_max"]
    others = results[results["strategy"] != "full"]
    assert others["self_speedup"].isna().all() and (others["timing_pairs"] == sweep_tab.SWEEP_REPEATS).all()
    assert f"read {full['self_speedup']:.2f}×" in swept[0][OUT["sweep_note"]]


def test_the_small_wording_says_what_happens() -> None:
    from explorer.sweep_tab import SWEEP_REPEATS, sweep_bounds_text
    from explorer.views.scrub import PAUSE, PLAY
    from explorer.wording import SWEEP_EXPLAIN

    assert f"{SWEEP_REPEATS} timing pairs" in sweep_bounds_text() and "1 repeat" not in sweep_bounds_text()
    assert "one repeat" not in SWEEP_EXPLAIN and "3 pairs" in SWEEP_EXPLAIN
    assert all(ord(ch) < 0x2000 for ch in PLAY + PAUSE)  # no glyph that needs an emoji font


@pytest.mark.parametrize("tokens", [2, 3, 4, 6, 16, 24])
def test_the_sweep_tabs_67_percent_setting_runs_at_67_percent(tokens) -> None:
    spec = sweep_spec("tiny", "a prompt", ["d3_67"], tokens, False, Caps())
    cfg = d3_for_depth(spec.depths[0], 30, tokens)
    assert planned_mean_layers(cfg, 30, tokens) / 30 == pytest.approx(2 / 3, abs=0.04)


def test_the_sweep_tab_times_full_depth_as_1x_after_a_warm_up_and_reports_progress_often(tiny_engine) -> None:
    from explorer.sweep_tab import SWEEP_OUTPUTS, run_sweep

    calls: list[tuple[float, str]] = []
    pool = ModelPool(lambda name: tiny_engine, names=("tiny",))
    out = dict(zip(SWEEP_OUTPUTS, run_sweep(pool, "tiny", False, "hello there", ["d3_75", "unified_67"], 6,
                                            progress=lambda f, desc=None: calls.append((f, desc)))))
    df = out["sweep_results"]
    assert df.loc[df["strategy"] == "full", "measured_speedup"].tolist() == [1.0]  # the unit, not a timing artefact
    assert df["timing_pairs"].min() >= 3  # several pairs per row, not one
    assert "timed against itself read" in out["sweep_note"]
    assert out["sweep_file"] is None  # the previous sweep's CSV download is withdrawn
    fractions = [f for f, _ in calls]
    assert fractions == sorted(fractions) and len(set(fractions)) >= 10  # the bar moves run by run
    assert any(0 < f < 1 / 3 for f in fractions)  # ... from the first runs on, not only once a row is done


def test_the_table_reads_as_words_and_says_when_a_speedup_exceeds_theory_or_is_noise() -> None:
    """Issue 35, M4: the headers were code names (`theoretical_speedup`, `kl_teacher`, `params`), and a small sweep
    plotted 3.90× measured against 1.5× theoretical with no warning."""
    import pandas as pd

    df = pd.DataFrame([
        dict(label="full depth", strategy="full", theoretical_speedup=1.0, measured_speedup=1.12, self_speedup=1.12),
        dict(label="d3 a", strategy="d3", theoretical_speedup=1.5, measured_speedup=3.9),
        dict(label="d3 b", strategy="d3", theoretical_speedup=1.5, measured_speedup=1.05),
        dict(label="unified", strategy="unified", theoretical_speedup=1.5, measured_speedup=1.4)])
    spec = sweep_tab.sweep_spec("tiny", "hello there", ["d3_67", "unified_67"], 4, True, Caps())
    table = sweep_tab.sweep_outputs(df, spec)["sweep_table"]
    assert not [c for c in table.columns if "_" in c], list(table.columns)
    speed = dict(zip(table["setting"], table["speed, read how"]))
    assert "above its theoretical 1.50×" in speed["d3 a"] and "within timing noise" in speed["d3 b"]
    assert speed["unified"] == "" and "unit" in speed["full depth"]


def test_the_progress_says_what_is_being_measured_never_a_count_that_reads_as_done(swept) -> None:
    """Issue 35, M4: the bar showed "full-depth reference 1/1" though the sweep then stopped before the reference was
    measured."""
    _, reports = swept
    said = [d for _, d in reports if d]
    assert any(d.startswith("Measuring the full-depth reference: prompt 1 of 1") for d in said), said
    assert not [d for d in said if re.search(r"\d+/\d+\)?$", d)], said
    assert sweep_tab.progress_words("d3 α=0.9 (2/5)") == "Measuring d3 α=0.9: row 2 of 5 (rows done: 1)…"


def test_the_default_sweeps_plan_measures_d3_first_within_the_measured_budget(tiny_engine) -> None:
    """Issue 44, M4: the default sweep ended at its 60 s limit with only the full-depth row on a busy 2-core CPU. Its
    rows now come D3 first (full depth's own timing pairs, the noise, last), and the default settings and tokens are
    the ones scripts/sweep_budget.py chose from its measurement beside another visitor's run
    (results/sweep_budget/smollm2-135m.json, docs/speed.md): D3's rows done soonest, and drawn within the limit when
    the tab's handler ran it there."""
    from d3.config import FullConfig

    spec = sweep_spec("tiny", sweep_tab.SWEEP_PROMPT, list(sweep_tab.SWEEP_DEFAULT), sweep_tab.SWEEP_DEFAULT_TOKENS,
                      True, Caps())
    plan = sweep_tab.planned_settings(spec, tiny_engine)
    kinds = [type(s.config).__name__ for s in plan]
    assert kinds[0] == "D3Config" and isinstance(plan[-1].config, FullConfig), kinds
    d3 = [i for i, k in enumerate(kinds) if k == "D3Config"]
    assert d3 == list(range(len(d3)))  # every D3 row before any other
    # the runs before the first D3 row is done: the reference runs and that row's own, never full depth's pairs
    assert sweep_tab.runs_until_rows(spec)[0] == sweep_tab.reference_runs(spec) + sweep_tab.runs_per_row(spec)
    measured = json.loads((ROOT / "results" / "sweep_budget" / "smollm2-135m.json").read_text(encoding="utf-8"))
    chosen = measured["chosen"]
    assert (tuple(chosen["settings"]), chosen["tokens"]) == (sweep_tab.SWEEP_DEFAULT, sweep_tab.SWEEP_DEFAULT_TOKENS)
    soonest = min(p["d3_done_s"] for p in measured["predictions"])
    assert round(chosen["d3_done_s"]) == round(soonest)  # no candidate's D3 rows were predicted done sooner
    verified = measured["verify"]  # the tab's handler on the default, with its limit, beside the other run
    assert "d3" in verified["strategies"] and verified["measured"] >= 1
    assert f"Measured {verified['measured']} of {verified['planned']} rows within the 60 s limit" in verified["note"]


def test_the_default_sweeps_note_names_how_many_rows_it_measured(pool) -> None:
    """Issue 44, M4: the page says how many of the planned rows the sweep measured within its limit."""
    request = dict(REQUEST, sweep_settings=list(sweep_tab.SWEEP_DEFAULT), sweep_tokens=4)
    outs = list(sweep_tab.stream_sweep(pool, **request, progress=lambda *a, **k: None))
    planned = len(sweep_tab.SWEEP_DEFAULT) + 1
    note = outs[-1][OUT["sweep_note"]]
    assert f"Measured {planned} of {planned} rows within the {sweep_tab.SWEEP_MAX_S} s limit" in note, note
    assert outs[1][OUT["sweep_table"]]["strategy"].tolist() == ["full", "d3"]  # D3's row is the first measured
