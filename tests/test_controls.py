"""explorer/controls.py: the one state of the Live tab's controls and what is derived from it (issue 24)."""

from __future__ import annotations

import gradio as gr
import numpy as np
import pytest

from d3.config import D3Config
from d3.orders import CHAT_ORDERS, MEASURED
from d3.schedule import plan
from explorer.caps import Caps
from explorer.controls import (
    DEFAULTS,
    OWN_FILL,
    both_words,
    check_sliders,
    default_attention_layer,
    derived,
    fitted,
    model_defaults,
    page_words,
    parse_layer_order,
    parse_strategy,
    refit_order,
    slider_ranges,
)
from explorer.parse import as_choice, as_number
from explorer.pool import ModelPool
from explorer.runs import check_run
from explorer.ui import user_errors
from tests.apphelpers import tiny_factory

SMOL = "smollm2-135m"


@pytest.mark.parametrize("head, tail", [(10, 3), (2, 3), (3, 5), (0, 0), (3, 26)])
def test_a_calibrated_order_follows_any_core_and_the_run_is_valid(head, tail) -> None:
    """No dead end: the page's calibrated order for core 3 + 3, under another core, parses into a valid D3 config
    whose order is the old one restricted to the new flex layers, in the same order (then the freed layers)."""
    c = model_defaults(SMOL).with_(core_head=head, core_tail=tail)
    cfg = parse_strategy(c, 30, Caps())
    assert isinstance(cfg, D3Config) and sorted(cfg.layer_order) == list(range(head, 30 - tail))
    old = parse_layer_order(c.layer_order, 30)
    kept = [layer for layer in old if head <= layer < 30 - tail]
    assert list(cfg.layer_order[:len(kept)]) == kept
    fixed, note = fitted(c, 30)
    assert note.startswith(f"Calibrated order re-fitted to core {head} + {tail}") and "\n" not in note
    assert parse_layer_order(fixed.layer_order, 30) == cfg.layer_order


def test_the_measured_order_for_a_core_is_used_where_one_ships() -> None:
    away = refit_order(MEASURED[SMOL][(3, 3)], SMOL, 30, 5, 5, "arithmetic")
    back = refit_order(away, SMOL, 30, 3, 3, "arithmetic")
    assert back == MEASURED[SMOL][(3, 3)]  # not the drifted one: the measured order for this core
    assert refit_order(away, SMOL, 30, 3, 3) == CHAT_ORDERS[SMOL][(3, 3)]  # on chat text, the chat order


def test_an_order_that_fits_is_left_alone_and_junk_is_refused_with_what_to_type() -> None:
    c = model_defaults(SMOL)
    assert fitted(c, 30) == (c, "")
    with pytest.raises(ValueError, match="type the flex layers"):
        parse_strategy(c.with_(layer_order="3, x"), 30, Caps())
    with pytest.raises(ValueError, match="permutation"):
        parse_strategy(c.with_(layer_order="3, 3, 4"), 30, Caps())  # repeated layers: not re-fitted


def test_a_calibrated_order_of_another_model_follows_the_model() -> None:
    """A link to Gemma 3 that keeps SmolLM2's order (30 layers) runs Gemma 3's measured order for its core."""
    c = model_defaults(SMOL).with_(model="gemma3-270m", core_head=2, core_tail=2)
    assert parse_strategy(c, 18, Caps()).layer_order == MEASURED["gemma3-270m"][(2, 2)]


def test_the_core_sliders_ranges_derive_from_the_state() -> None:
    c = model_defaults(SMOL).with_(core_head=5, core_tail=7)
    ranges = slider_ranges(c, 30, Caps())
    assert ranges["core_head"][:2] == (0, 22) and ranges["core_tail"][:2] == (0, 24)
    assert derived(c, 30, Caps()) == {"core_head": {"maximum": 22, "interactive": True},
                                      "core_tail": {"maximum": 24, "interactive": True}}


def test_a_value_typed_out_of_range_is_said_with_the_pages_label_and_the_sliders_real_range() -> None:
    with pytest.raises(ValueError) as err:
        check_sliders(model_defaults(SMOL).with_(core_head=99, core_tail=3), 30, Caps())
    assert str(err.value) == "Core head=99 is out of range: Core head must be an integer in [0, 26]"
    assert page_words("max_new_tokens=0 is out of range: max_new_tokens must be an integer in [1, 64]") == \
        "New tokens=0 is out of range: New tokens must be an integer in [1, 64]"


