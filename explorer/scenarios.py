"""The one-click scenarios of the Live tab: controls to set, one or two runs, and the text that explains them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from d3.config import default_core
from explorer.controls import DEFAULTS
from explorer.parse import as_choice


@dataclass(frozen=True)
class Scenario:
    """Controls to set, then run; `runs` > 1 runs a second set of controls after the first (for contrasts)."""

    title: str
    text: str
    runs: tuple[dict[str, Any], ...]
    fills: bool = False  # also run the fill-strategy comparison


SCENARIOS: dict[str, Scenario] = {
    "full_vs_d3": Scenario(
        "Full depth vs D3",
        f"The default D3 schedule (α = {DEFAULTS.alpha}, core layers at both ends) against the full model. Watch the "
        "D3 tokens get lighter as fewer layers run, and whether the text stays the same.",
        ({},)),
    "core": Scenario(
        "Why the core layers matter",
        "Two runs with the same α = 0.97: first with the default core, then with core depth 0, so D3 may also "
        "skip the first and last layers. Compare the two rows of the run history: without a core, agreement "
        "with full depth drops sooner, because the first and last layers change the hidden state the most "
        "(see Information flow).",
        ({"alpha": 0.97}, {"alpha": 0.97, "core_head": 0, "core_tail": 0})),
    "fill": Scenario(
        "What filling does",
        "Drop order 'strided' keeps evenly spaced flex layers, so a layer skipped by one token can run again "
        "for a later token and read that token's missing key/value entry. Filling decides what it reads. "
        "This runs fill 'none' (the hole is masked out) in the panes, then compares copy, propagate and none "
        "on the same prompt (Fill strategies tab). With the default nested drop orders no later token ever "
        "reads a hole, so the fill would make no difference.",
        ({"alpha": 0.97, "drop_order": "strided", "fill": "none"},), fills=True),
    "aggressive": Scenario(
        "Aggressive α: where it breaks",
        "α = 0.9 halves the depth within about 7 tokens and reaches the core floor soon after. The text "
        "usually drifts from full depth early: see where the first divergence lands and how the KL grows.",
        ({"alpha": 0.9},)),
}
# The controls every scenario sets (the page's D3 defaults, then each run's changes).
SCENARIO_CONTROLS = ("strategy", "alpha", "core_head", "core_tail", "start", "drop_order", "fill", "decoding")


def scenario_controls(key: str, step: int, num_layers: int) -> dict[str, Any]:
    """The control values of run `step` of scenario `key`: the D3 defaults with the scenario's changes."""
    scenario = SCENARIOS[as_choice("scenario", key, tuple(SCENARIOS))]
    head, tail = default_core(num_layers)
    defaults = {name: getattr(DEFAULTS, name) for name in SCENARIO_CONTROLS} | {"core_head": head, "core_tail": tail}
    return {**defaults, **scenario.runs[min(step, len(scenario.runs) - 1)]}


def scenario_text(key: str, step: int) -> str:
    """What the scenario shows, in Markdown, with which of its runs this is."""
    scenario = SCENARIOS[key]
    text = f"**{scenario.title}** — {scenario.text}"
    if len(scenario.runs) > 1:
        text += f"\n\n*Run {step + 1} of {len(scenario.runs)}.*"
    return text
