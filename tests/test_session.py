"""explorer/session.py: a scenario's chain of runs goes on only while nothing else was asked for (issue 24: a
scenario clicked during another's runs, whose next run then set the controls under the newer run and stopped it),
and the run history's paired figure (agreement over a strategy's runs on different prompts)."""

from __future__ import annotations

from explorer.session import HISTORY_COLUMNS, RunRecord, Session, agreement_interval


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


def _run(label: str, prompt: str, agreement: float) -> RunRecord:
    summary = {"tokens": 8, "mean_layers": 20.0, "theoretical_speedup": 1.5, "agreement": agreement,
               "first_divergence": 3, "kl_teacher_mean": None, "kl_free_mean": None}
    return RunRecord(label, summary, None, prompt=prompt)


def test_the_interval_needs_two_prompts_and_counts_a_rerun_once() -> None:
    a1, a1_again = _run("D3", "one", 0.5), _run("D3", "one", 0.5)
    assert agreement_interval([a1]) is None and agreement_interval([a1, a1_again]) is None
    other = _run("Unified", "two", 1.0)
    assert agreement_interval([a1, other]) is None  # another strategy's run does not pair with D3's
    # two prompts at 0.25 and 0.75: the bootstrap's means are 0.25, 0.5 and 0.75
    assert agreement_interval([_run("D3", "one", 0.25), other, _run("D3", "two", 0.75)]) == "0.25-0.75 (2)"


def test_the_history_frame_shows_it_per_row() -> None:
    session = Session()
    session.history = [_run("D3", "one", 0.25), _run("D3", "two", 0.75), _run("Unified", "one", 1.0)]
    frame = session.history_frame()
    assert list(frame.columns) == HISTORY_COLUMNS
    shown = frame["agree 95%"].tolist()
    assert shown[1] == "0.25-0.75 (2)" and frame["agree 95%"].isna().tolist() == [True, False, True]


def test_a_finished_run_s_history_row_gives_its_one_count_and_reads_its_speed() -> None:
    """Issue 44, items 1 and 2: the history says how many of the tokens both runs wrote agree, which run ended first,
    and reads the measured speedup against theory as the Sweep does."""
    from dataclasses import replace

    from d3.config import D3Config, FullConfig
    from explorer.runs import LiveUpdate
    from tests.traces import make_trace

    full = replace(make_trace(FullConfig(), steps=19, seed=3), finish_reason="eos")
    full = full.with_steps(replace(s, wall_ms=40.0 + s.step % 3) for s in full.steps)
    d3 = make_trace(D3Config(alpha=0.9), steps=24, token_ids=full.token_ids + [1] * 5, seed=4)
    d3 = d3.with_steps(replace(s, wall_ms=10.0 + s.step % 3) for s in d3.steps)  # 4x faster: above its theory
    session = Session()
    session.finish(LiveUpdate(d3, full, phase="stopped"), "D3")
    row = session.history_frame().iloc[0]
    assert row["tokens agreeing"] == ("19 of the 19 tokens both wrote agree (full depth ended at its end-of-text token "
                                      "after 19; D3 wrote 24)")
    assert "a timing artefact" in row["speed, read how"]
