"""Calibrated orders as data: a cached calibration is checked as it is read; a bad file is skipped and named."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest

from d3.config import D3Config
from d3.orders import CALIBRATION_ENV, Calibration, cached, calibration_path, read_calibration, resolve

GOOD = Calibration(model="m", num_layers=8, signal="agreement", calibration_set="prompts:t", core=(1, 1),
                   order=(4, 2, 6, 1, 5, 3), single={1: 0.5, 2: 0.8, 3: 0.4, 4: 1.0, 5: 0.6, 6: 0.7},
                   curve=(1.0, 0.9), full=1.0, tokens=8, steps=2)
BAD = {  # file stem -> (what is stored, what the log says about it)
    "duplicated": ({**GOOD.to_dict(), "order": [4, 4, 6, 1, 5, 3]}, r"repeated \[4\]"),
    "short": ({**GOOD.to_dict(), "order": [4, 2, 6]}, r"missing \[1, 3, 5\]"),
    "out_of_range": ({**GOOD.to_dict(), "order": [4, 2, 6, 1, 5, 99]}, r"not flex layers \[99\]"),
    "nan": ({**GOOD.to_dict(), "single": {**GOOD.to_dict()["single"], "2": float("nan")}}, r"single holds 'nan'"),
    "nan_curve": ({**GOOD.to_dict(), "curve": [1.0, float("nan")]}, r"curve holds 'nan'"),
    "list": ([1, 2, 3], r"a JSON object, not list"),
    "single_null": ({**GOOD.to_dict(), "single": None}, r"single is NoneType"),
    "no_order": ({k: v for k, v in GOOD.to_dict().items() if k != "order"}, r"order"),
    "signal": ({**GOOD.to_dict(), "signal": "nonexistent"}, r"signal 'nonexistent'"),
}


@pytest.fixture()
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv(CALIBRATION_ENV, str(tmp_path))
    good = calibration_path("m", "agreement", "prompts:t", (1, 1), 8, 2)
    good.parent.mkdir(parents=True)
    good.write_text(json.dumps(GOOD.to_dict()))
    return good.parent


def test_a_calibration_survives_its_round_trip(folder) -> None:
    assert read_calibration(next(folder.glob("*.json"))) == GOOD


@pytest.mark.parametrize("stem", list(BAD))
def test_a_bad_cached_calibration_is_skipped_and_named(folder, caplog, stem) -> None:
    stored, why = BAD[stem]
    (folder / f"{stem}.json").write_text(json.dumps(stored))  # newer than the good one: read first
    with pytest.raises(ValueError, match=why) as err:
        read_calibration(folder / f"{stem}.json")
    assert f"{stem}.json" in str(err.value) and "\n" not in str(err.value)
    with caplog.at_level(logging.WARNING, logger="d3.orders"):
        assert cached("m") == [GOOD]
    assert f"{stem}.json" in caplog.text
    engine = SimpleNamespace(name="m", num_layers=8)
    named = D3Config(drop_order="calibrated", layer_order="agreement", core_head=1, core_tail=1)
    assert resolve(named, engine).layer_order == GOOD.order  # the bad file hides nothing


def test_a_stray_json_file_breaks_no_named_lookup(folder, caplog) -> None:
    (folder / "notes.json").write_text("{not json")
    (folder / "empty.json").write_text("")
    engine = SimpleNamespace(name="m", num_layers=8)
    named = D3Config(drop_order="calibrated", layer_order="agreement@prompts:t", core_head=1, core_tail=1)
    with caplog.at_level(logging.WARNING, logger="d3.orders"):
        assert resolve(named, engine).layer_order == GOOD.order
    assert "notes.json" in caplog.text and "empty.json" in caplog.text


def test_an_unknown_order_name_suggests_real_signals(folder) -> None:
    engine = SimpleNamespace(name="m", num_layers=8)
    with pytest.raises(ValueError) as err:
        resolve(D3Config(drop_order="calibrated", layer_order="nonexistent", core_head=1, core_tail=1), engine)
    message = str(err.value)
    assert "--signal nonexistent" not in message
    assert "agreement, perplexity, task" in message and "agreement@prompts:t" in message