def test_a_toast_names_each_field_for_the_page_and_for_the_api() -> None:
    """A raised gr.Error reaches a person on the page and an API caller alike: each field by its label and its
    parameter name; the label that is its name once."""
    assert both_words("alpha='x' is not a number; max_new_tokens must be an integer in [1, 64]; prompt is empty") == \
        "α (decay rate, alpha)='x' is not a number; New tokens (max_new_tokens) must be an integer in [1, 64]; " \
        "Prompt is empty"
    with pytest.raises(gr.Error) as err, user_errors():
        raise ValueError("sweep_tokens must be an integer in [2, 24]")
    assert err.value.message == "New tokens per run (sweep_tokens) must be an integer in [2, 24]"


# ---------------------------------------------------------------- derived from d3.config's registry (issue 23)


def test_the_pages_defaults_labels_help_and_strategies_come_from_the_configs(tiny_engine) -> None:
    """Each control that is a config field takes its default, label and help from the field's Param (d3.config),
    and the strategy picker's names from each strategy's label: nothing is restated on the page."""
    from d3.config import params
    from explorer.controls import DEFAULTS, FIELDS, STRATEGIES, STRATEGY_LABELS
    from explorer.page import build_demo

    demo = build_demo(lambda _: tiny_engine, model_names=("tiny",), public=False)
    # the page's number box says 0 for the config's None; its one fill control holds each strategy's own default
    page_auto = {"skipdecode_max": 0, "skipdecode_min": 0, "fill": OWN_FILL, "layer_order": ""}
    for name, (cls, key) in FIELDS.items():
        p = params(cls)[key]
        if name not in ("temperature", "core_head", "core_tail"):  # sampling's own default; the model's core
            assert getattr(DEFAULTS, name) == page_auto.get(name, p.default), name
        component = demo.ui[name]
        assert component.label == p.label and component.info.startswith(p.help[:40]), name
    assert STRATEGY_LABELS == {cls.name: cls.label for cls in STRATEGIES}
    assert [label for label, _ in demo.ui["strategy"].choices] == list(STRATEGY_LABELS.values())


@pytest.mark.parametrize("name, value", [("seed", 2**32), ("seed", 2**31), ("unified_ratio", 65), ("threshold", 0),
                                         ("alpha", 1.01)])
def test_a_values_range_is_the_configs(name, value) -> None:
    """The page's checks are the config's ranges (the seed once stopped at 2**31 - 1 on the page, 2**63 in the
    config): a value the config takes, the page takes; one it refuses, the page refuses with the same range."""
    from explorer.controls import FIELDS, param_of

    cls, key = FIELDS[name]
    p = param_of(name)
    c = model_defaults(SMOL).with_(**{name: value}, strategy={"unified_ratio": "unified", "threshold": "early_exit"}
                                   .get(name, "d3"), decoding="sample")
    try:
        parse_strategy(c, 30, Caps()), c.generation(Caps())
        accepted = True
    except ValueError as err:
        accepted = False
        assert p.allowed().split(" (")[0].split(" in ")[-1] in str(err), (str(err), p.allowed())
    assert accepted == p.ok(value)


HUGE = "3," * 200_000  # 400 KB: the order that took 97.7 s to refuse


def test_an_order_is_bounded_by_the_models_layers_before_it_is_split() -> None:
    with pytest.raises(ValueError, match=r"layer_order is 400,000 characters long: at most 240 for this model's 30"):
        parse_layer_order(HUGE, 30)
    with pytest.raises(ValueError, match=r"layer_order has 31 entries: at most this model's 30 layers"):
        parse_layer_order(["3"] * 31, 30)
    with pytest.raises(ValueError, match=r"layer_order has 200,000 entries"):
        parse_layer_order([3] * 200_000, 30)
    assert parse_layer_order(" 4, 5 6,", 30) == (4, 5, 6)


def test_a_layer_number_of_thousands_of_digits_is_one_plain_line() -> None:
    with pytest.raises(ValueError, match=r"layer_order is 5,000 characters long"):
        parse_layer_order("9" * 5000, 30)
    with pytest.raises(ValueError) as err:
        parse_layer_order("4, " + "9" * 200, 30)
    message = str(err.value)
    assert message.startswith("layer_order: with drop order 'calibrated'") and "4300" not in message
    assert "\n" not in message and len(message) < 300
    with pytest.raises(ValueError, match=r"alpha is 5,000 characters long, not a number"):
        as_number("alpha", "9" * 5000, 0, 1)
    with pytest.raises(ValueError, match=r"strategy=<an integer of about 5,000 digits> is not allowed"):
        as_choice("strategy", 10**5000, ("d3",))


