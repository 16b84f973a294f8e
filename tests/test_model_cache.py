"""Tests for d3.model_cache: stale temp folders are cleaned, damaged conversions are found and redone (fake conversion)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from d3 import model_cache, models
from d3.models import load_model
from tests.tiny import tiny_llama, tiny_tokenizer

KEY = "0123456789abcdef"


class FakeConversion:
    """Stands in for the GGUF conversion: saves a tiny random Llama and counts the calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, gguf: Path, out: Path, name: str) -> None:
        self.calls += 1
        tiny_llama().save_pretrained(str(out))
        tiny_tokenizer().save_pretrained(str(out))


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeConversion:
    """smollm2-135m resolves to a fake GGUF and a fake conversion, cached under tmp_path (never the real cache)."""
    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(b"GGUF")
    conversion = FakeConversion()
    monkeypatch.setenv(model_cache.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(models, "_embedded_file", lambda package, filename: gguf)
    monkeypatch.setattr(models, "_file_key", lambda path: KEY)
    monkeypatch.setattr(models, "_convert", conversion)
    return conversion


def resolve() -> Path:
    return Path(models._resolve_directory("smollm2-135m", allow_paths=False))


def marker(folder: Path) -> dict:
    return json.loads((folder / model_cache.MARKER).read_text())


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def dead_pid() -> int:
    """The id of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_conversion_is_cached_with_a_record_of_the_weights(fake: FakeConversion):
    folder = resolve()
    assert resolve() == folder and fake.calls == 1
    record = marker(folder)["files"]["model.safetensors"]
    assert record["size"] == (folder / "model.safetensors").stat().st_size
    assert len(record["sha256_ends"]) == 64
    digest = marker(folder)["digests"]["model.safetensors"]
    assert len(digest["sha256"]) == 64 and digest["mtime_ns"] == (folder / "model.safetensors").stat().st_mtime_ns
    assert [p.name for p in folder.parent.iterdir()] == [KEY]  # no temp folder left


def test_truncated_weights_are_converted_again_with_a_warning(fake: FakeConversion, caplog: pytest.LogCaptureFixture):
    folder = resolve()
    truncate(folder / "model.safetensors")
    with caplog.at_level(logging.WARNING, logger="d3.model_cache"):
        loaded = load_model("smollm2-135m", device="cpu")
    assert fake.calls == 2 and loaded.num_layers == 4
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "damaged" in warnings[0] and "bytes" in warnings[0] and "\n" not in warnings[0]
    assert model_cache.check_folder(folder) is None


def test_same_size_but_changed_bytes_are_caught_by_the_hash(fake: FakeConversion):
    path = resolve() / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert "hash" in model_cache.check_folder(path.parent)
    resolve()
    assert fake.calls == 2 and model_cache.check_folder(path.parent) is None


def test_missing_weight_file_is_converted_again(fake: FakeConversion):
    folder = resolve()
    (folder / "model.safetensors").unlink()
    assert model_cache.check_folder(folder) == "model.safetensors is missing"
    resolve()
    assert fake.calls == 2 and (folder / "model.safetensors").is_file()


def test_old_marker_without_records_is_checked_by_structure(fake: FakeConversion):
    """Caches converted before records were kept: a truncated file is caught, an intact one gets its record."""
    folder = resolve()
    old = {"name": "smollm2-135m", "gguf": "fake.gguf", "cache_version": 1}
    (folder / model_cache.MARKER).write_text(json.dumps(old))
    resolve()
    assert fake.calls == 1 and marker(folder)["files"]["model.safetensors"]["size"] > 0  # upgraded in place
    (folder / model_cache.MARKER).write_text(json.dumps(old))
    truncate(folder / "model.safetensors")
    load_model("smollm2-135m", device="cpu")
    assert fake.calls == 2 and "files" in marker(folder)


def test_stale_temp_folders_are_removed_on_the_next_load(fake: FakeConversion):
    parent = model_cache.cache_root() / "smollm2-135m"
    crashed = parent / f".tmp-{KEY}-{dead_pid()}-abc123"  # its process is gone
    running = parent / f".tmp-{KEY}-{os.getpid()}-def456"  # this process: a conversion under way
    old = parent / f".tmp-{KEY}-x1y2z3"  # no pid in the name (older code): judged by age
    recent = parent / f".tmp-{KEY}-q7r8s9"
    for folder in (crashed, running, old, recent):
        (folder / "model").mkdir(parents=True)
        (folder / "model" / "model.safetensors").write_bytes(b"0" * 1000)
    hours_ago = time.time() - 2 * 3600
    for path in (old, old / "model", old / "model" / "model.safetensors"):
        os.utime(path, (hours_ago, hours_ago))
    resolve()
    left = sorted(p.name for p in parent.iterdir())
    assert left == sorted([KEY, running.name, recent.name])


def test_a_conversion_that_fails_leaves_no_temp_folder(fake: FakeConversion, monkeypatch: pytest.MonkeyPatch):
    def broken(gguf: Path, out: Path, name: str) -> None:
        out.mkdir(parents=True)
        (out / "model.safetensors").write_bytes(b"partial")
        raise RuntimeError("conversion failed")

    monkeypatch.setattr(models, "_convert", broken)
    with pytest.raises(RuntimeError, match="conversion failed"):
        resolve()
    assert list((model_cache.cache_root() / "smollm2-135m").iterdir()) == []


MIB = 1 << 20


class BigConversion:
    """A 24 MiB weight file, as large as the issue's zeroed stretch needs (the embedded models' are 0.5 GB)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, gguf: Path, out: Path, name: str) -> None:
        import torch
        from safetensors.torch import save_file

        self.calls += 1
        out.mkdir(parents=True, exist_ok=True)
        save_file({"w": torch.arange(6 * MIB, dtype=torch.float32)}, str(out / "model.safetensors"))


