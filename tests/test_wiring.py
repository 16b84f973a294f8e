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
    """settle_controls / settle_released are the only handlers that set the core sliders' bounds after a move, and
    each follows a person's moves: on a control's input or release, or first after one (explorer/moves.py)."""
    keys, fns = _keys(demo), {fn._id: fn for fn in demo.fns.values()}
    settle = [fn for fn in demo.fns.values() if _handler(fn) in ("settle_controls", "settle_released")]
    assert {_handler(fn) for fn in settle} == {"settle_controls", "settle_released"}
    triggers = {event for fn in settle for fn in (fn, fns.get(fn.trigger_after)) if fn is not None
                for _, event in fn.targets}
    assert triggers == {"input", "release"}
    for fn in settle:
        assert {keys[o._id] for o in fn.outputs} == {"core_head", "core_tail", "layer_order", "status"}
    released = [fn for fn in settle if _handler(fn) == "settle_released"]
    assert all(fn.trigger_after is None for fn in released)  # first after a release: its bounds before anything else


def test_each_trigger_starts_one_event(demo) -> None:
    """Issue 24's storm: gradio's page defers an always_last event triggered while in flight and, once it completes,
    dispatches the trigger again to every event on it; two such events on one trigger re-trigger each other
    forever (57, 77 and 83 on core-head's input, for minutes). Every control's trigger starts one backend event;
    what else follows a move follows that event (`.then`)."""
    keys = _keys(demo)
    on: dict[tuple[int, str], list[str]] = {}
    for fn in demo.fns.values():
        if fn.fn is None:  # runs in the page only (the decay preview): never deferred
            continue
        for block, event in fn.targets:
            if block is not None and event != "load":
                on.setdefault((block, event), []).append(str(fn.api_name))
    shared = {(keys.get(b, b), e): names for (b, e), names in on.items() if len(names) > 1}
    assert not shared, f"triggers that start several events: {shared}"
    loads = [fn for fn in demo.fns.values() if fn.fn is not None and any(e == "load" for _, e in fn.targets)]
    assert all(fn.trigger_mode != "always_last" for fn in loads)


def test_a_slider_let_go_runs_only_after_its_value_is_checked(demo) -> None:
    checks = [fn for fn in demo.fns.values() if _handler(fn) == "check_release"]
    assert checks and all(fn.trigger_only_on_success for fn in checks)  # one per group of sliders (moves.py)
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