def test_the_handler_refuses_a_200000_entry_order_at_its_length(tiny_engine) -> None:
    """The run's own validation, as `/generate` and the schedule redraw call it: refused by its length (timing:
    scripts/bench_hardening.py)."""
    pool = ModelPool(tiny_factory(tiny_engine), names=("tiny",), caps=Caps())
    controls = DEFAULTS.with_(prompt="hi", model="tiny", drop_order="calibrated", layer_order=HUGE)
    with pytest.raises(ValueError, match=r"layer_order is 400,000 characters long: at most \d+ for this model's"):
        check_run(pool, controls)
    with pytest.raises(ValueError, match=r"layer_order has 200,000 entries"):
        check_run(pool, controls.with_(layer_order=[3] * 200_000))


@pytest.mark.parametrize("layers", [30, 18])  # SmolLM2-135M and Gemma 3 270M
def test_the_default_attention_layer_runs_for_most_default_d3_tokens_and_is_dropped_later(layers) -> None:
    layer = default_attention_layer(layers)
    cfg = D3Config(alpha=DEFAULTS.alpha)
    ran = [layer in plan(cfg, layers, i).run for i in range(DEFAULTS.max_new_tokens)]
    assert 0.6 <= np.mean(ran) < 1  # most rows show the head at work, the last ones are grey
    assert ran[0]  # not the first layer the schedule drops (skipped from token 1: a blank panel)


def test_the_default_attention_layer_is_one_the_default_schedule_skips() -> None:
    layer = default_attention_layer(30)
    cfg = D3Config(alpha=0.99)
    skipped_at = [i for i in range(64) if layer not in plan(cfg, 30, i).run]
    assert skipped_at  # grey rows appear within the default run (issue 17: and most rows show attention)


@pytest.mark.parametrize("name, value", [("threshold", float("nan")), ("unified_ratio", {"a": 1}),
                                         ("skipdecode_max", "9" * 250_000), ("alpha", float("inf")),
                                         ("start", [1]), ("layer_order", "1," * 125_000), ("layer_order", {"x": 1})],
                         ids=["nan", "dict", "250k-digits", "inf", "list", "250kB-order", "dict-order"])
def test_a_field_the_chosen_strategy_does_not_use_takes_no_junk(name, value) -> None:
    """D3 is chosen, so the baselines' fields are not read; they are still checked against their field's range, and
    the calibrated order's box (unused with middle_out) by its length and type (issue 36, item 9)."""
    strategy = "unified" if name in ("alpha", "start", "layer_order") else "d3"
    c = DEFAULTS.with_(strategy=strategy, drop_order="middle_out", **{name: value})
    with pytest.raises(ValueError, match=name):
        parse_strategy(c, 30, Caps())


@pytest.mark.parametrize("strategy", ["d3", "skipdecode", "unified", "early_exit"])
def test_the_fill_control_gives_each_strategy_its_own_default_fill(strategy) -> None:
    from d3.config import STRATEGIES

    cfg = parse_strategy(DEFAULTS.with_(strategy=strategy), 30, Caps())
    assert cfg.fill == STRATEGIES[strategy]().fill  # early exit: propagate, the others: copy
    assert parse_strategy(DEFAULTS.with_(strategy=strategy, fill="none"), 30, Caps()).fill == "none"


def test_the_page_and_the_engine_share_the_core_rule() -> None:
    """head + tail <= L - 1 on the page's sliders and in the engine's check alike (d3.config.core_fits)."""
    from d3.config import core_fits

    for head, tail in ((0, 29), (29, 0), (15, 15), (14, 15), (3, 3)):
        c = DEFAULTS.with_(core_head=head, core_tail=tail)
        ranges = slider_ranges(c, 30, Caps())
        page_ok = head <= ranges["core_head"][1] and tail <= ranges["core_tail"][1]
        try:
            D3Config(core_head=head, core_tail=tail).check_layers(30)
            engine_ok = True
        except ValueError:
            engine_ok = False
        assert page_ok == engine_ok == core_fits(head, tail, 30), (head, tail)


# ---------------------------------------------------------------- issue 43: a new field in one place


