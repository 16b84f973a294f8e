"""D3 Explorer engine: Position-Aware Depth Decay Decoding on real causal LMs.

Importing `d3` stays light (no torch): configs, schedules and traces are pure Python, so `viz/`
can use them. The torch parts live in `d3.models`, `d3.decoder`, `d3.engine`.
"""

from d3.config import (
    D3Config,
    EarlyExitConfig,
    FullConfig,
    GenerationConfig,
    SkipDecodeConfig,
    StrategyConfig,
    TraceConfig,
    UnifiedConfig,
    strategy_from_dict,
)
from d3.schedule import LayerPlan, plan
from d3.trace import Agreement, Comparison, PromptStats, TokenStep, Trace, token_agreement

__all__ = [
    "D3Config", "EarlyExitConfig", "FullConfig", "GenerationConfig", "SkipDecodeConfig", "StrategyConfig",
    "TraceConfig", "UnifiedConfig", "strategy_from_dict", "LayerPlan", "plan", "Comparison", "PromptStats",
    "TokenStep", "Trace", "Agreement", "token_agreement",
]
