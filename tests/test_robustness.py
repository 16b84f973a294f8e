"""Real use: junk from a person or a direct API call, cancellation, server-side caps, public mode, flat memory."""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gradio as gr
import httpx
import pytest
from gradio_client import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import d3.models
from d3.decoder import DecodeState
from d3.testing import count_hooks
from d3.trace import Trace
from explorer import export, live, loadtest, page, view_handlers
from explorer.caps import Caps, is_public
from explorer.controls import REDRAW_NAMES
from explorer.pool import ModelPool
from explorer.session import Session
from explorer.views import errors, flow
from tests.apphelpers import (
    DEFAULTS,
    ROOT,
    RUN,
    alive,
    api_defaults,
    call_undocumented,
    last_value,
    new_client,
    rss_mib,
    serve,
    tiny_factory,
    wait_until,
)
from tests.figures import message

pytestmark = [pytest.mark.usefixtures("exports_in_tmp"), pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.usefixtures("one_torch_thread")]
SAMPLED = dict(decoding="sample", temperature=0.9, seed=11)
UNHANDLED = "has not enabled verbose error reporting"  # what gradio_client says when a handler raised a non-gr.Error


# ---------------------------------------------------------------- junk a person or an API call can send

NASTY_TEXT = ("", " ", "\x00", " \n\t\x00\x1b[31m", "\u202e\u200b\ufeff", "\u0301\u0301", "🦊" * 30, "a" * 9000,
              "é" * 8001, "../../etc/passwd", "/tmp", "/etc/passwd", "~/.ssh/id_rsa", "C:\\Windows\\system32",
              "HuggingFaceTB/SmolLM2-135M-Instruct", "gpt2", "$(rm -rf /)", "; cat /etc/passwd", "`id`",
              "<script>alert(1)</script>", "{{7*7}}", "%s%n%x", "1e999", "-0", "nan", "inf", "0x10", " 3 ", "true")
NASTY_NUMBERS = (10**400, -10**400, 2**63, 2**31, -1, 0, 1, 1e308, 5e-324, -0.0, 0.5, 7)


def junk(json_safe: bool = False) -> st.SearchStrategy[Any]:
    """Values of every type and shape, the known-nasty ones drawn often; `json_safe`: only what gradio_client
    can send (no NaN or infinities, no lone surrogates)."""
    text = st.one_of(st.text(max_size=40), st.text(st.characters(max_codepoint=0x1F), max_size=10),
                     st.text(st.characters(categories=["Cc", "Cf", "Co", "Mn", "So", "Zl", "Zp"]), max_size=20))
    nasty = NASTY_TEXT + NASTY_NUMBERS
    if json_safe:
        text = text.filter(lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s))
    else:
        nasty += (math.nan, math.inf, -math.inf, "\ud800")
    numbers = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=not json_safe, allow_infinity=not json_safe))
    shapes = st.one_of(st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(),
                                                                              max_size=2))
    other = st.one_of(text, numbers, st.booleans(), st.none(), shapes)
    return st.sampled_from([st.sampled_from(nasty), other]).flatmap(lambda s: s)  # half of the draws are nasty


def assert_clean(message: str) -> None:
    """A message a person can read: ours, short, with no stack trace and no server paths."""
    assert message.strip() and UNHANDLED not in message, f"not a gr.Error: {message!r}"
    assert "Traceback" not in message and 'File "' not in message, message
    assert str(ROOT) not in message and ".py" not in message and "site-packages" not in message, message
    assert len(message) <= 600, f"{len(message)} characters: {message[:200]}…"


