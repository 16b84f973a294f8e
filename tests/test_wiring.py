"""explorer/wiring.py: which event calls which handler. The rule of issue 24: a person's move (`.input`, a slider's
`.release`) starts handlers; the server setting a control starts nothing, so no `.change` listener sits on a
control, and whatever sets controls redraws what follows from them itself."""

from __future__ import annotations

import pytest

from explorer import page
from explorer.controls import CONTROL_NAMES


@pytest.fixture(scope="module")
def demo(tiny_engine):
    return page.build_demo(lambda _: tiny_engine, model_names=("tiny",), public=False)


def _keys(demo) -> dict[int, str]:
    return {component._id: key for key, component in demo.ui.items() if hasattr(component, "_id")}


def _handler(fn) -> str:
    f = getattr(fn.fn, "func", fn.fn)
    return getattr(f, "__name__", str(f))


def test_no_handler_listens_to_a_controls_change(demo) -> None:
    """The server's own updates of the controls (a scenario, a model switch, a bound, a re-fitted order) must start
    no handler: only a person's move does. (Issue 24: the core sliders once fed three handlers for minutes.)"""
    keys = _keys(demo)
    listened = [(keys[t], _handler(fn)) for fn in demo.fns.values() for t, event in fn.targets
                if event == "change" and keys.get(t) in (*CONTROL_NAMES, "scrub_index")]
    assert not listened, f"handlers on a control's change: {listened}"


def test_what_follows_from_the_controls_is_set_by_one_handler_on_a_persons_moves(demo) -> None:
    keys = _keys(demo)
    settle = [fn for fn in demo.fns.values() if _handler(fn) in ("settle_controls", "settle_released")]
    assert len(settle) == 2
    assert {event for fn in settle for _, event in fn.targets} == {"input", "release"}
    for fn in settle:
        assert {keys[o._id] for o in fn.outputs} == {"core_head", "core_tail", "layer_order", "status"}


def test_a_slider_let_go_runs_only_after_its_value_is_checked(demo) -> None:
    checks = [fn for fn in demo.fns.values() if _handler(fn) == "check_release"]
    assert len(checks) == 1 and checks[0].trigger_only_on_success
    generates = [fn for fn in demo.fns.values() if fn.api_name == "generate_on_release"]
    assert generates and all(fn.trigger_after is not None for fn in generates)


def test_a_scenarios_later_steps_run_only_while_it_goes_on(demo) -> None:
    """Issue 24, a scenario clicked during another's runs: each run of a scenario follows its controls' step only on
    success (the step refuses when something else was asked for since, `Session.start_scenario`), and a click of
    the same scenario during its run defers its run (always_last) instead of dropping it (once)."""
    fns = {fn._id: fn for fn in demo.fns.values()}
    runs = [fn for fn in demo.fns.values()
            if str(fn.api_name).startswith(("generate_scenario_", "compare_fills_scenario"))]
    assert len(runs) >= 5
    for fn in runs:
        before = fns[fn.trigger_after]
        assert fn.trigger_only_on_success and fn.trigger_mode == "always_last", fn.api_name
        assert _handler(before) in ("apply_scenario", "scenario_goes_on"), (fn.api_name, _handler(before))


def test_every_click_of_stop_is_sent(demo) -> None:
    """The page drops a click of a "once" event while an earlier one is in flight: Stop must always answer."""
    stops = [fn for fn in demo.fns.values() if fn.api_name == "stop"]
    assert len(stops) == 1 and stops[0].trigger_mode == "multiple" and not stops[0].queue
