"""Tests for d3.model_cache: stale temp folders are cleaned, damaged conversions are found and redone (fake conversion)."""

from __future__ import annotations

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


def test_weight_record_hashes_only_the_ends(tmp_path: Path):
    path = tmp_path / "w.safetensors"
    size = 3 * model_cache.ENDS_BYTES
    path.write_bytes(bytes(size))
    record = model_cache.weight_record(path)
    middle = bytearray(bytes(size))
    middle[size // 2] = 1  # a change in the middle is not seen (the size and the ends catch truncation)
    path.write_bytes(bytes(middle))
    assert model_cache.weight_record(path) == record
    end = bytearray(bytes(size))
    end[-10] = 1
    path.write_bytes(bytes(end))
    assert model_cache.weight_record(path) != record == {"size": size, "sha256_ends": record["sha256_ends"]}
