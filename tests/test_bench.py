"""Bench: runs end to end on a tiny model (numbers are not asserted as timings), ratios from paired times."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from d3.cli import bench as bench_cli
from d3.engine import Engine
from d3.research import bench
from d3.schedule import planned_mean_layers
from tests.tiny import tiny_llama, tiny_tokenizer


def _args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_cli.add_parser(parser.add_subparsers())
    return parser.parse_args(["bench", *extra])


def test_bench_runs_end_to_end_on_a_tiny_model(tmp_path: Path, capsys) -> None:
    engine = Engine(tiny_llama(6), tiny_tokenizer(), "tiny")
    out = tmp_path / "bench.json"
    args = _args("--prompts", "2", "--new-tokens", "4", "--repeats", "1", "--skip-load", "--profile", "always",
                 "--json", str(out))
    assert bench_cli.main(args, engine=engine) == 0
    printed = capsys.readouterr().out
    for check in ("(a) our full depth / model.generate", "(b) D3 speedup", "(c) tracing on / off", "profile for"):
        assert check in printed, check
    res = json.loads(out.read_text())
    assert res["pairs"] == 2 and all(len(v) == 2 for v in res["times"].values())
    assert res["parity_with_hf"] is True  # greedy: our full-depth loop picks the same tokens as model.generate
    assert res["d3_theoretical"] >= res["d3_theoretical_fixed"] > 1
    assert res["d3_efficiency"] == pytest.approx(res["d3_speedup"] / res["d3_theoretical_fixed"])
    assert set(res["ok"]) == {"full_vs_hf", "d3_efficiency", "trace_overhead"}
    assert set(res["profiles"]) == {"full_vs_hf", "d3_efficiency", "trace_overhead"}


def test_parity_stops_at_our_first_eos() -> None:
    assert bench.parity([5, 6, 7, 8], [5, 6, 2, 9], {2}) == {"parity_with_hf": True, "parity_tokens": 2}
    assert bench.parity([5, 6, 7], [5, 4, 7], {2}) == {"parity_with_hf": False, "parity_tokens": 3}


def test_pair_median_is_the_median_of_per_pair_ratios() -> None:
    assert bench.pair_median([2.0, 4.0, 9.0], [1.0, 1.0, 3.0]) == 3.0


def test_d3_setting_uses_about_two_thirds_of_the_layers() -> None:
    cfg = bench.d3_two_thirds(30, 128)
    assert abs(planned_mean_layers(cfg, 30, 128) - 20) < 1


def test_load_time_runs_in_a_subprocess(monkeypatch) -> None:
    calls = []

    class Done:
        stdout = json.dumps({"import_s": 1.0, "load_s": 0.5}) + "\n"

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        return Done()

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    got = bench.load_time("smollm2-135m", repeats=2)
    assert len(calls) == 3 and "load_model('smollm2-135m'" in calls[0][-1]  # warm-up + 2 timed
    assert got == {"load_s": 0.5, "import_plus_load_s": 1.5}
