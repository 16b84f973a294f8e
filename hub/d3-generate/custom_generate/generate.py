"""D3 and its baselines as a transformers `custom_generate` method, decoded by the D3 Explorer engine (`d3/`).

    model.generate(**inputs, custom_generate="hub/d3-generate", trust_remote_code=True, alpha=0.99, max_new_tokens=32)

Keyword arguments that name a field of a strategy config (`alpha`, `start`, `core_head`, `core_tail`, `drop_order`,
`fill`, the baselines' `max_layers`, `ratio`, `threshold`, ...) configure the strategy picked by `strategy`
("d3" by default; "full", "skipdecode", "unified", "early_exit"); everything else is generate's own.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

try:
    from d3.config import STRATEGIES, TRACE_OFF, GenerationConfig, strategy_from_dict
    from d3.engine import Engine
except ImportError as err:  # transformers copies this file away from the checkout: the engine must be installed
    raise ImportError("D3's custom_generate runs the D3 Explorer engine: `pip install .` in the D3 Explorer "
                      "repository (or put its checkout on PYTHONPATH)") from err

# Every field of every strategy config, read from the configs, so a field added there is a keyword here too.
STRATEGY_FIELDS = frozenset(name for cls in STRATEGIES.values() for name in cls.__dataclass_fields__)
# generate() arguments this method has no equivalent for; passing one (not None) is an error, not a silent no-op.
UNSUPPORTED = ("assistant_model", "prefix_allowed_tokens_fn", "negative_prompt_ids", "negative_prompt_attention_mask")


class _IdsOnly:
    """What the engine asks of a tokenizer when generate() got none: ids are kept, text is left empty."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id
        self.eos_token_id = None

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        return ""

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [str(i) for i in ids]


def _as_list(ids: Any) -> list[int]:
    if ids is None:
        return []
    return [int(i) for i in ids] if isinstance(ids, (list, tuple, torch.Tensor)) else [int(ids)]


def _generation(gen_cfg: Any, prompt_len: int, seed: int) -> GenerationConfig:
    """The engine's GenerationConfig for transformers' one: greedy, or temperature / top-p sampling."""
    if (gen_cfg.num_beams or 1) > 1:
        raise ValueError("D3's custom_generate decodes greedily or by sampling; num_beams > 1 is not supported")
    new = gen_cfg.max_new_tokens if gen_cfg.max_new_tokens is not None else gen_cfg.max_length - prompt_len
    if not gen_cfg.do_sample:
        return GenerationConfig(max_new_tokens=new, temperature=0.0, seed=seed)
    return GenerationConfig(max_new_tokens=new, temperature=gen_cfg.temperature or 1.0, top_p=gen_cfg.top_p or 1.0,
                            seed=seed)


def _sequences(ids: torch.Tensor, new: list[list[int]], pad: int) -> torch.Tensor:
    """The prompt as given, then each row's new tokens, rows that stopped early padded: [batch, prompt + new]."""
    width = max(len(n) for n in new)
    tail = torch.tensor([n + [pad] * (width - len(n)) for n in new], dtype=ids.dtype, device=ids.device)
    return torch.cat([ids, tail.reshape(len(new), width)], dim=1)


def generate(model: Any, inputs: torch.Tensor | None = None, generation_config: Any = None,
             logits_processor: Any = None, stopping_criteria: Any = None, streamer: Any = None, *,
             input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
             strategy: str = "d3", seed: int = 0, tokenizer: Any = None, synced_gpus: Any = None,
             use_model_defaults: Any = None, **kwargs: Any) -> torch.LongTensor | GenerateDecoderOnlyOutput:
    """Decode with a layer-skipping strategy; returns what `model.generate` returns for the same arguments.

    seed: the engine's sampling seed (used when do_sample=True). tokenizer: optional, only for token text.
    """
    ids = inputs if inputs is not None else input_ids  # [batch, prompt_len]
    if ids is None:
        raise ValueError("D3's custom_generate needs input_ids")
    given = sorted(k for k in UNSUPPORTED if kwargs.pop(k, None) is not None)
    if given or logits_processor or stopping_criteria:
        raise ValueError(f"D3's custom_generate does not support {', '.join(given) or 'logits processors or stopping criteria'}")
    fields = {k: kwargs.pop(k) for k in list(kwargs) if k in STRATEGY_FIELDS}
    config = strategy_from_dict({"strategy": strategy, **fields})

    gen_cfg = copy.deepcopy(generation_config if generation_config is not None else model.generation_config)
    unused = gen_cfg.update(**kwargs)
    unused.pop("use_cache", None)
    if unused:
        raise TypeError(f"D3's custom_generate got unexpected keyword argument(s): {', '.join(sorted(unused))}")
    eos = _as_list(gen_cfg.eos_token_id)
    pad = gen_cfg.pad_token_id if gen_cfg.pad_token_id is not None else (eos[0] if eos else 0)

    mask = attention_mask if attention_mask is not None else torch.ones_like(ids)
    prompts = [row[keep.bool()].tolist() for row, keep in zip(ids, mask)]  # the engine pads them again, on the left
    engine = Engine(model, tokenizer or _IdsOnly(pad), name=model.config.name_or_path or "model",
                    max_prompt_tokens=max(len(p) for p in prompts))
    engine.eos_ids = set(eos)  # the generation config's EOS, as model.generate stops at

    scores: list[torch.Tensor] = []
    keep_scores = gen_cfg.return_dict_in_generate and (gen_cfg.output_scores or gen_cfg.output_logits)
    observer = (lambda step, out, state: scores.append(out.logits.clone())) if keep_scores else None  # [batch, vocab]
    if streamer is not None:
        streamer.put(ids.cpu())
    traces = []
    for traces in engine.run(prompts, config, _generation(gen_cfg, ids.shape[1], seed), TRACE_OFF, observer=observer):
        if streamer is not None:
            streamer.put(torch.tensor([t.token_ids[-1] if t.token_ids else pad for t in traces]))
    if streamer is not None:
        streamer.end()

    sequences = _sequences(ids, [list(t.token_ids) for t in traces], pad)
    if not gen_cfg.return_dict_in_generate:
        return sequences
    return GenerateDecoderOnlyOutput(sequences=sequences, scores=tuple(scores) if gen_cfg.output_scores else None,
                                     logits=tuple(scores) if gen_cfg.output_logits else None)
