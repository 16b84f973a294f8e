"""D3 and its baselines as a transformers `custom_generate` method, decoded by the D3 Explorer engine (`d3/`).

    model.generate(**inputs, custom_generate="hub/d3-generate", trust_remote_code=True, alpha=0.99, max_new_tokens=32)

Keyword arguments that name a field of a strategy config (`alpha`, `start`, `core_head`, `core_tail`, `drop_order`,
`fill`, the baselines' `max_layers`, `ratio`, `threshold`, ...) configure the strategy picked by `strategy`
("d3" by default; "full", "skipdecode", "unified", "early_exit"); everything else is generate's own, and generate
itself prepares it: this method hands transformers a decoding loop (`generate(custom_generate=<callable>)`), so the
generation config's validation, logits processors, stopping criteria, `num_return_sequences` and sampling from the
global torch seed are the library's. Only where the logits come from differs: the engine's skip-aware decoder.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import GenerationMixin, StoppingCriteriaList, StopStringCriteria
from transformers.generation.configuration_utils import GenerationMode
from transformers.generation.utils import GenerateDecoderOnlyOutput

try:
    from d3.config import STRATEGIES, TRACE_OFF, EarlyExitConfig, StrategyConfig, strategy_from_dict
    from d3.decoder import decode_one_token, prefill
    from d3.engine import Engine
    from d3.schedule import plan
except ImportError as err:  # transformers copies this file away from the checkout: the engine must be installed
    raise ImportError("D3's custom_generate runs the D3 Explorer engine: `pip install .` in the D3 Explorer "
                      "repository (or put its checkout on PYTHONPATH)") from err

# Every field of every strategy config, read from the configs, so a field added there is a keyword here too.
STRATEGY_FIELDS = frozenset(name for cls in STRATEGIES.values() for name in cls.__dataclass_fields__)
# What D3 cannot honour, refused in one line rather than ignored: generate() arguments that run another model or
# the full-depth model itself (assisted decoding, classifier-free guidance), and outputs a skipped layer cannot give.
UNSUPPORTED = ("assistant_model", "negative_prompt_ids", "negative_prompt_attention_mask")
UNSUPPORTED_OUTPUTS = {"output_hidden_states": "a skipped layer has no hidden state",
                       "output_attentions": "a skipped layer has no attention weights"}
MODES = (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE)


class _IdsOnly:
    """What the engine asks of a tokenizer when generate() got none: ids are kept, text is left empty."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id
        self.eos_token_id = None

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        return ""

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [str(i) for i in ids]


def _refuse_unhonoured(gen_cfg: Any) -> None:
    mode = gen_cfg.get_generation_mode()
    if mode not in MODES:
        extra = "; num_beams > 1 is not supported" if (gen_cfg.num_beams or 1) > 1 else ""
        raise ValueError(f"D3's custom_generate decodes greedily or by sampling, not by {mode.value}{extra}")
    for name, why in UNSUPPORTED_OUTPUTS.items():
        if getattr(gen_cfg, name, False):
            raise ValueError(f"D3's custom_generate cannot return {name}: {why}")
    if (gen_cfg.guidance_scale or 1.0) != 1.0:
        raise ValueError("D3's custom_generate does not support guidance_scale: classifier-free guidance runs the "
                         "full-depth model itself")