FUZZ = settings(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
RUN_BASE = {**DEFAULTS, "max_new_tokens": 2}
RUN_ONLY = ("prompt", "chat_template", "decoding", "temperature", "seed")  # what export_figure never reads


def _pick(values: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {n: values[n] for n in names}


# ---------------------------------------------------------------- (a) handlers called directly


@pytest.fixture(scope="module")
def pool(engine) -> ModelPool:
    return ModelPool(tiny_factory(engine), names=("tiny",), caps=Caps(max_new_tokens=64))


@pytest.fixture(scope="module")
def finished(pool) -> Session:
    """A session with a finished run, so the view handlers draw real traces."""
    session = Session()
    list(live.generate(pool, session, **{**RUN_BASE, "max_new_tokens": 4}))
    return session


def handlers(pool: ModelPool, finished: Session) -> dict[str, tuple[Callable[..., Any], dict[str, Any]]]:
    """Every handler a person can reach, with the values the page would send; junk replaces some of them."""
    run_args = {k: v for k, v in RUN_BASE.items() if k not in ("attention_head", "metric", "log_kl")}
    schedule = _pick(RUN_BASE, REDRAW_NAMES)
    figure = {"figure": "usage", **{k: v for k, v in RUN_BASE.items() if k not in RUN_ONLY}}
    view = _pick(RUN_BASE, ("attention_layer", "attention_head", "metric", "log_kl", "presentation"))
    return {
        "generate": (lambda **kw: list(live.generate(pool, Session(), **kw)), dict(RUN_BASE)),
        "compare_fills": (lambda **kw: list(live.compare_fills(pool, Session(), **kw)), run_args),
        "redraw_schedule": (lambda **kw: view_handlers.redraw_schedule(pool, finished, **kw), schedule),
        "model_changed": (lambda **kw: view_handlers.model_changed(pool, **kw), {"model": "tiny"}),
        "load_model": (lambda **kw: view_handlers.load_model(pool, **kw), {"model": "tiny"}),
        "use_example": (lambda **kw: view_handlers.use_example(**kw), {"title": "Fact"}),
        "apply_scenario": (lambda **kw: view_handlers.apply_scenario(pool, "core", 0, finished, **kw), {"model": "tiny"}),
        "render_flow": (lambda **kw: flow.render_flow(finished, **kw), _pick(view, ("metric", "presentation"))),
        "render_attention": (lambda **kw: view_handlers.render_attention(finished, **kw),
                             _pick(view, ("attention_layer", "attention_head", "presentation"))),
        "render_errors": (lambda **kw: errors.render_errors(finished, **kw), _pick(view, ("log_kl", "presentation"))),
        "set_presentation": (lambda **kw: view_handlers.set_presentation(finished, **kw), view),
        "export_figure": (lambda **kw: export.export_figure(pool, finished, **kw), figure),
    }


def test_every_handler_answers_junk_with_a_clear_message(pool, finished, engine) -> None:
    table = handlers(pool, finished)

    @settings(FUZZ, max_examples=200)
    @given(data=st.data())
    def fuzz(data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(table)), label="handler")
        handler, values = table[name]
        bad = data.draw(st.dictionaries(st.sampled_from(sorted(values)), junk(), min_size=1, max_size=3), label="junk")
        try:
            handler(**{**values, **bad})
        except gr.Error as err:
            assert_clean(str(err))
        assert count_hooks(engine.model) == 0 and not engine._lock.locked()

    fuzz()
    session = Session()
    assert "Done." in last_value(list(live.generate(pool, session, **RUN_BASE)), "status")


EDGE_VALUES = (math.nan, math.inf, 10**400, -1, None, True, "", " \x00\x1b\ud800", "a" * 9000, [1])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["apply_scenario", "export_figure", "generate", "model_changed", "redraw_schedule",
                                  "render_attention", "render_errors", "render_flow", "set_presentation",
                                  "use_example"])  # compare_fills validates as generate does
def test_every_field_takes_edge_values(pool, finished, engine, name) -> None:
    """Each edge value in each field, one at a time: combinations random draws reach only rarely (the fuzz
    above, with its fixed seed, never put an infinity into attention_layer)."""
    handler, values = handlers(pool, finished)[name]
    for field in values:
        for value in EDGE_VALUES:
            try:
                handler(**{**values, field: value})
            except gr.Error as err:
                assert_clean(str(err))
            except Exception as err:
                raise AssertionError(f"{name}({field}={value!r:.40}) raised {type(err).__name__}: {err}") from err
    assert count_hooks(engine.model) == 0 and not engine._lock.locked()


