"""Frozen configs reject bad values with a message naming the field and the allowed range."""

from __future__ import annotations

import dataclasses

import pytest

from d3.config import (
    CONFIDENCE_MEASURES,
    MAX_ATTENTION_LAYERS,
    D3Config,
    EarlyExitConfig,
    GenerationConfig,
    SkipDecodeConfig,
    StrategyConfig,
    TraceConfig,
    UnifiedConfig,
    check_layer_order,
    default_core,
    strategy_from_dict,
)


@pytest.mark.parametrize("make,field", [
    (lambda: D3Config(alpha=1.5), "alpha"),
    (lambda: D3Config(alpha=0), "alpha"),
    (lambda: D3Config(alpha=float("nan")), "alpha"),
    (lambda: D3Config(alpha="0.9"), "alpha"),
    (lambda: D3Config(core_head=-1), "core_head"),
    (lambda: D3Config(start=-3), "start"),
    (lambda: D3Config(fill="zero"), "fill"),
    (lambda: D3Config(drop_order="random"), "drop_order"),
    (lambda: SkipDecodeConfig(max_layers=5, min_layers=9), "min_layers"),
    (lambda: UnifiedConfig(ratio=0.5), "ratio"),
    (lambda: UnifiedConfig(spacing="random"), "spacing"),
    (lambda: EarlyExitConfig(measure="entropy"), "measure"),
    (lambda: GenerationConfig(max_new_tokens=0), "max_new_tokens"),
    (lambda: GenerationConfig(max_new_tokens=10**9), "max_new_tokens"),
    (lambda: GenerationConfig(top_p=0), "top_p"),
    (lambda: TraceConfig(top_k=100), "top_k"),
    (lambda: TraceConfig(attention_layers=tuple(range(MAX_ATTENTION_LAYERS + 1))), "attention_layers"),
])
def test_bad_values_name_the_field(make, field):
    with pytest.raises(ValueError, match=field) as err:
        make()
    assert "must be" in str(err.value)


def test_configs_are_frozen():
    cfg = D3Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.alpha = 0.5  # type: ignore[misc]


def test_core_larger_than_model_is_rejected_for_that_model():
    cfg = D3Config(core_head=20, core_tail=15)
    with pytest.raises(ValueError, match="at most 29: the model's 30 layers less one flex layer"):
        cfg.check_layers(30)
    D3Config(core_head=2, core_tail=2).check_layers(30)


def test_default_core_split():
    assert default_core(30) == (3, 3) and default_core(18) == (2, 2) and default_core(4) == (1, 1)
    assert default_core(3) == (1, 1) and default_core(2) == (0, 0) and default_core(1) == (0, 0)  # a layer to skip
    D3Config().check_layers(1)  # (1, 1) would not fit a one-layer model
    assert D3Config().core(30) == (3, 3) and D3Config(core_head=0).core(30) == (0, 3)


def test_strategy_from_dict_round_trip_and_errors():
    cfg = D3Config(alpha=0.97, fill="propagate")
    assert strategy_from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="strategy"):
        strategy_from_dict({"strategy": "magic"})
    with pytest.raises(ValueError, match="unknown field"):
        strategy_from_dict({"strategy": "d3", "beta": 1})


@pytest.mark.parametrize("cls", [StrategyConfig, D3Config, SkipDecodeConfig, UnifiedConfig, EarlyExitConfig])
def test_docstrings_name_only_real_fields(cls):
    """Every `name:` (or `a / b:`) entry of a config's docstring is one of its fields (or a measure's value)."""
    import re

    named = set()
    for line in cls.__doc__.splitlines()[1:]:
        entry = re.match(r"\s+([a-z_]+(?: / [a-z_]+)*):", line)
        if entry:
            named |= set(entry.group(1).split(" / "))
    if cls is D3Config:  # the parse finds the entries it checks
        assert {"alpha", "core_head", "core_tail", "start", "drop_order", "fill"} <= named
    assert named <= {f.name for f in dataclasses.fields(cls)} | set(CONFIDENCE_MEASURES)


def test_d3_start_docstring_matches_the_schedule():
    from d3.schedule import budgets

    assert "start=5 keeps steps 0-5 at full depth" in D3Config.__doc__.replace("\n", " ")
    assert budgets(D3Config(alpha=0.5, start=5, core_head=0, core_tail=0), 30, 8) == [30] * 6 + [15, 7]


# ---------------------------------------------------------------- the registry: each field's facts said once


def test_every_strategy_field_declares_its_facts_once() -> None:
    """The layer order too (issue 43): its label and help are the registry's, its value its config checks itself."""
    from d3.config import STRATEGIES, params

    for cls in STRATEGIES.values():
        declared = set(params(cls))
        assert declared == {f.name for f in dataclasses.fields(cls)}, cls.name
        for name, p in params(cls).items():
            assert p.label and p.help and p.allowed(), (cls.name, name)
            assert p.ok(p.default), f"{cls.name}.{name}: its default {p.default!r} is outside what it allows"
    assert params(GenerationConfig)["seed"].hi == 2**32 - 1


