"""The Live tab's controls parsed into configs: bounded before any work, whatever an API call sends."""

from __future__ import annotations

import pytest

from explorer.caps import Caps
from explorer.controls import DEFAULTS, parse_layer_order
from explorer.parse import as_choice, as_number
from explorer.pool import ModelPool
from explorer.runs import check_run
from tests.test_app import tiny_factory

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