def _attention_figure(handler: str, out: Any) -> Any:
    """The attention view a handler drew: the last one a run streamed, the one in presentation's outputs, or the
    figure itself."""
    if handler == "generate":
        return last_value(out, "attention")
    if handler == "set_presentation":
        return out[view_handlers.VIEW_OUTPUTS.index("attention")]
    if handler == "render_attention":
        return out[view_handlers.ATTENTION_OUTPUTS.index("attention")]
    return out


@pytest.mark.parametrize("handler, args, expected", [
    ("generate", {"attention_layer": math.inf}, "attention_layer=inf is not a finite number"),  # it changes the run
    ("generate", {"attention_head": -math.inf}, None),  # a view setting: junk falls back to head 0
    ("generate", {"attention_head": 99}, "Head 99 does not exist: this model has 4 heads"),
    ("render_attention", {"attention_head": math.inf}, None),
    ("render_attention", {"attention_head": 99}, "Head 99 does not exist: this model has 4 heads"),
    ("set_presentation", {"attention_layer": math.inf}, None),  # junk falls back to layer 0: recorded (every layer is)
])
def test_view_settings_out_of_range_are_a_clean_error_or_a_fallback(pool, finished, handler, args, expected) -> None:
    """View settings only change a drawing (found by fuzzing): the recorded layer of a run is refused with a clear
    message; anything else is drawn, with the default in place of junk or a note saying what does not exist."""
    fn, values = handlers(pool, finished)[handler]
    if handler == "generate" and "attention_layer" in args:
        with pytest.raises(gr.Error, match=expected) as err:
            fn(**{**values, **args})
        assert_clean(str(err.value))
        return
    out = fn(**{**values, **args})
    if handler == "generate":
        assert "Done." in last_value(out, "status")
    figure = _attention_figure(handler, out)
    if expected is None:
        heads = [t for t in figure.data if (t.meta or {}).get("role") == "attention"]
        assert len(heads) == 2  # full depth and D3, drawn for head 0
    else:
        assert not figure.data and expected in message(figure)


# ---------------------------------------------------------------- (b) the same junk through the API


@pytest.fixture(scope="module")
def served(engine) -> Iterator[str]:
    demo = page.build_demo(tiny_factory(engine), model_names=("tiny",), public=False, caps=Caps(max_new_tokens=64))
    with serve(demo) as url:
        yield url


API_FUZZED = ("/generate", "/compare_fills", "/redraw_schedule", "/model_changed", "/load_model", "/use_example", "/render_attention",
              "/render_flow", "/set_presentation", "/export_figure", "/scenario_core_1")


def generate_ok(client: Client, **overrides: Any) -> loadtest.Tokens:
    final = client.predict(**{**RUN, "max_new_tokens": 2, **overrides}, api_name="/generate")
    assert "Done." in final[0]
    return loadtest.tokens_of(final)


def test_the_api_answers_junk_with_a_clear_message_and_keeps_serving(served) -> None:
    client = new_client(served)
    defaults = api_defaults(client)
    run_like = {**RUN, "max_new_tokens": 2}

    @settings(FUZZ, max_examples=25)
    @given(data=st.data())
    def fuzz(data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(API_FUZZED), label="endpoint")
        values = {k: run_like.get(k, v) for k, v in defaults[name].items()}
        bad = data.draw(st.dictionaries(st.sampled_from(sorted(values)), junk(json_safe=True), min_size=1,
                                        max_size=3), label="junk")
        try:
            call_undocumented(client, client.src, name, **{**values, **bad})
        except Exception as err:  # gradio_client's AppError carries the gr.Error message
            assert_clean(str(err))
        generate_ok(client)  # still serving, with the queue working

    fuzz()


