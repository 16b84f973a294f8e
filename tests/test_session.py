"""Session: a scenario's chain of runs goes on only while nothing else was asked for (issue 24: a scenario clicked
during another's runs, whose next run then set the controls under the newer run and stopped it)."""

from __future__ import annotations

from explorer.session import Session


def _ran(session: Session) -> None:
    session.end(session.begin())


def test_a_scenario_goes_on_after_its_own_run() -> None:
    s = Session()
    assert s.start_scenario("core", 0)
    _ran(s)
    assert s.scenario_state("core") == "current"
    assert s.start_scenario("core", 1)
    _ran(s)
    assert s.scenario_state("core") == "current"


def test_a_generate_or_a_stop_during_its_run_ends_the_chain() -> None:
    for asked in (Session.trigger, Session.request_stop):
        s = Session()
        s.start_scenario("core", 0)
        run = s.begin()
        asked(s)
        s.end(run)
        assert s.scenario_state("core") == "interrupted"
        assert not s.start_scenario("core", 1)


def test_another_scenario_during_its_run_replaces_it() -> None:
    s = Session()
    s.start_scenario("core", 0)
    run = s.begin()
    assert s.start_scenario("fill", 0)  # a click always starts
    s.end(run)  # the first scenario's run ends (stopped): its next step must not run
    assert s.scenario_state("core") == "replaced" and not s.start_scenario("core", 1)
    _ran(s)
    assert s.scenario_state("fill") == "current"


def test_the_same_scenario_clicked_again_goes_on_only_from_its_new_run() -> None:
    s = Session()
    s.start_scenario("core", 0)
    old = s.begin()
    s.start_scenario("core", 0)
    s.end(old)
    assert not s.start_scenario("core", 1)  # the old run's chain ends
    _ran(s)  # the new click's run
    assert s.start_scenario("core", 1)
