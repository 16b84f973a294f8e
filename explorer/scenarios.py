"""The one-click scenarios of the Live tab: controls to set, one or two runs, and the text that explains them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from d3.config import default_core
from d3.models import KNOWN_MODELS, QWEN_CODER
from explorer.controls import model_defaults
from explorer.parse import as_choice
from viz.layout import short_label
from viz.stream import count_words, full_counts, speed_words


@dataclass(frozen=True)
class Scenario:
    """Controls to set, then run; `runs` > 1 runs a second set of controls after the first (for contrasts)."""

    title: str
    text: str
    runs: tuple[dict[str, Any], ...]
    fills: bool = False  # also run the fill-strategy comparison
    contrast: str = "core"  # what a two-run scenario's runs differ in: "core" or "model" (each run names its own)


# A question whose answer can be checked: 3-shot worked arithmetic, as the generation-accuracy measure asks it
# (d3/research/gentasks.py), raw text. Full depth on SmolLM2 answers "8 times 7 is 56. So the answer is 56."
ARITHMETIC = ("Q: What is 4 plus 3?\nA: 4 plus 3 is 7. So the answer is 7.\n\n"
              "Q: What is 6 times 2?\nA: 6 times 2 is 12. So the answer is 12.\n\n"
              "Q: What is 9 plus 5?\nA: 9 plus 5 is 14. So the answer is 14.\n\n"
              "Q: What is 8 times 7?\nA:")
ASK = {"prompt": ARITHMETIC, "chat_template": False, "max_new_tokens": 24}
EXPLAIN_PROMPT = "Explain in a few sentences why the sky looks blue during the day."
# The same D3 setting on SmolLM2 (30 layers) and on Qwen2.5-Coder-1.5B (28): the worked arithmetic question, the
# paper's middle-out order, α 0.99, so that both run about 88% of their depth per token over the run. Measured
# (docs/models.md, tests/test_scenarios_deep.py): SmolLM2 at 26.3 of 30 layers answers 11, not full depth's 56.
DEEP_ALPHA = 0.99
DEEP = {**ASK, "alpha": DEEP_ALPHA, "drop_order": "middle_out", "layer_order": "", "start": 0}


SCENARIOS: dict[str, Scenario] = {
    "full_vs_d3": Scenario(
        "Full depth vs D3",
        "The page's D3 setting for this model (on SmolLM2: α = 0.998 and the drop order measured best on its "
        "arithmetic, which drops layers 4, 5 and 6 first; see Which layers matter) on a worked arithmetic question. D3 runs fewer layers per token. "
        "On SmolLM2 it states the same answer as full depth and its text stays the same while its tokens get "
        "lighter (the colour scale spans the run's own depths, there 28 to 30 of 30 layers); on another model the "
        "finding below says whether, and at which token, its text first leaves full depth's. At so few skipped layers the "
        "time saved is smaller than a shared CPU's noise: the counters say \u201ctoo small to measure here\u201d beside "
        "the theoretical speedup, rather than a number noise made.",
        (ASK,)),
    "core": Scenario(
        "Why the core layers matter",
        "Two runs of the arithmetic question with α = 0.99 and drop order *bottom-up*, so the lowest flex layers are "
        "dropped first: first with the default core, then with core 0 + 0, so that layer 0 is the first to go. The "
        "first layers turn token embeddings into what every later layer reads (they change the hidden state the "
        "most, see Information flow). On SmolLM2 and Qwen2.5-Coder, with a core D3 keeps the answer and without it "
        "the text is lost at once; the finding below says how long each run kept full depth's text on this model.",
        ({**ASK, "alpha": 0.99, "drop_order": "bottom_up"},
         {**ASK, "alpha": 0.99, "drop_order": "bottom_up", "core_head": 0, "core_tail": 0})),
    "fill": Scenario(
        "What filling does",
        "Drop order 'strided' keeps evenly spaced flex layers, so a layer skipped by one token can run again "
        "for a later token and read that token's missing key/value entry. Filling decides what it reads. "
        "This runs fill 'none' (the hole is masked out) in the panes at α = 0.99, then compares copy, propagate and "
        "none on the same prompt (Fill strategies tab). On SmolLM2 *copy* turns the text to nonsense (full depth "
        "finds it about 15x less likely than *propagate*'s), *propagate* keeps it readable; the finding below gives "
        "each fill's numbers on this model. With a nested drop order "
        "no later token ever reads a hole, so the fill would make no difference.",
        ({"prompt": EXPLAIN_PROMPT, "chat_template": True, "max_new_tokens": 32, "alpha": 0.99,
          "drop_order": "strided", "fill": "none"},), fills=True),
    "aggressive": Scenario(
        "Aggressive α: where it breaks",
        "The same arithmetic question at α = 0.9, which halves the depth within about 7 tokens and reaches the core "
        "floor soon after: the answer is lost within the first tokens (compare Full depth vs D3, where a gentle α "
        "keeps it). See where the first divergence lands and how the KL grows.",
        ({**ASK, "alpha": 0.9},)),
    "deeper": Scenario(
        "D3 on a deeper model",
        f"The same D3 setting (α = {DEEP_ALPHA}, the paper's middle-out order, the default core) on the worked "
        "arithmetic question, first on SmolLM2-135M (30 layers), then on Qwen2.5-Coder-1.5B-Instruct (28 layers, "
        "1.5B parameters against 135M). The paper's regime is 7B and up, where depth is redundant. SmolLM2 is too shallow for "
        "it: at about 88% of its layers per token it loses full depth's answer, while the deeper model keeps it at "
        "the same share of its layers. The finding names the layers per token and where each text first left full "
        "depth's. The second run loads Qwen (a first use converts it for minutes, its progress in the status line; "
        f"when it is not installed: `{KNOWN_MODELS[QWEN_CODER].install}`), and streams at about a token per second "
        "on a CPU.",
        ({**DEEP, "model": "smollm2-135m"}, {**DEEP, "model": QWEN_CODER}), contrast="model"),
}
# The controls every scenario sets (the page's D3 setting for the model, then each run's changes).
SCENARIO_CONTROLS = ("prompt", "chat_template", "max_new_tokens", "strategy", "alpha", "core_head", "core_tail", "start",
                     "drop_order", "layer_order", "fill", "decoding")


def offered(names: tuple[str, ...]) -> dict[str, Scenario]:
    """The scenarios a page serving the models `names` can run: one whose run names a model must find it there (the
    deeper-model scenario needs SmolLM2 and Qwen; a page without them shows no button that cannot run)."""
    return {key: s for key, s in SCENARIOS.items() if all(run.get("model", names[0]) in names for run in s.runs)}


def scenario_controls(key: str, step: int, num_layers: int, model: Any = None) -> dict[str, Any]:
    """The control values of run `step` of scenario `key`: the page's D3 setting for `model` with the scenario's
    changes."""
    scenario = SCENARIOS[as_choice("scenario", key, tuple(SCENARIOS))]
    run = scenario.runs[min(step, len(scenario.runs) - 1)]
    if "model" in run:  # the run names its model: its layers are that model's
        model, num_layers = run["model"], run_layers(run, num_layers)
    head, tail = default_core(num_layers)
    page = model_defaults(model, "arithmetic" if run.get("prompt") == ARITHMETIC else "chat")  # the text's own order
    defaults = {name: getattr(page, name) for name in SCENARIO_CONTROLS} | {"core_head": head, "core_tail": tail}
    return {**defaults, **run}


def run_layers(run: dict[str, Any], num_layers: int) -> int:
    """The layers of the model a scenario's run names (the current model's `num_layers` when it names none)."""
    known = KNOWN_MODELS.get(run.get("model", ""))
    return known.facts.num_layers if known is not None else num_layers


def scenario_text(key: str, step: int) -> str:
    """What the scenario shows, in Markdown, with which of its runs this is."""
    scenario = SCENARIOS[key]
    text = f"**{scenario.title}** — {scenario.text}"
    if len(scenario.runs) > 1:
        text += f"\n\n*Run {step + 1} of {len(scenario.runs)}.*"
    return text


def _one_run(summary: dict[str, Any], num_layers: int) -> str:
    """One run's numbers: its depth, its count against full depth (`viz.stream.count_words`, over the tokens both
    runs wrote) and its measured speed read against theory (`speed_reading`)."""
    counts = full_counts(summary)
    first = counts["first_divergence"]
    where = "never diverged" if first is None else f"first divergence at token {first}"
    name = short_label({"strategy": summary.get("strategy", "d3")})
    agreement = counts["agreeing"] / counts["compared"] if counts["compared"] else 1.0
    return (f"{summary['mean_layers']:.1f} of {num_layers} layers per token ({summary['theoretical_speedup']:.2f}× "
            f"fewer layer runs), agreement with full depth {agreement:.2f} "
            f"({count_words(counts, name)}), {where}{speed_reading(summary)}")


def speed_reading(summary: dict[str, Any]) -> str:
    """The run's measured speed read against theory, as a clause (", measured 1.32×: above its theoretical 1.14×: a
    timing artefact, not a speedup"), or "" where the run measured none."""
    ratio = summary.get("measured_speedup")
    if ratio is None or not math.isfinite(ratio):
        return ""
    # read against the whole run's theoretical speedup, as measured over the whole run: a run cut to the tokens both
    # runs of a contrast wrote keeps its whole run's measured speedup, which its first tokens' theory does not bound
    reading = speed_words(ratio, summary.get("measured_speedup_low"), summary.get("measured_speedup_high"),
                          summary.get("speed_theoretical", summary.get("theoretical_speedup")))
    if reading == "within timing noise":
        return ", measured speed too small to tell from timing noise here"
    return f", measured {ratio:.2f}×" + (f": {reading}" if reading else "")