def raw_call(url: str, endpoint: str, values: dict[str, Any], raw: dict[str, str]) -> dict[str, Any]:
    """Call `endpoint` over plain HTTP with some values written as raw JSON (NaN, Infinity: Python's json
    reads them, gradio_client refuses to send them); the last server-sent event as {event, data}."""
    items = ", ".join(raw[k] if k in raw else json.dumps(v) for k, v in values.items())
    posted = httpx.post(f"{url}gradio_api/call{endpoint}", content=f'{{"data": [{items}]}}',
                        headers={"content-type": "application/json"}, timeout=30)
    posted.raise_for_status()
    stream = httpx.get(f"{url}gradio_api/call{endpoint}/{posted.json()['event_id']}", timeout=120).text
    events = [line.split(":", 1)[1].strip() for line in stream.splitlines() if line.startswith("event:")]
    data = [line.split(":", 1)[1].strip() for line in stream.splitlines() if line.startswith("data:")]
    return {"event": events[-1], "data": json.loads(data[-1])}


@pytest.mark.parametrize("endpoint, raw", [
    ("/generate", {"alpha": "NaN"}),
    ("/generate", {"max_new_tokens": "Infinity"}),
    ("/generate", {"attention_head": "Infinity"}),
    ("/generate", {"attention_layer": "-Infinity"}),
    ("/render_attention", {"attention_head": "Infinity"}),
])
def test_non_finite_numbers_over_raw_http_get_a_clear_message(served, endpoint, raw) -> None:
    defaults = api_defaults(new_client(served))[endpoint]
    values = {k: {**RUN, "max_new_tokens": 2}.get(k, v) for k, v in defaults.items()}
    answer = raw_call(served, endpoint, values, raw)
    if answer["event"] == "error":
        assert answer["data"]["error"] is not None, "an unhandled exception (the person sees no message)"
        assert_clean(answer["data"]["error"])
    generate_ok(new_client(served))


# ---------------------------------------------------------------- (c) cancellation


def fresh_tokens(pool: ModelPool, **kw: Any) -> tuple[list[int], list[int]]:
    session = Session()
    list(live.generate(pool, session, **kw))
    return session.d3.token_ids, session.full.token_ids


@pytest.mark.parametrize("how", ["stop", "close"])
def test_a_cancelled_run_leaves_nothing_behind_and_the_next_run_is_a_fresh_one(pool, engine, how, unpaced) -> None:
    """Stop, or a closed tab (the generator is closed): no hooks, no caches, the lock free, the same tokens."""
    kw = {**RUN_BASE, **SAMPLED, "max_new_tokens": 30}
    states = alive(DecodeState)
    session = Session()
    stream = live.generate(pool, session, **kw)
    for _ in stream:
        if session.d3 is not None and len(session.d3.steps) >= 3:
            break
    if how == "stop":
        live.stop(session)
        rest = list(stream)
        assert "Stopped." in last_value(rest, "status") and len(session.d3.steps) <= 4
    else:
        stream.close()
    assert count_hooks(engine.model) == 0 and not engine._lock.locked()
    assert alive(DecodeState) == states  # both runs' KV caches are gone
    again = {**kw, "max_new_tokens": 8}
    list(live.generate(pool, session, **again))
    assert (session.d3.token_ids, session.full.token_ids) == fresh_tokens(pool, **again)


@pytest.mark.parametrize("how", ["cancel", "stop"])
def test_a_cancelled_api_job_frees_the_model_and_the_next_run_is_a_fresh_one(served, engine, how) -> None:
    client = new_client(served)
    states = alive(DecodeState)
    engine.delay = 0.05
    try:
        closed = engine.closed
        job = client.submit(**{**RUN, **SAMPLED, "max_new_tokens": 40}, api_name="/generate")
        wait_until(lambda: len(job.outputs()) >= 6, timeout=120)
        if how == "cancel":
            job.cancel()  # what the server sees when a tab closes
        else:
            client.predict(api_name="/stop")
        wait_until(lambda: engine.closed >= closed + 2, timeout=60)  # both runs' generators were closed
    finally:
        engine.delay = 0.0
    wait_until(lambda: alive(DecodeState) == states, timeout=30, every=0.5)
    assert count_hooks(engine.model) == 0
    again = {**SAMPLED, "max_new_tokens": 8}
    assert generate_ok(client, **again) == generate_ok(new_client(served), **again)


