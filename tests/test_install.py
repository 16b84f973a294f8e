"""`d3 install NAME`: a name that is not a known model, a model not converted yet and a converted folder whose bytes
changed are each answered in one line; a folder as converted verifies clean (d3/cli/install.py)."""

from __future__ import annotations

import json

from d3 import cli, model_cache


def _converted(tmp_path, monkeypatch, name: str = "smollm2-135m", key: str = "k0"):
    """A finished conversion of `name` in a cache under tmp_path (a tiny weight file, the marker written by the
    cache's own code), and `known_key` pointed at it."""
    monkeypatch.setenv(model_cache.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr("d3.models.known_key", lambda _name: key)
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF")

    def convert(_gguf, out, _name):
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
        (out / "model.safetensors").write_bytes(bytes(range(256)) * 64)

    return model_cache.cached_conversion(name, key, lambda _: gguf, convert)


def test_an_unknown_name_is_refused_in_one_line(capsys) -> None:
    assert cli.main(["install", "no-such-model"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no-such-model" in err and "qwen2.5-coder-1.5b" in err


def test_verify_before_any_conversion_says_what_to_run(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv(model_cache.CACHE_ENV, str(tmp_path / "empty"))
    monkeypatch.setattr("d3.models.known_key", lambda _name: "k0")
    assert cli.main(["install", "smollm2-135m", "--verify"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "d3 install smollm2-135m" in err


def test_verify_passes_a_folder_as_converted_and_names_a_changed_file(tmp_path, monkeypatch, capsys) -> None:
    folder = _converted(tmp_path, monkeypatch)
    assert cli.main(["install", "smollm2-135m", "--verify"]) == 0
    assert "every file matches" in capsys.readouterr().out
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte in the middle: size and ends as they were
    weights.write_bytes(bytes(data))
    assert cli.main(["install", "smollm2-135m", "--verify"]) == 1
    out = capsys.readouterr().out
    assert "model.safetensors" in out and "matches" not in out


def test_an_unknown_flag_exits_2_in_one_line(capsys) -> None:
    assert cli.main(["install", "smollm2-135m", "--bogus"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--bogus" in err


def _edit_config(folder, **changes) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_verify_covers_the_config_and_names_it_in_one_line(tmp_path, monkeypatch, capsys) -> None:
    """Issue 41 item 6: a changed config.json (layer count, rope_theta) fails --verify in one line, exit 1."""
    folder = _converted(tmp_path, monkeypatch)
    assert cli.main(["install", "smollm2-135m", "--verify"]) == 0
    capsys.readouterr()
    for change in ({"num_hidden_layers": 3}, {"rope_theta": 1234.0}):
        original = (folder / "config.json").read_bytes()
        _edit_config(folder, **change)
        assert cli.main(["install", "smollm2-135m", "--verify"]) == 1
        captured = capsys.readouterr()
        lines = (captured.out + captured.err).strip().splitlines()
        assert len(lines) == 1 and "config.json" in lines[0] and "Traceback" not in lines[0], lines
        (folder / "config.json").write_bytes(original)


def test_verify_names_a_file_added_after_conversion(tmp_path, monkeypatch, capsys) -> None:
    folder = _converted(tmp_path, monkeypatch)
    (folder / "chat_template.jinja").write_text("{{ messages }}")
    assert cli.main(["install", "smollm2-135m", "--verify"]) == 1
    out = capsys.readouterr().out.strip()
    assert out == "smollm2-135m: chat_template.jinja was not there at conversion"
