"""Synthetic traces for the figure tests: layer sets from the real schedules, fills as the decoder decides them
(`d3.schedule.fill_plan`), random statistics. numpy only (the pure viz tests import it too)."""

from __future__ import annotations

import numpy as np

from d3.config import D3Config, StrategyConfig, default_core
from d3.schedule import fill_plan, plan
from d3.trace import PromptStats, TokenStep, Trace

WORDS = ["The", " cat", " sat", " on", "\n", " the", " <b>mat</b>", "\t", " and", " purred", ".", " It"]


def make_trace(cfg: StrategyConfig, num_layers: int = 12, steps: int = 20, *, seed: int = 0,
               token_ids: list[int] | None = None, attention_layers: tuple[int, ...] = (), heads: int = 2,
               prompt_len: int = 5, texts: list[str] | None = None) -> Trace:
    """A trace whose layer sets follow `plan(cfg)`: skipped layers filled with cfg.fill, random stats
    (NaN where a layer did not run), attention [heads, prompt_len + step] at `attention_layers`."""
    rng = np.random.default_rng(seed)
    token_ids = token_ids if token_ids is not None else [i % len(WORDS) for i in range(steps)]
    texts = texts if texts is not None else [WORDS[t % len(WORDS)] for t in token_ids]
    out = []
    for i in range(steps):
        layer_plan = plan(cfg, num_layers, i)
        run = layer_plan.run
        ran = np.zeros(num_layers, dtype=bool)
        ran[list(run)] = True
        stats = {}
        for name in ("attn_cos", "mlp_cos"):
            stats[name] = np.where(ran, rng.uniform(0.5, 1.0, num_layers), np.nan).astype(np.float32)
        for name in ("attn_dist", "mlp_dist", "hidden_norm"):
            stats[name] = np.where(ran, rng.uniform(0.0, 1.0, num_layers), np.nan).astype(np.float32)
        attention = {layer: rng.dirichlet(np.ones(prompt_len + i), size=heads).astype(np.float16)
                     for layer in attention_layers if ran[layer]}
        out.append(TokenStep(step=i, token_id=token_ids[i], text=texts[i], layers_run=run,
                             filled=fill_plan(run, [x for x in range(num_layers) if not ran[x]], cfg.fill,
                                              ["full_attention"] * num_layers),
                             planned=layer_plan.budget, entropy=float(rng.uniform(0, 3)), wall_ms=10.0,
                             logprob=float(np.log(rng.uniform(0.1, 1))), stats=stats, attention=attention,
                             topk=((token_ids[i], texts[i], 0.6), (1, " dog", 0.2))))
    prompt_stats = PromptStats(
        tokens=tuple(f"p{k}" for k in range(prompt_len)),
        stats={name: rng.uniform(0.5, 1.0, num_layers).astype(np.float32) for name in ("attn_cos", "mlp_cos")}
        | {name: rng.uniform(0.0, 1.0, num_layers).astype(np.float32) for name in ("attn_dist", "mlp_dist")},
    )
    core = cfg.core(num_layers) if isinstance(cfg, D3Config) else default_core(num_layers)
    return Trace(model="fake", num_layers=num_layers, strategy=cfg.to_dict(), prompt="p", core=core, steps=tuple(out),
                 prompt_stats=prompt_stats, num_heads=heads)