# ---------------------------------------------------------------- (d) caps, enforced on the server


CAPS = Caps(max_new_tokens=16, max_prompt_chars=200, max_prompt_tokens=40)


@pytest.fixture(scope="module")
def capped(engine) -> Iterator[str]:
    demo = page.build_demo(lambda name: engine, model_names=("tiny",), public=True, caps=CAPS)
    with serve(demo) as url:
        yield url


@pytest.mark.parametrize("endpoint", ["/generate", "/generate_on_release", "/compare_fills"])
@pytest.mark.parametrize("bad, message", [
    ({"max_new_tokens": 17}, r"max_new_tokens must be an integer in [1, 16]"),
    ({"max_new_tokens": 10**6}, r"max_new_tokens must be an integer in [1, 16]"),
    ({"max_new_tokens": -5}, r"max_new_tokens must be an integer in [1, 16]"),
    ({"start": 17}, r"start must be an integer in [0, 16]"),
    ({"prompt": "a" * 201}, "the limit is 200 characters"),
    ({"prompt": "ab " * 30}, "the limit is 40 tokens"),
])
def test_caps_hold_for_a_direct_api_call(capped, endpoint, bad, message) -> None:
    client = new_client(capped)
    values = {k: {**RUN, "max_new_tokens": 4}.get(k, v) for k, v in api_defaults(client)[endpoint].items()}
    with pytest.raises(Exception) as err:
        call_undocumented(client, client.src, endpoint, **{**values, **bad})
    assert message in str(err.value)
    assert_clean(str(err.value))


def test_the_page_shows_the_caps_it_enforces(capped) -> None:
    config = httpx.get(f"{capped}config", timeout=30).text
    assert CAPS.describe() in config and "(1–16 here)" in config


def test_the_page_defaults_fit_within_the_caps(capped) -> None:
    """With a cap below the page's default token count, pressing Generate on the untouched page must work."""
    client = new_client(capped)
    defaults = api_defaults(client)["/generate"]
    assert defaults["max_new_tokens"] <= CAPS.max_new_tokens
    values = {k: RUN.get(k, v) for k, v in defaults.items() if k != "max_new_tokens"}  # the page's own count
    assert "Done." in client.predict(**values, api_name="/generate")[0]


# ---------------------------------------------------------------- (e) public deployments


OUTSIDE_MODELS = ("../../etc/passwd", "/tmp", str(ROOT), "~", "HuggingFaceTB/SmolLM2-135M-Instruct", "gpt2",
                  "tiny/../../etc", "smollm2-135m; rm -rf /")