def first_tokens(summary: dict[str, Any], n: int, num_layers: int) -> dict[str, Any]:
    """A run's summary over its first `n` tokens only, from its per-token `layers` and `agree` (when it has them),
    so that two runs of different lengths are compared at the same positions."""
    layers, agree = summary.get("layers"), summary.get("agree")
    if not layers or n >= len(layers):
        return summary
    mean = sum(layers[:n]) / n
    same = list(agree[:n]) if agree is not None else []
    full = full_counts(summary)["full_tokens"]
    return {**summary, "tokens": n, "mean_layers": mean, "theoretical_speedup": num_layers / mean,
            "speed_theoretical": summary.get("speed_theoretical", summary.get("theoretical_speedup")),
            "agreement": sum(same) / len(same) if same else 1.0, "compared": len(same), "agreeing": sum(same),
            "full_tokens": min(full, n), "ended_first": "full" if full < n and summary.get("ended_first") else "",
            "first_divergence": same.index(False) if False in same else None, "agree": tuple(same)}


def _quoted_text(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    text = text if len(text) <= limit else text[:limit].rstrip() + "…"
    return "“" + text.replace("*", "\\*").replace("_", "\\_").replace("~", "\\~") + "”"  # ~ would strike text through


INTERRUPTED = "*The scenario was interrupted before all its runs finished: click it again to see its numbers.*"


def scenario_finding(key: str, summaries: list[dict[str, Any]], num_layers: int, model: str = "") -> str:
    """What the scenario's runs showed, in numbers (Markdown): `summaries` are its runs' history summaries, in order
    (with `layers`, `agree` and `text` where known, `RunRecord.detail`). Runs of different lengths (one stopped at
    its end-of-text token) are compared over the tokens both wrote, and each run's text is quoted, so the first
    stays visible after the second has replaced it in the panes. `model` is named, so the numbers still say whose
    they are after the page switches to another model."""
    scenario = SCENARIOS[key]
    if len(summaries) < len(scenario.runs):
        return INTERRUPTED
    on = f" on {model}" if model else ""
    if len(scenario.runs) == 1:
        return f"**This run{on}:** {_one_run(summaries[-1], num_layers)}."
    runs = summaries[-len(scenario.runs):]
    n = min(s["tokens"] for s in runs)
    lengths = [s["tokens"] for s in runs]
    equal = [first_tokens(s, n, num_layers) for s in runs]
    rows = []
    for step, (summary, shown) in enumerate(zip(runs, equal)):
        c = scenario_controls(key, step, num_layers)
        layers = run_layers(scenario.runs[step], num_layers)
        which = f"on {c['model']}" if scenario.contrast == "model" else f"core {c['core_head']} + {c['core_tail']}"
        rows.append(f"- **run {step + 1}, {which}:** {_one_run(shown, layers)}"
                    + (f"\n  <br>wrote {_quoted_text(summary['text'])}" if summary.get("text") else ""))
    if scenario.contrast == "model":
        on = ""  # each row names its model
    over = on + (f" (compared over the first {n} tokens of each: the runs wrote {' and '.join(map(str, lengths))})"
            if len(set(lengths)) > 1 else "")
    lead = _deeper_lead(scenario, equal, num_layers) if scenario.contrast == "model" else _lead(*equal[-2:])
    return f"**These runs{over}:**\n" + "\n".join(rows) + f"\n\n{lead}"


def _deeper_lead(scenario: Scenario, runs: list[dict[str, Any]], num_layers: int) -> str:
    """The contrast of the deeper-model scenario in one sentence: how far each model's D3 kept full depth's text,
    and at what share of its depth."""
    (shallow, deep), (a, b) = runs[-2:], scenario.runs[-2:]
    far = lambda s: s["tokens"] if s["first_divergence"] is None else s["first_divergence"]  # noqa: E731
    share = lambda s, run: s["mean_layers"] / run_layers(run, num_layers)  # noqa: E731
    kept = f"all {deep['tokens']} tokens" if deep["first_divergence"] is None else f"{far(deep)} tokens"
    if far(deep) > far(shallow):
        return (f"At {share(deep, b):.0%} of its depth per token, {b['model']} kept full depth's text for **{kept}**; "
                f"at {share(shallow, a):.0%} of its, {a['model']} left it at token {far(shallow)}.")
    return (f"Here {b['model']} left full depth's text no later than {a['model']} (token {far(deep)} against "
            f"{far(shallow)}): try another prompt.")


def _lead(with_core: dict[str, Any], without: dict[str, Any]) -> str:
    """The contrast of the core scenario's two runs in one sentence."""
    far = lambda s: s["tokens"] if s["first_divergence"] is None else s["first_divergence"]  # noqa: E731
    gain = far(with_core) - far(without)
    if gain > 0:
        return f"With the core, D3 stayed on full depth's text **{gain} tokens longer**."
    return ("Here both runs left full depth's text equally soon: try another prompt, or more tokens, to see the "
            "core keep D3 on track for longer.")


def fill_finding(fills: dict[str, Any]) -> str:
    """The fill scenario's numbers: agreement and first divergence under each fill (Markdown)."""
    parts = []
    for name, comparison in fills.items():
        s = comparison.summary()
        first = "never diverged" if s["first_divergence"] is None else f"first divergence at token {s['first_divergence']}"
        parts.append(f"- fill *{name}*: agreement {s['agreement']:.2f}, {first}, full-depth perplexity of its text "
                     f"{s['full_ppl_of_skip']:.1f}")
    return "**These runs** (same schedule, each fill):\n" + "\n".join(parts)