NEW_FIELD = '''    warmup_layers: int = param(0, "Warm-up layers", "layers every token runs at least (0: none)", lo=0,
                               integer=True, show="warm-up {}")
'''
# What the newcomer's field does to the schedule: a floor under the decay (the one edit outside the config).
NEW_BUDGET = "max(raw_decay(cfg.alpha, num_layers, step, cfg.start), head + tail, cfg.warmup_layers, 1)"
# Run in a copy of the package with the field added: the page grows its control, a share link carries it, the CLI has
# its flag, and the decay curve (the server's, which the browser's preview leaves it to) follows it.
NEW_FIELD_CHECKS = r'''
import json, sys
from urllib.parse import parse_qsl
from d3.config import D3Config, params
from d3.cli import build_parser
from d3.engine import Engine
from d3.testing import tiny_llama, tiny_tokenizer
from explorer.caps import Caps
from explorer.controls import CONTROL_NAMES, CONTROLS, DEFAULTS, GROWN, PREVIEW_IDS, parse_strategy
from explorer.page import build_demo
from explorer.share import controls_from_query, controls_query
from explorer.view_handlers import redraw_schedule
from explorer.wiring import SETTLED_CONTROLS, preview_js

engine = Engine(tiny_llama(30), tiny_tokenizer(), name="tiny")
demo = build_demo(lambda name: engine, model_names=("tiny",), public=False, caps=Caps(max_new_tokens=64))
pool, ui = demo.pool, demo.ui
c = DEFAULTS.with_(model="tiny", prompt="hi", alpha=0.9, core_head=1, core_tail=1, warmup_layers=20)
cfg = parse_strategy(c, 30, pool.caps)
query = controls_query(c)
back = controls_from_query(pool, dict(parse_qsl(query[1:])))
decay, _ = redraw_schedule(pool, None, **{n: getattr(c, n) for n in CONTROL_NAMES})
planned = next(t for t in decay.data if (t.meta or {}).get("role") == "planned")
generate = next(fn for fn in demo.fns.values() if fn.api_name == "generate")
from d3.cli import strategy_from_args
args = build_parser().parse_args(["generate", "--prompt", "hi", "--warmup-layers", "7"])
print(json.dumps({
    "grown": list(GROWN), "label": ui["warmup_layers"].label if "warmup_layers" in ui else None,
    "in_generate": ui.get("warmup_layers") in generate.inputs, "settles": "warmup_layers" in SETTLED_CONTROLS,
    "cfg": cfg.warmup_layers, "query": query, "back": back.get("warmup_layers"),
    "cli": strategy_from_args(args).warmup_layers, "planned_min": int(min(planned.y)),
    "meta": decay.layout.meta["d3_schedule"]["fields"].get("warmup_layers"),
    "default": decay.layout.meta["d3_schedule"]["defaults"].get("warmup_layers"),
    "preview": "warmup_layers" in preview_js(),
}))
'''


def test_a_field_added_to_d3s_config_and_schedule_is_on_the_page_in_links_in_the_cli_and_the_curve(tmp_path) -> None:
    """Issue 43's done-when: a newcomer adds a strategy field in the config and the schedule only (here a floor of
    warm-up layers), in a copy of the package run in a subprocess; the page grows its control (a box, wired into
    Generate and the settling of the controls), the run parses it, a share link round-trips it, the CLI has its
    flag and the decay curve's budget follows it (drawn by the server: the browser's preview, whose formula does not
    know the field, leaves the curve alone while it is off its default)."""
    import json
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for package in ("d3", "explorer", "viz", "assets"):
        shutil.copytree(root / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    config = tmp_path / "d3" / "config.py"
    text = config.read_text(encoding="utf-8")
    anchor = "    drop_order: str = param(\"middle_out\""
    assert anchor in text
    config.write_text(text.replace(anchor, NEW_FIELD + anchor, 1), encoding="utf-8")
    schedule = tmp_path / "d3" / "schedule.py"
    text = schedule.read_text(encoding="utf-8")
    old = "max(raw_decay(cfg.alpha, num_layers, step, cfg.start), head + tail, 1)"
    assert old in text
    schedule.write_text(text.replace(old, NEW_BUDGET, 1), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", NEW_FIELD_CHECKS], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["grown"] == ["warmup_layers"] and seen["label"] == "Warm-up layers", seen
    assert seen["in_generate"] and seen["settles"], seen
    assert seen["cfg"] == 20 and "warmup_layers=20" in seen["query"] and seen["back"] == 20, seen
    assert seen["cli"] == 7, seen  # the flag, parsed into the config
    assert seen["planned_min"] == 20 and seen["meta"] == 20 and seen["default"] == 0, seen
    assert seen["preview"], seen  # the browser's preview reads its box: off its default, the curve is the server's