@pytest.mark.parametrize("env", [{"D3_PUBLIC": "1"}, {"D3_PUBLIC": "true"}, {"SPACE_ID": "someone/d3-explorer"}])
def test_a_public_deployment_loads_only_its_own_models(engine, monkeypatch, env) -> None:
    for name in ("D3_PUBLIC", "SPACE_ID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert is_public()
    asked: list[str] = []
    demo = page.build_demo(lambda name: asked.append(name) or engine, model_names=("tiny",))  # public from env
    pool = demo.pool
    assert pool.public
    asked.clear()  # building the page sized its controls from the one allowed model
    for model in OUTSIDE_MODELS:
        with pytest.raises(gr.Error, match="not allowed here"):
            list(live.generate(pool, Session(), **{**RUN_BASE, "model": model}))
        status = view_handlers.model_changed(pool, model)[view_handlers.MODEL_OUTPUTS.index("status")]
        assert "not allowed here" in status  # the status line says it
        with pytest.raises(gr.Error, match="not allowed here"):
            view_handlers.load_model(pool, model)
    assert asked == []


@pytest.mark.parametrize("field, value", [("model", "x" * 9000), ("model", ["tiny"] * 3000),
                                          ("model", {"name": "a" * 5000}), ("alpha", "9" * 5000),
                                          ("max_new_tokens", "1" * 5000), ("seed", "0." + "5" * 5000)],
                         ids=["name", "name-list", "name-dict", "alpha", "max_new_tokens", "seed"])
def test_a_refused_value_is_not_echoed_back_in_full(engine, field, value) -> None:
    """A public server: a pasted megabyte must not come back as a megabyte-long message."""
    pool = ModelPool(tiny_factory(engine), names=("tiny",), public=True)
    with pytest.raises(gr.Error) as err:
        list(live.generate(pool, Session(), **{**RUN_BASE, field: value}))
    assert_clean(str(err.value))


def test_the_public_loader_never_touches_a_path_or_the_hub(monkeypatch) -> None:
    """The real loader, as a public Space builds it: paths and hub ids are refused before any file is read."""
    monkeypatch.setattr(d3.models, "_from_pretrained", lambda *a, **k: pytest.fail("nothing may be loaded"))
    monkeypatch.setattr(d3.models.Path, "is_dir", lambda self: pytest.fail(f"looked at {self}"))
    pool = ModelPool(public=True)
    for model in OUTSIDE_MODELS:
        with pytest.raises(gr.Error, match="not allowed"):
            list(live.generate(pool, Session(), **{**RUN_BASE, "model": model, "core_head": 3, "core_tail": 3,
                                                   "attention_layer": 15}))
        with pytest.raises(ValueError, match="not allowed here"):
            d3.models.load_model(model, allow_paths=False)


def _calls(path: Path) -> set[str]:
    """Dotted names of everything `path` calls (`subprocess.run`, `eval`, ...)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            names.add(ast.unparse(node.func))
    return names


def test_nothing_a_person_types_reaches_a_shell_or_remote_code() -> None:
    risky = {"eval", "exec", "compile", "__import__", "os.system", "os.popen", "subprocess.run", "subprocess.Popen",
             "subprocess.call", "subprocess.check_output", "pickle.loads", "torch.load"}
    page = [ROOT / "app.py", *sorted((ROOT / "explorer").rglob("*.py"))]
    for path in (*page, ROOT / "d3" / "engine.py"):
        assert not _calls(path) & risky - ({"subprocess.Popen"} if "loadtest" in path.parts else set()), path.name
    for path in [*page, *sorted((ROOT / "d3").glob("*.py"))]:
        assert "trust_remote_code=True" not in path.read_text(), path.name


# ---------------------------------------------------------------- (f) memory over many generations


@pytest.mark.slow
def test_memory_stays_flat_over_a_hundred_generations(engine) -> None:
    """100 short runs through the handlers: 80 in one session, 20 in sessions that are then dropped."""
    pool = ModelPool(tiny_factory(engine), names=("tiny",), caps=Caps(max_new_tokens=64))
    session = Session()
    kw = {**RUN_BASE, **SAMPLED}

    def runs(n: int) -> None:
        for i in range(n):
            if i % 5 == 4:
                list(live.generate(pool, Session(), **{**kw, "seed": i}))  # someone who leaves
            else:
                list(live.generate(pool, session, **{**kw, "seed": i}))

    runs(20)  # warm-up: caches, lazily built figures, the allocator's pools
    traces, states, rss = alive(Trace), alive(DecodeState), rss_mib()
    runs(80)
    assert alive(Trace) == traces  # the session's current traces only: no trace of an earlier run is left
    assert alive(DecodeState) == states and count_hooks(engine.model) == 0
    assert len(session.history) == 50  # bounded
    growth = rss_mib() - rss
    assert growth < 0.05 * rss, f"RSS grew {growth:.1f} MiB over 80 generations (from {rss:.0f} MiB)"
