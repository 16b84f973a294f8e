"""The page's logic without Gradio: caps, parsing of the controls, the shared model pool, side-by-side streaming,
sessions, scenarios."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest

from d3.config import D3Config, EarlyExitConfig, FullConfig, GenerationConfig, SkipDecodeConfig, UnifiedConfig
from d3.research.data import example_prompts
from explorer import live
from explorer.caps import Caps, is_public
from explorer.controls import Controls, other_schedules, parse_controls
from explorer.live import stop
from explorer.pool import KNOWN_FACTS, ModelPool
from explorer.runs import LiveUpdate, fill_comparison, prepare_run, side_by_side
from explorer.scenarios import SCENARIOS, scenario_controls
from explorer.session import Session

CAPS = Caps()
GEN = GenerationConfig(max_new_tokens=10, stop_at_eos=False)


def collect(updates) -> list[LiveUpdate]:
    return list(updates)


# ---------------------------------------------------------------- caps and deployment


def test_caps_from_env_reads_clamps_and_survives_garbage() -> None:
    caps = Caps.from_env({"D3_MAX_NEW_TOKENS": "32", "D3_QUEUE_SIZE": "nope", "D3_MAX_PROMPT_TOKENS": "999999",
                          "D3_CONCURRENCY": "0"})
    assert caps.max_new_tokens == 32
    assert caps.queue_size == Caps().queue_size  # malformed: the default
    assert caps.max_prompt_tokens == 4096  # clamped to the engine's own cap
    assert caps.concurrency == 1
    assert Caps.from_env({}) == Caps()
    assert "256 new tokens" in Caps().describe()


def test_public_deployment_is_detected() -> None:
    assert is_public({"D3_PUBLIC": "1"}) and is_public({"SPACE_ID": "someone/d3"})
    assert not is_public({}) and not is_public({"D3_PUBLIC": "0"})


def test_example_prompts_come_from_assets() -> None:
    prompts = example_prompts()
    assert len(prompts) >= 4 and all(p.title and p.prompt.strip() for p in prompts)


# ---------------------------------------------------------------- parsing


def test_parse_controls_defaults_to_d3_with_the_default_core() -> None:
    strategy, gen = parse_controls(Controls(), 30, CAPS)
    assert strategy == D3Config(alpha=0.99, core_head=3, core_tail=3)
    assert gen.greedy and gen.max_new_tokens == 64


def test_parse_controls_builds_each_baseline() -> None:
    assert parse_controls(Controls(**{"strategy": "unified", "unified_ratio": "2"}), 30, CAPS)[0] == UnifiedConfig(ratio=2.0)
    skip = parse_controls(Controls(**{"strategy": "skipdecode", "skipdecode_max": 20, "skipdecode_min": 0,
                           "max_new_tokens": 32}), 30, CAPS)[0]
    assert skip == SkipDecodeConfig(max_layers=20, min_layers=None, horizon=32)
    early = parse_controls(Controls(**{"strategy": "early_exit", "threshold": 0.5, "fill": "propagate"}), 30, CAPS)[0]
    assert early == EarlyExitConfig(threshold=0.5, fill="propagate", min_layers=4)
    _, gen = parse_controls(Controls(**{"decoding": "sample", "temperature": 0.7, "seed": 3}), 30, CAPS)
    assert (gen.temperature, gen.seed) == (0.7, 3)


@pytest.mark.parametrize("raw, message", [
    ({"alpha": 0}, r"alpha=0 is out of range: alpha must be a number in \(0, 1\]"),
    ({"alpha": 1.01}, "alpha must be a number in"),
    ({"core_head": 4, "core_tail": 3}, r"core_head \+ core_tail=7 is not allowed: .*at most 5: the model's 6 layers less one flex layer"),
    ({"core_head": 99}, r"core_head must be an integer in \[0, 6\]"),
    ({"core_tail": -1}, "core_tail"),
    ({"start": 10**6}, r"start must be an integer in \[0, 256\]"),
    ({"max_new_tokens": 0}, r"max_new_tokens must be an integer in \[1, 256\]"),
    ({"max_new_tokens": 10**12}, "max_new_tokens"),
    ({"max_new_tokens": "many"}, "max_new_tokens='many' is not a number"),
    ({"max_new_tokens": 3.5}, "max_new_tokens must be an integer"),
    ({"strategy": "turbo"}, "strategy='turbo' is not allowed: strategy must be one of d3, skipdecode"),
    ({"strategy": "full"}, "strategy='full' is not allowed"),
    ({"fill": "glue"}, "fill must be one of default, copy, propagate, none"),
    ({"drop_order": "random"}, "drop_order must be one of middle_out"),
    ({"decoding": "beam"}, "decoding must be one of greedy, sample"),
    ({"decoding": "sample", "temperature": 0}, "temperature"),
    ({"seed": -5}, "seed"),
    ({"strategy": "unified", "unified_ratio": 100}, "unified_ratio"),
    ({"strategy": "early_exit", "threshold": 2}, "threshold"),
    ({"strategy": "skipdecode", "skipdecode_max": 50}, r"skipdecode_max must be an integer in \[1, 6\]"),
])
def test_parse_controls_rejects_bad_values_with_plain_messages(raw, message) -> None:
    with pytest.raises(ValueError, match=message):
        parse_controls(Controls(**raw), 6, CAPS)


# ---------------------------------------------------------------- the shared model pool


def test_pool_loads_each_model_once_under_concurrent_calls(tiny_engine) -> None:
    calls = []

    def factory(name):
        calls.append(name)
        return tiny_engine

    pool = ModelPool(factory, names=("tiny",))
    engines = []
    threads = [threading.Thread(target=lambda: engines.append(pool.engine("tiny"))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == ["tiny"] and all(e is tiny_engine for e in engines)
    assert pool.facts("tiny").num_layers == 6


def test_pool_knows_the_embedded_models_without_loading_them() -> None:
    pool = ModelPool(public=True)  # the real loader: it must not be called here
    assert pool.facts("smollm2-135m") == KNOWN_FACTS["smollm2-135m"]
    assert not pool.is_loaded("smollm2-135m")


@pytest.mark.parametrize("name", ["/etc", "../secret", "owner/model", "", None, 3])
def test_public_pool_refuses_anything_but_the_known_models(name) -> None:
    with pytest.raises(ValueError, match="is not allowed"):
        ModelPool(public=True).check_name(name)


def test_local_pool_accepts_paths_but_not_control_characters() -> None:
    pool = ModelPool(public=False)
    assert pool.check_name(" ./my-model ") == "./my-model"
    with pytest.raises(ValueError, match="printable"):
        pool.check_name("model\x00name")


def test_prepare_run_validates_before_loading(tiny_engine) -> None:
    calls = []
    pool = ModelPool(lambda name: calls.append(name) or tiny_engine, names=("tiny",), facts={"tiny": KNOWN_FACTS["gemma3-270m"]})
    with pytest.raises(ValueError, match="prompt is empty"):
        prepare_run(pool, Controls(**{"prompt": " ", "model": "tiny"}))
    with pytest.raises(ValueError, match="alpha"):
        prepare_run(pool, Controls(**{"prompt": "hi", "model": "tiny", "alpha": 7}))
    assert calls == []  # a bad value is reported before a slow model load
    setup = prepare_run(pool, Controls(prompt="hi", model="tiny", core_head=1, core_tail=1, attention_layer=2))
    assert calls == ["tiny"] and 2 in setup.trace.attention_layers  # the chosen layer, and the rest where they fit


# ---------------------------------------------------------------- streaming side by side


def test_side_by_side_interleaves_and_matches_separate_runs(tiny_engine) -> None:
    cfg = D3Config(alpha=0.9, core_head=1, core_tail=1)
    updates = collect(side_by_side(tiny_engine, "hello there", cfg, GEN))
    streamed = [u for u in updates if u.phase == "streaming"]
    assert [u.pane for u in streamed[:4]] == ["d3", "full", "d3", "full"]
    final = updates[-1]
    assert [u.phase for u in updates[-2:]] == ["comparing", "done"] and final.comparison is not None
    alone = tiny_engine.generate("hello there", cfg, GEN)
    full = tiny_engine.generate("hello there", FullConfig(), GEN)
    assert final.d3.token_ids == alone.token_ids and final.full.token_ids == full.token_ids
    assert list(final.d3.layers_used) == list(alone.layers_used)
    agree = np.array(alone.token_ids) == np.array(full.token_ids)
    assert final.comparison.agree.tolist() == agree.tolist()
    assert len(final.comparison.kl_teacher) == GEN.max_new_tokens


def test_side_by_side_stops_within_one_step(tiny_engine) -> None:
    stop = threading.Event()
    updates = []
    for update in side_by_side(tiny_engine, "hello", D3Config(), GEN, should_stop=stop.is_set):
        updates.append(update)
        if len(updates) == 3:
            stop.set()
    final = updates[-1]
    assert final.phase == "stopped" and final.comparison is None
    assert len(final.d3.steps) <= 3 and len(final.full.steps) <= 3


def test_side_by_side_comparison_is_interruptible(tiny_engine, monkeypatch) -> None:
    """A Stop pressed while the comparison runs ends its teacher-forced run within a step: the decoding steps taken
    after Stop are counted (before `compare` took should_stop, it ran all of them and then reported "stopped")."""
    stop = threading.Event()
    after_stop = []
    original = type(tiny_engine).run

    def run(self, *args, **kwargs):
        for item in original(self, *args, **kwargs):
            if stop.is_set():
                after_stop.append(1)
            yield item

    monkeypatch.setattr(type(tiny_engine), "run", run)
    phases = []
    for update in side_by_side(tiny_engine, "hello", D3Config(), GEN, should_stop=stop.is_set):
        phases.append(update.phase)
        if update.phase == "comparing":
            stop.set()
    assert phases[-1] == "stopped" and update.comparison is None
    assert len(after_stop) <= 1, f"{len(after_stop)} decoding steps after Stop (of {GEN.max_new_tokens})"


def test_closing_the_stream_closes_both_runs(tiny_engine, monkeypatch) -> None:
    closed = []
    original = type(tiny_engine).run

    def run(self, *args, **kwargs):
        try:
            yield from original(self, *args, **kwargs)
        finally:
            closed.append(True)

    monkeypatch.setattr(type(tiny_engine), "run", run)
    stream = side_by_side(tiny_engine, "hello", D3Config(), GEN)
    next(stream), next(stream), next(stream)
    stream.close()  # what a closed tab or a superseding run does
    assert closed == [True, True]


def test_fill_comparison_matters_only_when_layer_sets_are_not_nested(tiny_engine) -> None:
    gen = GenerationConfig(max_new_tokens=8, stop_at_eos=False)
    nested = dict(fill_comparison(tiny_engine, "hello", D3Config(alpha=0.85, core_head=1, core_tail=1), gen))
    strided = dict(fill_comparison(tiny_engine, "hello", D3Config(alpha=0.85, core_head=1, core_tail=1,
                                                                   drop_order="strided"), gen))
    assert list(nested) == ["copy", "propagate", "none"]
    kl = {k: c.kl_teacher for k, c in nested.items()}
    assert np.allclose(kl["copy"], kl["none"]) and np.allclose(kl["copy"], kl["propagate"])
    assert not np.allclose(strided["copy"].kl_teacher, strided["none"].kl_teacher)


# ---------------------------------------------------------------- sessions and scenarios


def test_session_runs_supersede_each_other() -> None:
    session = Session()
    first = session.begin()
    stop_first = session.stopper(first)
    assert not stop_first()
    second = session.begin()
    assert stop_first() and not session.is_current(first)
    assert not session.stopper(second)()
    session.request_stop()
    assert session.stopper(second)()


def test_stop_reaches_a_run_still_waiting_in_the_queue_but_not_the_next_one() -> None:
    session = Session()
    session.trigger()  # Generate pressed: the run waits in the queue
    session.request_stop()  # Stop pressed while it waits
    assert session.stopper(session.begin())()  # it stops as soon as it begins
    session.trigger()  # Generate pressed again
    assert not session.stopper(session.begin())()  # the earlier Stop does not reach this run
    session.request_stop()
    assert not session.stopper(session.begin())()  # an API call without a trigger starts clean too


def test_session_history_records_finished_runs(tiny_engine) -> None:
    session = Session()
    final = collect(side_by_side(tiny_engine, "hello", D3Config(alpha=0.9), GEN))[-1]
    session.finish(final, "D3 (α=0.9)")
    frame = session.history_frame()
    assert frame["strategy"].tolist() == ["D3 (α=0.9)"]
    assert frame["tokens"].tolist() == [len(final.d3.steps)]
    assert frame["agreement"].iloc[0] == pytest.approx(final.comparison.agreement, abs=1e-3)
    session.clear()
    assert session.d3 is None and len(session.history) == 1


def test_scenarios_set_what_they_promise() -> None:
    core = SCENARIOS["core"]
    assert len(core.runs) == 2
    assert scenario_controls("core", 0, 30)["core_head"] == 3
    assert (scenario_controls("core", 1, 30)["core_head"], scenario_controls("core", 1, 30)["core_tail"]) == (0, 0)
    fill = scenario_controls("fill", 0, 30)
    assert (fill["drop_order"], fill["fill"]) == ("strided", "none") and SCENARIOS["fill"].fills
    assert "nested" in SCENARIOS["fill"].text
    assert scenario_controls("aggressive", 0, 30)["alpha"] < 0.95
    with pytest.raises(ValueError, match="scenario"):
        scenario_controls("nope", 0, 30)
    for key in SCENARIOS:  # every scenario's controls parse
        parse_controls(Controls(**scenario_controls(key, 1, 30)), 30, CAPS)


def test_other_schedules_leave_out_the_main_kind_and_what_does_not_fit() -> None:
    d3 = D3Config()
    assert set(other_schedules(d3, d3, 30)) == {"SkipDecode (auto)", "Unified 1.5×"}
    assert set(other_schedules(UnifiedConfig(), d3, 30)) == {"D3", "SkipDecode (auto)"}
    assert "Unified 1.5×" not in other_schedules(d3, d3, 1)  # keeps floor(1 / 1.5) = 0 layers: does not fit
    assert other_schedules(d3, d3, 30, steps=40)["SkipDecode (auto)"].horizon == 40


def test_stop_while_idle_says_nothing_is_running() -> None:
    session = Session()
    assert "Stopping" not in stop(session) and "Nothing is running" in stop(session)


def test_streaming_sends_the_page_a_paced_subset_of_updates(tiny_engine) -> None:
    """A fast model makes an update every few ms: the page gets the panes at most every PANES_EVERY_S and the
    heavy figures at most every FIGURES_EVERY_S, but always the first token and every phase change."""
    from explorer import live

    now = [0.0]
    pace = live._Pacer(every=1, clock=lambda: now[0])
    updates = list(side_by_side(tiny_engine, "hello there", D3Config(alpha=0.9), GenerationConfig(max_new_tokens=40)))
    sent, drawn = [], []
    for update in updates:
        now[0] += 0.01  # 100 updates a second
        figures = pace.figures(update)
        if pace.panes(update) or figures:
            sent.append(update)
            drawn += [update] if figures else []
    streamed = [u for u in updates if u.phase == "streaming"]
    assert len(streamed) == 80 and len(sent) <= 80 * 0.01 / live.PANES_EVERY_S + 6
    assert len(drawn) <= 80 * 0.01 / live.FIGURES_EVERY_S + 4
    assert sent[0].d3 is not None and len(sent[0].d3.steps) == 1  # the first token shows at once
    assert [u.phase for u in sent if u.phase != "streaming"] == [u.phase for u in updates if u.phase != "streaming"]


def test_early_exit_runs_with_its_own_fill_unless_one_is_chosen(pool) -> None:
    """Issue 35 (code review): the page mapped its one fill control to D3's default, so early exit ran with copy; its
    own default is propagate. Left out (an API call) or "the strategy's own" (the page's default), each strategy
    takes its own; a fill chosen is kept."""
    from explorer.controls import OWN_FILL
    from tests.apphelpers import run

    session = Session()
    run(pool, session, strategy="early_exit", threshold=0.5, max_new_tokens=4, fill=OWN_FILL)
    assert session.d3.strategy["fill"] == "propagate"
    run(pool, session, strategy="early_exit", threshold=0.5, max_new_tokens=4, fill="copy")
    assert session.d3.strategy["fill"] == "copy"
    run(pool, session, strategy="d3", max_new_tokens=4, fill=OWN_FILL)
    assert session.d3.strategy["fill"] == "copy"
    run(pool, session, strategy="early_exit", threshold=0.5, max_new_tokens=4, fill=OWN_FILL)
    assert session.d3.strategy["fill"] == "propagate"


def test_a_status_said_after_a_stopped_run_keeps_how_it_ended(pool) -> None:
    """Issue 35, M7: "Stopped. 2 D3 tokens…" turned into "Done. …" when a control moved afterwards, and Stop on an
    idle page said "Nothing is running… no divergence so far" of a run that had ended."""
    from explorer import live
    from explorer.view_handlers import SETTLE_OUTPUTS, settle_controls
    from tests.apphelpers import DEFAULTS, OUT

    session = Session()
    stream = live.generate(pool, session, **{**DEFAULTS, "max_new_tokens": 30})
    for out in stream:
        if session.d3 is not None and session.stop_at < 0:  # Stop pressed once the first tokens show
            session.request_stop()
    assert session.d3 is not None and session.d3.steps  # (how many tokens the pacer let through first: not the point)
    ended = out[OUT["status"]]
    assert "Stopped." in ended
    idle = stop(session)
    assert "Stopped." in idle and "Nothing is running" in idle and "so far" not in idle
    controls = {k: v for k, v in DEFAULTS.items() if k != "prompt"}
    settle_controls(pool, session, **{**controls, "alpha": 7})  # a mistake, said in the status line
    fixed = dict(zip(SETTLE_OUTPUTS, settle_controls(pool, session, **{**controls, "alpha": 0.95})))["status"]
    assert "Stopped." in fixed and "Done." not in fixed, fixed


def test_runs_asked_for_while_one_waits_are_dropped_not_played_back_to_back(pool) -> None:
    """Issue 35, M3: a scenario, then ↺ (a release), then Generate, each asked for while the one before waited in
    the queue: three whole runs played back to back. Each click is answered at once (the status says a new run is
    asked for), and as the queue reaches them only the newest runs; the others are dropped."""
    from explorer import live
    from tests.apphelpers import DEFAULTS

    session = Session()
    said = [live.interrupt(session) for _ in range(3)]  # three clicks, before the queue reaches any of them
    assert all("new run" in s for s in said)
    outputs = [list(live.generate(pool, session, **{**DEFAULTS, "max_new_tokens": 4})) for _ in range(3)]
    assert [bool(o) for o in outputs] == [False, False, True]  # the first two took no turn
    assert len(session.history) == 1
    live.interrupt(session)
    session.request_stop()  # Stop while one waits: it begins and stops at once; none waits on another
    list(live.generate(pool, session, **{**DEFAULTS, "max_new_tokens": 4}))
    assert len(list(live.generate(pool, session, **{**DEFAULTS, "max_new_tokens": 4}))) > 1  # an API call runs


def test_a_first_model_load_shows_its_progress_on_the_page(tiny_engine) -> None:
    """Issue 35, M8: Gemma 3's first conversion took ~5 min with nothing on the page. While a model loads, the
    status line says so about every second, with the loader's stage and the time so far (`ModelPool.loading`); then
    the run streams."""
    from explorer import live
    from tests.apphelpers import DEFAULTS, OUT

    loaded = threading.Event()

    def slow_factory(name: str):
        assert loaded.wait(60), "the test never let the load finish"
        return tiny_engine

    from d3.models import ModelFacts

    facts = ModelFacts(tiny_engine.num_layers, tiny_engine.adapter.num_heads, tiny_engine.has_chat_template)
    pool = ModelPool(slow_factory, names=("tiny",), caps=Caps(max_new_tokens=64), facts={"tiny": facts})  # a known model
    session, said = Session(), []
    for out in live.generate(pool, session, **{**DEFAULTS, "max_new_tokens": 3}):
        status = out[OUT["status"]]
        if isinstance(status, str):
            said.append(status)
        if sum("loading the model: " in s for s in said) >= 2:
            loaded.set()  # two progress lines while loading, then the load ends
    loading = [s for s in said if "Loading the model" in s]
    assert len(loading) >= 2 and all(re.search(r"loading the model: \d+ s", s) for s in loading[1:])
    assert "Done." in said[-1] and session.d3 is not None


def test_a_partial_calibrated_order_is_re_fitted_and_the_run_says_so(pool) -> None:
    """Issue 36, item 9: an API call with a short calibrated order ran on the order re-fitted to the core without
    a word. The run's status says what was changed, first line to last, and the run used the re-fitted order."""
    from tests.apphelpers import OUT, run

    session = Session()
    outs = run(pool, session, drop_order="calibrated", layer_order="2", core_head=1, core_tail=1, max_new_tokens=3)
    said = [o[OUT["status"]] for o in outs if isinstance(o[OUT["status"]], str)]
    assert "re-fitted to core 1 + 1" in said[-1] and "Done." in said[-1]
    assert sorted(session.d3.strategy["layer_order"]) == [1, 2, 3, 4] and session.d3.strategy["layer_order"][0] == 2
    outs = run(pool, session, drop_order="calibrated", layer_order="2, 1, 3, 4", core_head=1, core_tail=1,
               max_new_tokens=3)
    assert all("re-fitted" not in o[OUT["status"]] for o in outs if isinstance(o[OUT["status"]], str))


def test_the_first_token_s_wait_says_what_is_happening() -> None:
    """Issue 40, item 6: 38-61 s of bare "Generating…" before the first token; now the status names the prefill of
    the prompt's tokens and another run on the server."""
    assert live.first_token_note(42, 0) == "Prefill: each run reads the 42 prompt tokens at full depth before its first token…"
    busy = live.first_token_note(42, 1)
    assert "42 prompt tokens" in busy and "1 other run is generating on this server" in busy
    with live.STREAMING.one():  # another visitor's run streams: a click says this one may wait for it
        assert "1 other run is generating" in live.interrupt(Session())
    assert "other run" not in live.interrupt(Session())


def test_loading_a_model_again_does_not_say_first_use() -> None:
    """Issue 44, U7: "(first use only)" on every reload of a model another visitor's switch evicted."""
    from explorer import views

    said = views.status_html(None, None, "loading")
    assert "Loading the model" in said and "first use" not in said