@pytest.mark.parametrize("cls,name,bad", [
    (D3Config, "alpha", 1.5), (D3Config, "start", -1), (UnifiedConfig, "ratio", 0.5), (EarlyExitConfig, "threshold", 0),
    (SkipDecodeConfig, "warmup", 1.5), (GenerationConfig, "seed", 2**32), (GenerationConfig, "top_p", 0.0),
])
def test_a_config_refuses_what_its_param_refuses_in_the_params_own_words(cls, name, bad) -> None:
    from d3.config import params

    p = params(cls)[name]
    assert not p.ok(bad)
    with pytest.raises(ValueError) as err:
        cls(**{name: bad})
    assert str(err.value) == f"{name}={bad!r} is not allowed: {name} must be {p.allowed()}"


@pytest.mark.parametrize("name", ["d3", "skipdecode", "unified", "early_exit"])
def test_the_page_the_cli_and_custom_generate_run_each_strategy_with_the_registrys_defaults(name, tiny_engine,
                                                                                             monkeypatch) -> None:
    """Every strategy left at its defaults: the page's own run check (its controls at their initial values), the
    CLI's `generate` and custom_generate's keywords build the very config the registry makes (early exit's fill:
    propagate everywhere; the page once ran it with D3's copy). The page sets two fields from the run itself:
    SkipDecode's horizon (the run's length) and early exit's min layers (at most the model's)."""
    from d3.cli import build_parser, strategy_from_args
    from d3.config import STRATEGIES
    from explorer.caps import Caps
    from explorer.controls import DEFAULTS
    from explorer.pool import ModelPool
    from explorer.runs import check_run
    from tests.apphelpers import tiny_factory

    monkeypatch.syspath_prepend("hub/d3-generate")
    from custom_generate import generate as hub

    registry = STRATEGIES[name]()
    pool = ModelPool(tiny_factory(tiny_engine), names=("tiny",), caps=Caps())
    page = check_run(pool, DEFAULTS.with_(prompt="x", model="tiny", strategy=name)).strategy
    layers = tiny_engine.num_layers
    expected = registry
    if isinstance(registry, SkipDecodeConfig):
        expected = registry.with_(horizon=DEFAULTS.max_new_tokens)
    elif isinstance(registry, EarlyExitConfig):
        expected = registry.with_(min_layers=min(registry.min_layers, layers))
    if name == "d3":  # the page sends the model's default core as numbers
        assert page.core(layers) == registry.core(layers)
        page = page.with_(core_head=None, core_tail=None)
    assert page == expected
    cli = strategy_from_args(build_parser().parse_args(["generate", "--prompt", "x", "--strategy", name]))
    assert cli == registry
    assert hub.strategy_from_dict({"strategy": name}) == registry
    assert page.fill == cli.fill == registry.fill == ("propagate" if name == "early_exit" else "copy")


CHANGED_DEFAULT = """
import dataclasses, json, sys
import d3.config as c

@dataclasses.dataclass(frozen=True)
class D3(c.D3Config):  # the one place a default is written, changed
    alpha: float = c.param(0.955, "α (decay rate)", "a changed default", lo=0, hi=1, lo_open=True)
    start: int = c.param(7, "Start", "a changed default", lo=0, integer=True, unit="tokens")

c.D3Config = D3
c.STRATEGIES["d3"] = D3
sys.path.insert(0, "hub/d3-generate")
from d3.cli import build_parser, strategy_from_args
from custom_generate import generate as hub

parser = build_parser()
args = parser.parse_args(["generate", "--prompt", "x"])
sub = next(a for a in parser._subparsers._group_actions[0].choices["generate"]._actions if a.dest == "alpha")
cli = strategy_from_args(args)
kw = hub.strategy_from_dict({"strategy": "d3", **{k: v for k, v in {"fill": "copy"}.items() if k in hub.STRATEGY_FIELDS}})
from explorer.controls import DEFAULTS, HELP
print(json.dumps({"page": [DEFAULTS.alpha, DEFAULTS.start], "page_help": HELP["alpha"],
                  "cli": [cli.alpha, cli.start], "cli_help": sub.help, "hub": [kw.alpha, kw.start],
                  "hub_knows": sorted(n for n in ("alpha", "start") if n in hub.STRATEGY_FIELDS)}))
"""


def test_a_default_changed_in_the_config_reaches_the_page_the_cli_and_custom_generate() -> None:
    """Change D3's defaults in the one place they are written (d3.config), and the page's controls, the CLI's flags
    (their values and help) and custom_generate's keywords follow without another edit."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", CHANGED_DEFAULT], cwd=root, capture_output=True, text=True,
                         timeout=300, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["page"] == [0.955, 7] and got["cli"] == [0.955, 7] and got["hub"] == [0.955, 7]
    assert got["page_help"] == "a changed default"
    assert "default 0.955" in got["cli_help"] and "a changed default" in got["cli_help"]
    assert got["hub_knows"] == ["alpha", "start"]

def test_a_calibrated_order_is_checked_by_its_length_first_and_in_one_pass() -> None:
    """20,000 entries took seconds to refuse (each entry was counted in the whole list); the length refuses them,
    and a short order's problems are still all named."""
    with pytest.raises(ValueError, match=r"layer_order has 20,000 entries: at most this model's 30 layers"):
        check_layer_order((3,) * 20_000, 30, 3, 3)
    with pytest.raises(ValueError, match=r"missing \[5\]; not flex layers \[1\]; repeated \[3\]"):
        check_layer_order((3, 3, 4, 1), 7, 3, 1)