def zero_middle(path: Path, length: int = 8 * MIB) -> None:
    """8 MiB of zeros written in the middle of the file, its size unchanged (as `dd conv=notrunc` does)."""
    size = path.stat().st_size
    with path.open("r+b") as handle:
        handle.seek(size // 2 - length // 2)
        handle.write(bytes(length))


def test_a_zeroed_stretch_in_the_middle_is_caught_and_converted_again(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(model_cache.CACHE_ENV, str(tmp_path / "cache"))
    convert = BigConversion()
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF")
    folder = model_cache.cached_conversion("big", KEY, lambda _: gguf, convert)
    weights = folder / "model.safetensors"
    size = weights.stat().st_size
    zero_middle(weights)
    assert weights.stat().st_size == size
    assert model_cache.check_folder(folder) == ("model.safetensors differs from the sha256 recorded at conversion "
                                                "(its bytes were changed)")
    with caplog.at_level(logging.WARNING, logger="d3.model_cache"):
        again = model_cache.cached_conversion("big", KEY, lambda _: gguf, convert)
    assert again == folder and convert.calls == 2 and model_cache.check_folder(folder) is None
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warning) == 1 and "damaged" in warning[0] and "converting it again" in warning[0]


def test_the_full_hash_runs_once_per_change_of_the_file(tmp_path, monkeypatch):
    """Unchanged size and time: a stat, no read. A new time with the same bytes (a copied cache): hashed once,
    then its time is recorded."""
    monkeypatch.setenv(model_cache.CACHE_ENV, str(tmp_path / "cache"))
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF")
    folder = model_cache.cached_conversion("big", KEY, lambda _: gguf, BigConversion())
    hashed = []
    real = model_cache.full_digest
    monkeypatch.setattr(model_cache, "full_digest", lambda path: hashed.append(path) or real(path))
    assert model_cache.check_folder(folder) is None and hashed == []
    weights = folder / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    assert model_cache.check_folder(folder) is None and hashed == [weights]
    assert model_cache.check_folder(folder) is None and hashed == [weights]
    assert marker(folder)["digests"]["model.safetensors"]["mtime_ns"] == weights.stat().st_mtime_ns


def test_a_marker_written_by_older_code_gets_a_digest_and_older_code_still_reads_it(tmp_path):
    """Older code records only the size and the ends (and compares them as they are): the full digest is kept
    beside them, so a cache shared with older code is never converted back and forth."""
    folder = tmp_path / "m"
    BigConversion()(tmp_path, folder, "big")
    weights = folder / "model.safetensors"
    old = {"model.safetensors": model_cache.weight_record(weights)}
    (folder / model_cache.MARKER).write_text(json.dumps({"name": "big", "files": old}))
    assert model_cache.check_folder(folder) is None
    assert marker(folder)["files"] == old and "sha256" in marker(folder)["digests"]["model.safetensors"]
    zero_middle(weights)  # now the digest is there: caught
    assert "differs from the sha256 recorded at conversion" in model_cache.check_folder(folder)


@pytest.mark.parametrize("record", [5, "abc", None, [1, 2], {"size": "12", "sha256_ends": "x"}, {"size": 3},
                                    {"size": 1.5, "sha256_ends": "x"}])
def test_a_marker_whose_record_has_the_wrong_type_is_converted_again(fake: FakeConversion, record,
                                                                      caplog: pytest.LogCaptureFixture):
    """Issue 36 item 8: a record of the wrong type (or shape) is a damaged marker, converted again, no TypeError."""
    folder = resolve()
    meta = marker(folder)
    meta["files"]["model.safetensors"] = record
    (folder / model_cache.MARKER).write_text(json.dumps(meta))
    assert "is malformed" in model_cache.check_folder(folder)
    with caplog.at_level(logging.WARNING, logger="d3.model_cache"):
        assert resolve() == folder
    assert fake.calls == 2 and model_cache.check_folder(folder) is None
    assert any("damaged" in r.getMessage() for r in caplog.records)


def test_a_record_naming_a_path_outside_the_folder_is_malformed(fake: FakeConversion):
    folder = resolve()
    meta = marker(folder)
    meta["files"] = {"../model.safetensors": meta["files"]["model.safetensors"]}
    (folder / model_cache.MARKER).write_text(json.dumps(meta))
    assert "is malformed" in model_cache.check_folder(folder)


def test_verify_finds_a_change_that_keeps_size_ends_and_modification_time(tmp_path, monkeypatch):
    """Issue 36 item 12: a load checks size and ends (and the full hash when the time changed); `verify_folder`,
    on demand, hashes every file in full, so a change that keeps all three is found there, at no cost per load."""
    monkeypatch.setenv(model_cache.CACHE_ENV, str(tmp_path / "cache"))
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF")
    folder = model_cache.cached_conversion("big", KEY, lambda _: gguf, BigConversion())
    weights = folder / "model.safetensors"
    assert model_cache.verify_folder(folder) is None
    stat = weights.stat()
    zero_middle(weights)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # size, ends and time as they were
    assert model_cache.check_folder(folder) is None  # the per-load check cannot see it (documented)
    assert model_cache.verify_folder(folder) == ("model.safetensors differs from the sha256 recorded at conversion "
                                                 "(its bytes were changed)")


def test_the_sha256_is_recorded_at_conversion(tmp_path, monkeypatch):
    monkeypatch.setenv(model_cache.CACHE_ENV, str(tmp_path / "cache"))
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF")
    folder = model_cache.cached_conversion("big", KEY, lambda _: gguf, BigConversion())
    weights = folder / "model.safetensors"
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    assert marker(folder)["digests"]["model.safetensors"] == {"mtime_ns": weights.stat().st_mtime_ns, "sha256": digest}


def _edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_every_file_of_the_folder_is_recorded(fake: FakeConversion):
    folder = resolve()
    files = marker(folder)["files"]
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"} <= set(files)
    assert set(files) == {p.name for p in folder.iterdir() if p.name != model_cache.MARKER}
    assert set(marker(folder)["digests"]) == set(files) and marker(folder)["covers"] == "every file"


@pytest.mark.parametrize("change", [{"num_hidden_layers": 3}, {"rope_theta": 1234.0}])
def test_a_changed_config_is_damage_and_a_load_converts_again(fake: FakeConversion, change,
                                                              caplog: pytest.LogCaptureFixture):
    """Issue 41 item 6: a changed layer count or rope_theta is found at load, said in one line, and converted
    again: the load gets the model as converted (4 layers), never a traceback from a model that does not fit."""
    folder = resolve()
    _edit_config(folder, **change)
    problem = model_cache.check_folder(folder)
    assert problem is not None and problem.startswith("config.json ") and "\n" not in problem
    with caplog.at_level(logging.WARNING, logger="d3.model_cache"):
        loaded = load_model("smollm2-135m", device="cpu")
    assert fake.calls == 2 and loaded.num_layers == 4
    assert json.loads((folder / "config.json").read_text()).get("rope_theta") != 1234.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "config.json" in warnings[0] and "\n" not in warnings[0]


def test_a_changed_tokenizer_or_an_added_tokenizer_file_is_converted_again(fake: FakeConversion):
    folder = resolve()
    path = folder / "tokenizer_config.json"
    path.write_text(path.read_text().replace("}", ', "model_max_length": 7}', 1) if "}" in path.read_text() else "{}")
    assert model_cache.check_folder(folder).startswith("tokenizer_config.json ")
    resolve()
    assert fake.calls == 2 and model_cache.check_folder(folder) is None
    added = folder / "added_tokens.json"  # transformers reads it when it is there
    assert not added.exists()
    added.write_text('{"<extra>": 99}')
    assert model_cache.check_folder(folder) == "added_tokens.json was not there at conversion"
    resolve()
    assert fake.calls == 3 and not added.exists()


def test_a_marker_that_recorded_only_the_weights_records_the_rest_at_load(fake: FakeConversion):
    """Caches converted by older code: the first load records the other files as they are; a later change to
    one of them is then found like any other."""
    folder = resolve()
    meta = marker(folder)
    old = {**meta, "files": {"model.safetensors": meta["files"]["model.safetensors"]},
           "digests": {"model.safetensors": meta["digests"]["model.safetensors"]}}
    old.pop("covers")
    (folder / model_cache.MARKER).write_text(json.dumps(old))
    assert model_cache.check_folder(folder) is None
    assert "config.json" in marker(folder)["files"] and marker(folder)["covers"] == "every file"
    _edit_config(folder, num_hidden_layers=3)
    assert model_cache.check_folder(folder).startswith("config.json ")
