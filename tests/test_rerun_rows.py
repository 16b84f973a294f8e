"""scripts/rerun_rows.py: one strategy's stale rows are measured again and written back in place, nothing else."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd

from d3.cli import build_parser
from d3.cli import sweep as sweep_cli
from d3.engine import Engine
from d3.research.sweep import table

ROOT = Path(__file__).resolve().parent.parent
FLAGS = ["--prompts", "1", "--new-tokens", "2", "--repeats", "1", "--depths", "0.5,0.75",
         "--baselines", "skipdecode,unified", "--ppl-chunks", "0"]


def load_script():
    spec = importlib.util.spec_from_file_location("rerun_rows", ROOT / "scripts" / "rerun_rows.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_stale(out: Path, strategy: str) -> dict[str, str]:
    """Turn `strategy`'s rows into rows of an older setting (new keys, a marker value); returns old -> new key."""
    df = pd.read_csv(out, dtype=str, keep_default_na=False)
    rows = df["strategy"] == strategy
    renamed = {key: f"stale{i:011d}" for i, key in enumerate(df.loc[rows, "key"])}
    df.loc[rows, "key"] = df.loc[rows, "key"].map(renamed)
    df.loc[rows, "agreement"] = "-1.0"
    df.to_csv(out, index=False)
    traces = table.sidecar(out, "traces.jsonl")
    records = [json.loads(line) for line in traces.read_text().splitlines()]
    traces.write_text("".join(json.dumps({**r, "key": renamed.get(r["key"], r["key"])}) + "\n" for r in records))
    return renamed


def test_stale_rows_are_measured_again_in_place(engine: Engine, tmp_path: Path):
    out = tmp_path / "s.csv"
    args = build_parser().parse_args(["sweep", "--out", str(out), *FLAGS])
    assert sweep_cli.main(args, engine=engine) == 0
    before = pd.read_csv(out, dtype=str, keep_default_na=False)
    renamed = make_stale(out, "unified")
    assert len(renamed) == 2

    assert load_script().main(["--strategy", "unified", "--", "--out", str(out), *FLAGS], engine=engine) == 0
    after = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert list(after["label"]) == list(before["label"])  # same rows, same order
    assert list(after["key"]) == list(before["key"])  # the stale rows got the current keys back
    others = after["strategy"] != "unified"
    pd.testing.assert_frame_equal(after[others], before[others])  # untouched, byte for byte
    assert (after.loc[~others, "agreement"] != "-1.0").all()  # measured again
    trace_keys = [json.loads(line)["key"] for line in table.sidecar(out, "traces.jsonl").read_text().splitlines()]
    assert not set(renamed.values()) & set(trace_keys) and set(renamed) <= set(trace_keys)
    assert len(json.loads(table.sidecar(out, "json").read_text())) == len(after)


def test_refuses_when_other_rows_would_be_measured(engine: Engine, tmp_path: Path, capsys):
    out = tmp_path / "s.csv"
    args = build_parser().parse_args(["sweep", "--out", str(out), *FLAGS])
    assert sweep_cli.main(args, engine=engine) == 0
    make_stale(out, "skipdecode")
    frozen = out.read_text()
    assert load_script().main(["--strategy", "unified", "--", "--out", str(out), *FLAGS], engine=engine) == 2
    assert "refusing" in capsys.readouterr().err and out.read_text() == frozen
