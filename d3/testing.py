"""Tiny random models and an offline tokenizer, for the fast tests and the load test (no hub, no downloads)."""

from __future__ import annotations

import os
import shutil
import string
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
CHARS = list(string.ascii_lowercase + string.digits + " .,!?'\n")


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer with 4 specials + 43 characters (47 ids), built offline."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")
    fast.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                          "{% if add_generation_prompt %}assistant: {% endif %}")
    return fast


def tiny_llama(num_layers: int = 4, seed: int = 0, vocab_size: int = 99, **overrides) -> LlamaForCausalLM:
    """hidden 32, 4 heads / 2 KV heads (unless `overrides` say otherwise), as in transformers' causal_lm_tester;
    weights scaled up so layers matter."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(**{**dict(hidden_size=32, intermediate_size=37, num_hidden_layers=num_layers,
                                num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab_size,
                                max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                attn_implementation="sdpa"), **overrides})  # overrides may replace any of these
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)  # default init is so small that every layer is near-identity; make skipping visible
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    return model


def count_hooks(module: torch.nn.Module) -> int:
    """Number of forward (pre-)hooks registered anywhere under `module` (0 after every call: hooks must not leak)."""
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in module.modules())


TINY_FAMILY_BASE = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=8, vocab_size=99, max_position_embeddings=256,
                        pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)


def tiny_family_model(model_type: str, seed: int = 0, scale: float = 4.0) -> Any:
    """A tiny random model of one family in d3.families.FAMILIES (its `tiny` overrides on TINY_FAMILY_BASE), built
    with the attention implementation the family needs; 2-D weights scaled up so that skipping a layer shows."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from d3.families import FAMILIES

    family = FAMILIES[model_type]
    config = AutoConfig.for_model(model_type, **{**TINY_FAMILY_BASE, **family.tiny})
    config._attn_implementation = family.attn_implementation(config)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval().requires_grad_(False)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(scale)
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    return model


def loaded_from_objects(model: Any, tokenizer: Any, name: str = "custom") -> Any:
    """A `d3.models.LoadedModel` around an already-built model and tokenizer, checked as a loaded one is."""
    from d3 import models as loader

    return loader._finish(name, model, tokenizer)


def clear_model_cache() -> None:
    """Forget every model `d3.models.get_model` has loaded, so the next call loads afresh."""
    from d3 import models as loader

    with loader._LOAD_LOCK:
        loader._MODELS.clear()


GATE_ENV = "D3_TEST_CONVERSION_GATE"


def gated_conversion(gguf: Any, out: Any, name: str) -> None:
    """A stand-in for the GGUF conversion, for tests of the conversion subprocess (`d3.convert`): it touches
    `<gate>.started`, waits until the file named by $D3_TEST_CONVERSION_GATE exists (at most 10 minutes), then
    saves a tiny random Llama with the offline tokenizer. The real subprocess, assembly and cache run around it."""
    import os
    import time
    from pathlib import Path

    gate = os.environ.get(GATE_ENV)
    if gate:
        Path(gate + ".started").touch()
        deadline = time.monotonic() + 600
        while not Path(gate).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    tiny_llama().save_pretrained(str(out))
    tiny_tokenizer().save_pretrained(str(out))


def hub_snapshot(cache: Path, hub_id: str, files: Path, revision: str = "0" * 40) -> Path:
    """Lay out the files of a saved model folder (`save_pretrained`'s) as the hub cache `cache` (HF_HUB_CACHE, or
    HF_HOME/hub) would hold a download of `hub_id`: models--owner--name/snapshots/<revision>/ and refs/main. Files
    are hard-linked where the file system allows (a converted model's gigabytes are not copied), else copied.
    With HF_HUB_OFFLINE=1, `from_pretrained(hub_id)` then loads them as if downloaded."""
    folder = cache / f"models--{hub_id.replace('/', '--')}"
    snapshot = folder / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    for path in sorted(files.iterdir()):
        if path.is_file() and not path.name.startswith("."):
            target = snapshot / path.name
            target.unlink(missing_ok=True)
            try:
                os.link(path, target)
            except OSError:
                shutil.copy2(path, target)
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / "main").write_text(revision, encoding="utf-8")
    return snapshot
