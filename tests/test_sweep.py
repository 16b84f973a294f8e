"""Sweep: the table's columns and types, matched depths, resume without duplicates, tasks, progress."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from d3.cli import sweep as sweep_cli
from d3.config import D3Config, FullConfig, UnifiedConfig
from d3.engine import Engine
from d3.research.sweep import COLUMNS, Setting, SweepSpec, grid, measure, run, setting_key, table, tasks
from d3.schedule import planned_mean_layers

SMALL = SweepSpec(prompts=("hello there", "the sky is"), max_new_tokens=3, repeats=1, depths=(0.5,),
                  starts=(0, 2), baselines=("skipdecode", "unified", "early_exit"), ppl_chunks=1, ppl_prefix=4)


@pytest.fixture(scope="module")
def swept(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame, list[tuple[float, str]]]:
    out = tmp_path_factory.mktemp("sweep") / "small.csv"
    calls: list[tuple[float, str]] = []
    df = run.run_sweep(SMALL, out, engine=engine, progress=lambda f, d: calls.append((f, d)))
    return out, df, calls


# ---------------------------------------------------------------- the table


def test_table_has_every_column_with_its_type(swept) -> None:
    out, df, _ = swept
    assert tuple(df.columns) == COLUMNS
    assert tuple(pd.read_csv(out).columns) == COLUMNS
    for c in table.FLOAT_COLUMNS:
        assert df[c].dtype == np.float64, c
    for c in table.INT_COLUMNS:
        assert df[c].dtype == np.int64, c
    for c in ("key", "strategy", "label", "params"):
        assert all(isinstance(x, str) and x for x in df[c]), c


def test_rows_cover_the_grid_and_full_depth_is_the_reference(swept, engine: Engine) -> None:
    _, df, _ = swept
    assert list(df["strategy"]).count("full") == 1
    assert {"d3", "skipdecode", "unified", "early_exit"} <= set(df["strategy"])
    assert df["key"].is_unique
    full = df[df["strategy"] == "full"].iloc[0]
    assert full["mean_layers"] == engine.num_layers and full["agreement"] == 1 and full["ppl_ratio"] == 1
    assert full["first_divergence"] == SMALL.max_new_tokens
    assert (df["measured_speedup"] > 0).all() and (df["timing_pairs"] == len(SMALL.prompts) * SMALL.repeats).all()
    assert ((df["agreement"] >= 0) & (df["agreement"] <= 1)).all()
    assert (df["kl_teacher"] >= 0).all() and (df["kl_free"] >= 0).all()
    np.testing.assert_allclose(df["fixed_cost_layers"], engine.fixed_cost_layers)
    # every params string rebuilds its config
    for _, row in df.iterrows():
        from d3.config import strategy_from_dict
        assert strategy_from_dict(json.loads(row["params"])).name == row["strategy"]


def test_theoretical_speedups_follow_mean_layers(swept, engine: Engine) -> None:
    _, df, _ = swept
    L, fixed = engine.num_layers, engine.fixed_cost_layers
    depth = df["planned_mean_layers"].fillna(df["mean_layers"])
    np.testing.assert_allclose(df["theoretical_speedup"], L / depth)
    np.testing.assert_allclose(df["theoretical_speedup_fixed"], (L + fixed) / (depth + fixed))
    assert (df["theoretical_speedup_fixed"] <= df["theoretical_speedup"] + 1e-12).all()


def test_planned_strategies_run_their_planned_depth(swept) -> None:
    _, df, _ = swept
    planned = df[df["strategy"].isin(["full", "d3", "skipdecode", "unified"])]
    np.testing.assert_allclose(planned["mean_layers"], planned["planned_mean_layers"])


def test_progress_reaches_one_and_never_goes_back(swept) -> None:
    _, _, calls = swept
    fractions = [f for f, _ in calls]
    assert fractions[-1] == 1.0 and fractions == sorted(fractions)
    assert all(isinstance(d, str) and d for _, d in calls)


def test_sidecars_hold_json_and_traces(swept) -> None:
    out, df, _ = swept
    records = json.loads(table.sidecar(out, "json").read_text())
    assert len(records) == len(df)
    lines = [json.loads(x) for x in table.sidecar(out, "traces.jsonl").read_text().splitlines()]
    kinds = [x["kind"] for x in lines]
    assert kinds.count("block") == 1 and kinds.count("layers") == len(df)
    assert {x["key"] for x in lines if x["kind"] == "layers"} == set(df["key"])


# ---------------------------------------------------------------- resume


def test_interrupted_sweep_resumes_without_duplicates(engine: Engine, tmp_path: Path, monkeypatch) -> None:
    spec = SweepSpec(prompts=("hello",), max_new_tokens=2, repeats=1, depths=(0.5, 0.75), baselines=("unified",),
                     ppl_chunks=0)
    out = tmp_path / "r.csv"
    first = run.run_sweep(spec, out, engine=engine, limit=2)  # "interrupted" after two settings
    assert len(first) == 2
    measured: list[str] = []
    real = measure.measure_row

    def counting(engine, spec, setting, refs, key):
        measured.append(key)
        return real(engine, spec, setting, refs, key)

    monkeypatch.setattr(run, "measure_row", counting)
    full = run.run_sweep(spec, out, engine=engine)
    n = len(grid.all_settings(spec, engine))
    assert n > 2 and len(full) == n and full["key"].is_unique
    assert len(pd.read_csv(out)) == n  # no duplicate rows in the file itself
    assert set(measured) == set(full["key"]) - set(first["key"]) and len(measured) == n - 2
    kept = full.set_index("key").loc[first["key"], "finished_at"]
    assert list(kept) == list(first["finished_at"])  # old rows untouched
    measured.clear()
    again = run.run_sweep(spec, out, engine=engine)
    assert measured == [] and len(again) == n


def test_the_sweep_yields_the_reference_row_first_then_one_row_at_a_time(engine: Engine, tmp_path: Path) -> None:
    """Issue 35, M4: rows are drawn as they come; a sweep stopped after its second row keeps those two rows."""
    spec = SweepSpec(prompts=("hello",), max_new_tokens=2, repeats=1, depths=(0.5, 0.75), baselines=("unified",),
                     ppl_chunks=0)
    out = tmp_path / "rows.csv"
    sizes, strategies = [], []
    for rows in run.iter_sweep(spec, out, engine=engine):
        sizes.append(len(rows))
        strategies.append(rows["strategy"].tolist())
        if len(rows) == 2:  # the caller's limit passes after the second row
            break
    assert sizes == [1, 2] and strategies[0] == ["full"] and strategies[1][0] == "full"
    kept = pd.read_csv(out)
    assert kept["strategy"].tolist() == strategies[1]  # both rows are in the file, nothing half-measured
    assert len(run.run_sweep(spec, out, engine=engine)) == len(grid.all_settings(spec, engine))  # and it resumes


def test_keys_are_stable_and_depend_on_the_prompt_set() -> None:
    setting = Setting("x", D3Config(alpha=0.9), 0.5)
    a = setting_key(SMALL, "tiny", setting)
    assert a == setting_key(SweepSpec(**{**SMALL.__dict__}), "tiny", setting)
    assert a != setting_key(SweepSpec(**{**SMALL.__dict__, "prompts": ("other",)}), "tiny", setting)
    assert a != setting_key(SMALL, "tiny", Setting("x", D3Config(alpha=0.91), 0.5))
    assert a != setting_key(SMALL, "other-model", setting)
    # the grid's shape is not part of a row's key: widening the grid keeps finished rows
    assert a == setting_key(SweepSpec(**{**SMALL.__dict__, "depths": (0.5, 0.9)}), "tiny", setting)


# ---------------------------------------------------------------- matching depths (pure)


@pytest.mark.parametrize("depth", [0.5, 2 / 3, 0.8])
def test_baselines_are_matched_to_the_target_depth(depth: float) -> None:
    L, T = 30, 48
    for cfg in (grid.d3_for_depth(depth, L, T), grid.skipdecode_for_depth(depth, L, T), grid.unified_for_depth(depth, L, T)):
        assert abs(planned_mean_layers(cfg, L, T) / L - depth) < 0.06, cfg


def test_exit_layers_and_threshold_calibration() -> None:
    assert grid.exit_layers([0.1, 0.5, 0.9], 4, 10, 0.5) == 5
    assert grid.exit_layers([0.1, 0.2], 4, 10, 0.5) == 10
    profiles = [[0.1 * k for k in range(1, 7)]] * 9  # confidences after layers 4..9 of a 10-layer model
    t = grid.threshold_for_depth(profiles, 4, 10, 0.7)
    mean = (10 + 9 * grid.exit_layers(profiles[0], 4, 10, t)) / 10
    assert abs(mean - 7) <= 1


def test_variants_run_one_at_a_time_and_fills_pair_with_the_strided_order() -> None:
    spec = SweepSpec(depths=(0.5, 0.75), cores=(None, (0, 0)), starts=(0, 8), fills=("copy", "none"),
                     drop_orders=("middle_out", "strided"), max_new_tokens=32)
    got = grid.d3_settings(spec, 12)
    described = {(s.config.core_head, s.config.start, s.config.fill, s.config.drop_order) for s in got}
    assert (None, 0, "copy", "middle_out") in described  # base
    assert {(0, 0, "copy", "middle_out"), (None, 8, "copy", "middle_out"), (None, 0, "copy", "strided"),
            (None, 0, "none", "strided")} <= described
    assert (None, 0, "none", "middle_out") not in described  # identical to copy when sets are nested
    assert len(got) == 2 + 4  # base at two depths; core, start, order, fill (strided) at variants_at
    assert sum(s.target_depth == spec.variants_at for s in got) == 4


def test_spec_rejects_bad_values_naming_the_field() -> None:
    with pytest.raises(ValueError, match="depths"):
        SweepSpec(depths=(1.5,))
    with pytest.raises(ValueError, match="fills"):
        SweepSpec(fills=("glue",))
    with pytest.raises(ValueError, match="baselines"):
        SweepSpec(baselines=("magic",))
    with pytest.raises(ValueError, match="prompts"):
        SweepSpec(prompts=())


def test_cli_parsing_builds_the_spec() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    sweep_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["sweep", "--prompts", "2", "--depths", "0.8,2/3", "--cores", "default,0+0",
                              "--starts", "0,16", "--tasks", "hyperbaton", "--baselines", "unified"])
    spec = sweep_cli.spec_from_args(args)
    assert spec.depths == (0.8, 2 / 3) and spec.cores == (None, (0, 0)) and spec.starts == (0, 16)
    assert len(spec.prompts) == 2 and spec.tasks == ("hyperbaton",) and spec.baselines == ("unified",)


# ---------------------------------------------------------------- tasks


def _fake_tasks(root: Path) -> None:
    mc = {"task_prefix": "", "examples": [
        {"input": "is a ball round", "target_scores": {"yes": 1, "no": 0}},
        {"input": "is ice hot", "target_scores": {"yes": 0, "no": 1}},
        {"input": "pick the long one", "target_scores": {"a bb ccc": 1, "d": 0}}]}
    exact = {"examples": [{"input": "one plus one", "target": ["2", "two"]}, {"input": "count a b c", "target": "3"}]}
    for path, data in (("hyperbaton", mc), ("object_counting", exact)):
        f = root / "bigbench" / path / "task.json"
        f.parent.mkdir(parents=True)
        f.write_text(json.dumps(data))


@pytest.mark.parametrize("scoring", ["loglik", "generate"])
def test_task_accuracy_per_task(engine: Engine, tmp_path: Path, monkeypatch, scoring: str) -> None:
    _fake_tasks(tmp_path / "data")
    monkeypatch.setenv("D3_DATA_DIR", str(tmp_path / "data"))
    spec = SweepSpec(tasks=("hyperbaton", "object_counting"), task_limit=5, task_scoring=scoring)
    examples = tasks.load_examples(spec)
    assert [len(examples[t]) for t in spec.tasks] == [3, 2]
    full = tasks.task_accuracy(engine, spec, FullConfig(), examples)
    skip = tasks.task_accuracy(engine, spec, UnifiedConfig(ratio=2.0), examples)
    for acc in (full, skip):
        assert set(acc) == set(spec.tasks)
        assert all(v in (0, 1 / 3, 2 / 3, 1) or v in (0, 0.5, 1) for v in acc.values())
    assert ("log-likelihood" in tasks.scoring_note(spec, examples)) == (scoring == "loglik")


def test_loglik_scoring_sums_only_each_options_own_tokens(engine: Engine) -> None:
    from d3.research.data import Example

    ex = Example("t", "pick", ("a bb ccc", "d"), "d", 1, ("d",))
    # the padded batch must score each option exactly as it scores alone
    from d3.research.data import format_prompt

    prompt = engine.tokenizer(format_prompt(ex, show_choices=False))["input_ids"]
    assert "Options" not in format_prompt(ex, show_choices=False)
    alone = []
    for option in ex.choices:
        ids = engine.tokenizer(" " + option, add_special_tokens=False)["input_ids"]
        from d3.config import TRACE_OFF, GenerationConfig
        t = engine.generate_batch([prompt], FullConfig(), GenerationConfig(max_new_tokens=len(ids), stop_at_eos=False),
                                  TRACE_OFF, forced=[ids])[0]
        alone.append(sum(s.logprob for s in t.steps))
    assert tasks._loglik_correct(engine, FullConfig(), ex, False) == (int(np.argmax(alone)) == 1)


def test_sweep_rows_carry_task_accuracy_and_chance(engine: Engine, tmp_path: Path, monkeypatch) -> None:
    _fake_tasks(tmp_path / "data")
    monkeypatch.setenv("D3_DATA_DIR", str(tmp_path / "data"))
    spec = SweepSpec(prompts=("hi",), max_new_tokens=2, repeats=1, depths=(0.5,), baselines=(), ppl_chunks=0,
                     tasks=("hyperbaton", "object_counting"), task_limit=5)
    df = run.run_sweep(spec, tmp_path / "t.csv", engine=engine)
    assert len(df) == 2 and df["accuracy"].between(0, 1).all() and df["accuracy_full"].nunique() == 1
    full = df[df["strategy"] == "full"].iloc[0]
    assert full["accuracy"] == full["accuracy_full"] and "log-likelihood" in full["task_scoring"]
    per_task = json.loads(df.iloc[1]["task_accuracy"])
    assert set(per_task) == {"hyperbaton", "object_counting"}
    assert per_task["hyperbaton"]["chance"] == pytest.approx(0.5) and per_task["hyperbaton"]["n"] == 3
    assert per_task["object_counting"]["n"] == 2


def test_theoretical_speedup_uses_the_planned_depth_where_the_schedule_is_fixed() -> None:
    # the recorded mean can stop at an EOS while the engine keeps computing: the plan covers every computed step
    got = measure.theoretical_columns(20.0, 26.0, 30, 8.0)
    assert got == {"theoretical_speedup": 1.5, "theoretical_speedup_fixed": pytest.approx(38 / 28)}
    assert measure.theoretical_columns(float("nan"), 24.0, 30, 0.0)["theoretical_speedup"] == 1.25  # early exit


def test_d3_labels_tell_an_alpha_just_below_one_from_full_depth() -> None:
    from d3.config import D3Config

    assert grid.label(D3Config(alpha=0.999999)) == "D3 (α=0.999999)"
    assert grid.label(D3Config(alpha=1.0)) == "D3 (α=1.0000)"
    assert grid.label(D3Config(alpha=0.979184, start=16, fill="none")) == "D3 (α=0.9792, start 16, fill none)"


def test_agreement_carries_its_interval_over_prompts(swept) -> None:
    """Two prompts: every row's agreement sits in its paired-bootstrap interval; full depth's is exactly [1, 1]."""
    _, df, _ = swept
    for row in df.to_dict("records"):
        assert row["agreement_low"] <= row["agreement"] <= row["agreement_high"], row["label"]
    full = df[df["strategy"] == "full"].iloc[0]
    assert (full["agreement_low"], full["agreement_high"]) == (1.0, 1.0)
    assert (df["agreement_high"] - df["agreement_low"] > 0).any()  # a setting whose two prompts agree differently


def test_agreement_interval_by_hand_and_none_from_one_prompt() -> None:
    one = measure.agreement_interval([0.5])
    assert np.isnan(one["agreement_low"]) and np.isnan(one["agreement_high"])
    two = measure.agreement_interval([0.25, 0.75])  # resampling two prompts: the means are 0.25, 0.5 or 0.75
    assert two == pytest.approx({"agreement_low": 0.25, "agreement_high": 0.75})


def test_accuracy_difference_pools_the_tasks_and_pairs_each_question() -> None:
    full = {"a": [True, True, False], "b": [True, False]}
    method = {"a": [True, False, False], "b": [True, True]}  # lost one, won one
    d = measure.accuracy_difference(full, method)
    assert d["diff"] == 0.0 and d["diff_low"] < 0 < d["diff_high"]
    same = measure.accuracy_difference(full, full)
    assert (same["diff"], same["diff_low"], same["diff_high"]) == (0.0, 0.0, 0.0)
    assert np.isnan(measure.accuracy_difference({}, {})["diff"])