class _Loop:
    """The decoding loop transformers calls after preparing everything (`_sample`'s shape, `_sample`'s order: logits,
    processors, pick, pad finished rows, stopping criteria), with the engine's skip-aware decoder for the logits."""

    def __init__(self, strategy: StrategyConfig, seed: int | None, streamer: Any, tokenizer: Any = None) -> None:
        self.strategy, self.seed, self.streamer, self.tokenizer = strategy, seed, streamer, tokenizer

    def __call__(self, model: Any, input_ids: torch.Tensor, logits_processor: Any, stopping_criteria: Any,
                 generation_config: Any, **model_kwargs: Any) -> Any:
        gen_cfg, tokenizer = generation_config, self.tokenizer
        _refuse_unhonoured(gen_cfg)
        pad = gen_cfg._pad_token_tensor  # what generate's own loop pads finished rows with (EOS when pad is unset)
        engine = Engine(model, tokenizer or _IdsOnly(int(pad) if pad is not None else 0),
                        name=model.config.name_or_path or "model", max_prompt_tokens=input_ids.shape[1])
        strategy = engine.resolve(self.strategy)
        engine.check(strategy, TRACE_OFF)
        mask = model_kwargs.get("attention_mask")  # None when generate found no padding
        mask = torch.ones_like(input_ids) if mask is None else mask
        generator = None if self.seed is None else torch.Generator(input_ids.device).manual_seed(self.seed)
        has_eos = any(hasattr(c, "eos_token_id") for c in stopping_criteria)
        unfinished = torch.ones(input_ids.shape[0], dtype=torch.long, device=input_ids.device)
        scores, raw = [], []
        early = strategy if isinstance(strategy, EarlyExitConfig) else None
        with engine.lock, torch.inference_mode():
            state, out = prefill(engine.adapter, input_ids, mask)
            step = 0
            while True:
                logits = out.logits.to(input_ids.device)  # float32 [batch, vocab]
                processed = logits_processor(input_ids, logits)
                scores.append(processed)
                raw.append(logits)
                if gen_cfg.do_sample:
                    tokens = torch.multinomial(torch.softmax(processed, dim=-1), 1, generator=generator).squeeze(1)
                else:
                    tokens = processed.argmax(dim=-1)
                if has_eos:
                    tokens = tokens * unfinished + pad * (1 - unfinished)
                input_ids = torch.cat([input_ids, tokens[:, None]], dim=-1)
                if self.streamer is not None:
                    self.streamer.put(tokens.cpu())
                unfinished = unfinished & ~stopping_criteria(input_ids, tuple(scores))
                if unfinished.max() == 0:
                    break
                step += 1
                out = decode_one_token(engine.adapter, state, tokens, plan(strategy, engine.num_layers, step),
                                       strategy.fill, early_exit=early)
        if self.streamer is not None:
            self.streamer.end()
        if not gen_cfg.return_dict_in_generate:
            return input_ids
        return GenerateDecoderOnlyOutput(sequences=input_ids, scores=tuple(scores) if gen_cfg.output_scores else None,
                                         logits=tuple(raw) if gen_cfg.output_logits else None)


def generate(model: Any, inputs: torch.Tensor | None = None, generation_config: Any = None,
             logits_processor: Any = None, stopping_criteria: Any = None, prefix_allowed_tokens_fn: Any = None,
             synced_gpus: Any = None, streamer: Any = None, *, strategy: str = "d3", seed: int | None = None,
             **kwargs: Any) -> torch.LongTensor | GenerateDecoderOnlyOutput:
    """Decode with a layer-skipping strategy; returns what `model.generate` returns for the same arguments.

    seed: sample from a generator of this seed (do_sample=True) instead of torch's global one, as generate does.
    tokenizer: optional; generate's own (stop_strings need it: passed through here, since generate() drops it for a
    custom_generate callable).
    """
    given = sorted(k for k in UNSUPPORTED if kwargs.pop(k, None) is not None)
    if given:
        raise ValueError(f"D3's custom_generate does not support {', '.join(given)}: it runs another model or the "
                         f"full-depth model itself")
    if synced_gpus:
        raise ValueError("D3's custom_generate does not support synced_gpus: the engine decodes on one process")
    fields = {k: kwargs.pop(k) for k in list(kwargs) if k in STRATEGY_FIELDS}
    config = strategy_from_dict({"strategy": strategy, **fields})
    kwargs.pop("use_model_defaults", None)  # an older generate() argument; the generation config decides
    tokenizer = kwargs.pop("tokenizer", None)
    generation_config, stopping_criteria = _stop_strings(model, generation_config, stopping_criteria, tokenizer,
                                                         kwargs.pop("stop_strings", None))
    return GenerationMixin.generate(model, inputs, generation_config, logits_processor, stopping_criteria,
                                    prefix_allowed_tokens_fn=prefix_allowed_tokens_fn, streamer=streamer,
                                    custom_generate=_Loop(config, seed, streamer, tokenizer), **kwargs)


def _stop_strings(model: Any, generation_config: Any, stopping_criteria: Any, tokenizer: Any,
                  stop_strings: str | list[str] | None) -> tuple[Any, Any]:
    """The stop strings (given here, or in the generation config) as transformers' own StopStringCriteria among
    the stopping criteria, and a generation config without them: generate() keeps only a callable
    custom_generate's own keywords, so it drops `tokenizer` and would refuse the stop strings."""
    base = generation_config if generation_config is not None else model.generation_config
    stop_strings = stop_strings or getattr(base, "stop_strings", None)
    if not stop_strings:
        return generation_config, stopping_criteria
    if tokenizer is None:
        raise ValueError("stop_strings needs tokenizer= (the model's tokenizer), as in plain generate")
    if getattr(base, "stop_strings", None):
        generation_config = copy.deepcopy(base)
        generation_config.stop_strings = None
    criteria = StoppingCriteriaList(stopping_criteria or [])
    criteria.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=stop_strings))
    return generation_config, criteria
