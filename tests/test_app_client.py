"""The running app driven through gradio_client: streaming, errors, sessions, stop, cancel, queue, export."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from gradio_client import Client

from d3.config import D3Config
from d3.schedule import budgets, planned_grid
from explorer import live, page
from explorer.caps import Caps
from tests.apphelpers import (
    RUN,
    CountingEngine,
    api_figure,
    array,
    call_undocumented,
    new_client,
    output_names,
    serve,
    wait_until,
)
from tests.tiny import tiny_llama, tiny_tokenizer

pytestmark = [pytest.mark.usefixtures("exports_in_tmp"), pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]
OUT = {name: i for i, name in enumerate(n for n in live.GENERATE_OUTPUTS if n != "session")}  # by name (State is not in the API)


def client(url: str) -> Client:
    return new_client(url)




def test_generate_streams_token_by_token(url) -> None:
    job = client(url).submit(**RUN, api_name="/generate")
    seen = [out for out in job]  # iterating a job yields each streamed update as it arrives
    final = job.result()
    panes = [str(out[OUT["d3_tokens"]]) for out in seen if "d3-tok" in str(out[OUT["d3_tokens"]])]
    assert len(panes) >= 4
    assert "Done." in final[OUT["status"]]
    tokens = str(final[OUT["d3_tokens"]]).count('data-step="')
    usage, errors = api_figure(final[OUT["usage"]]), api_figure(final[OUT["errors"]])
    assert array(usage["data"][0]["z"]).shape == (tokens, 6)  # one row per D3 token, one column per layer
    kl = [t for t in errors["data"] if "KL teacher" in (t.get("name") or "")]
    assert len(kl) == 1 and len(array(kl[0]["y"])) == tokens and (array(kl[0]["y"]) >= 0).all()


def test_bad_input_is_a_clear_error_and_the_server_keeps_serving(url) -> None:
    c = client(url)
    for bad, message in [({"prompt": "   "}, "prompt is empty"), ({"alpha": 1.5}, "alpha must be a number in (0, 1]"),
                         ({"max_new_tokens": "lots"}, "max_new_tokens='lots' is not a number"),
                         ({"core_head": 4, "core_tail": 4}, "at most 5: the model's 6 layers less one flex layer"),
                         ({"strategy": "warp"}, "strategy must be one of"), ({"prompt": "x" * 9000}, "8,000")]:
        with pytest.raises(Exception, match="") as err:
            c.predict(**{**RUN, **bad}, api_name="/generate")
        assert message in str(err.value) and "Traceback" not in str(err.value)
    assert "Done." in c.predict(**RUN, api_name="/generate")[OUT["status"]]


def test_two_people_at_once_never_see_each_others_traces(url) -> None:
    alice, bob = client(url), client(url)
    jobs = [alice.submit(**{**RUN, "prompt": "apples"}, api_name="/generate"),
            bob.submit(**{**RUN, "prompt": "bananas", "alpha": 0.95}, api_name="/generate")]
    finals = [job.result(timeout=120) for job in jobs]
    assert all("Done." in f[OUT["status"]] for f in finals)
    traces = [json.loads(Path(c.predict(api_name="/export_trace")[0]).read_text()) for c in (alice, bob)]
    assert traces[0]["prompt"] == "apples" and traces[1]["prompt"] == "bananas"
    assert traces[0]["strategy"]["alpha"] == 0.9 and traces[1]["strategy"]["alpha"] == 0.95


def test_stop_ends_the_generation_within_one_step(engine, url) -> None:
    engine.delay = 0.05
    try:
        c = client(url)
        job = c.submit(**{**RUN, "max_new_tokens": 60}, api_name="/generate")
        wait_until(lambda: len(job.outputs()) >= 6)
        c.predict(api_name="/stop")
        final = job.result(timeout=60)
    finally:
        engine.delay = 0.0
    assert "Stopped." in final[OUT["status"]]
    assert final[OUT["d3_tokens"]].count('data-step="') < 40


def test_a_dropped_connection_ends_the_generation_and_frees_it(engine, url) -> None:
    engine.delay = 0.05
    try:
        job = client(url).submit(**{**RUN, "max_new_tokens": 60}, api_name="/generate")
        wait_until(lambda: len(job.outputs()) >= 6)
        closed_before = engine.closed
        job.cancel()  # what the server sees when a tab closes
        time.sleep(0.3)
        steps = engine.steps
        time.sleep(1.0)
        assert engine.steps - steps <= 1  # nothing decodes for that person any more
        wait_until(lambda: engine.closed >= closed_before + 2, timeout=30)  # both runs' generators were closed
    finally:
        engine.delay = 0.0
    assert "Done." in client(url).predict(**{**RUN, "max_new_tokens": 3}, api_name="/generate")[OUT["status"]]


def test_a_full_queue_tells_people_to_retry() -> None:
    engine = CountingEngine(tiny_llama(4), tiny_tokenizer(), name="tiny", delay=0.05)
    demo = page.build_demo(lambda name: engine, model_names=("tiny",), caps=Caps(queue_size=1, concurrency=1))
    with serve(demo) as address:
        jobs = [client(address).submit(**{**RUN, "core_head": 0, "core_tail": 0, "attention_layer": 1,
                                          "max_new_tokens": 20}, api_name="/generate") for _ in range(4)]
        errors = []
        for job in jobs:
            try:
                job.result(timeout=120)
            except Exception as err:  # gradio_client's QueueError
                errors.append(str(err))
    assert errors and all("Queue is full" in e and "try again" in e for e in errors)
    assert len(errors) < len(jobs)  # the first ones ran


def test_slider_preview_and_views_via_the_api(url) -> None:
    c = client(url)
    decay, planned = call_undocumented(c, url, "/redraw_schedule", model="tiny", strategy="d3", alpha=0.8, core_head=1,
                                       core_tail=1, start=0, drop_order="middle_out", fill="copy", max_new_tokens=16,
                                       unified_ratio=1.5, skipdecode_max=0, skipdecode_min=0, threshold=0.9,
                                       presentation=False)
    cfg = D3Config(alpha=0.8, core_head=1, core_tail=1)
    line = [t for t in api_figure(decay)["data"] if (t.get("meta") or {}).get("role") == "planned"]
    assert list(array(line[0]["y"])) == budgets(cfg, 6, 16)  # the controls' schedule, then the others beside it
    assert np.array_equal(array(api_figure(planned)["data"][0]["z"]) == 1, np.array(planned_grid(cfg, 6, 16)))


def test_public_server_refuses_unknown_models(engine) -> None:
    demo = page.build_demo(lambda name: engine, model_names=("tiny",), public=True)
    with serve(demo) as address:
        with pytest.raises(Exception, match="not allowed here"):
            client(address).predict(**{**RUN, "model": "/etc/passwd"}, api_name="/generate")


def test_scenario_chain_and_fill_comparison_via_the_api(url) -> None:
    c = client(url)
    values = call_undocumented(c, url, "/scenario_fill_0", model="tiny")
    assert "strided" in values and "none" in values
    job = c.submit(**{**RUN, "drop_order": "strided", "max_new_tokens": 4}, presentation=False,
                   api_name="/compare_fills")
    status, fills = job.result(timeout=120)
    assert "Fill comparison done" in status
    agreement = [t for t in api_figure(fills)["data"] if (t.get("meta") or {}).get("role") == "agreement"]
    assert [t["x"][0] for t in agreement] == ["copy", "propagate", "none"]


def test_export_figure_via_the_api(url) -> None:
    c = client(url)
    c.predict(**RUN, api_name="/generate")
    page, script = c.predict(figure="usage", model="tiny", strategy="d3", alpha=0.9, core_head=1, core_tail=1,
                             start=0, drop_order="middle_out", fill="copy", max_new_tokens=8, unified_ratio=1.5,
                             skipdecode_max=0, skipdecode_min=0, threshold=0.9, attention_layer=3, attention_head=0,
                             metric="both", log_kl=False, presentation=False, api_name="/export_figure")
    text = Path(page).read_text()
    assert Path(page).name == "usage.html" and "Plotly" in text and Path(script).name == "plotly.min.js"


def test_exports_are_bounded_for_the_server_and_served_without_a_copy(url, exports_in_tmp, monkeypatch) -> None:
    """The issue's repro: three clients, each with a session of its own, ask for 11 schedule figures each. The
    server's rate refuses everything past it, and Gradio serves the pages from the export folder itself (as
    downloads, never as pages on the app's origin): its cache holds nothing else, so the cap bounds everything
    on disk."""
    from collections import deque

    from explorer import export

    monkeypatch.setattr(export, "_SERVER_EXPORTS", deque())
    args = dict(model="tiny", strategy="d3", core_head=1, core_tail=1, start=0, drop_order="middle_out", fill="copy",
                max_new_tokens=8, unified_ratio=1.5, skipdecode_max=0, skipdecode_min=0, threshold=0.9,
                attention_layer=3, attention_head=0, metric="both", log_kl=False, presentation=False)
    cache = Path(exports_in_tmp) / "gradio"  # Gradio's, and where earlier tests' clients downloaded into
    before = {f for f in cache.rglob("*") if f.is_file()}
    served, refused = [], []
    for _ in range(3):
        c = Client(url, verbose=False, download_files=False)  # files stay on the server: only its disk is counted
        c.predict(**{**RUN, "max_new_tokens": 2}, api_name="/generate")  # a session of its own
        for k in range(11):
            try:
                served.append(c.predict(figure=("decay", "planned")[k % 2], alpha=0.9 + k * 1e-4, **args,
                                        api_name="/export_figure"))
            except Exception as error:  # noqa: BLE001  (gradio_client raises AppError)
                refused.append(str(error))
    assert len(served) == export.SERVER_EXPORTS_PER_MINUTE and len(refused) == 33 - len(served)
    assert sum("for everyone together" in r for r in refused) == 11, refused  # the third client gets none
    import httpx

    response = httpx.get(served[0][0]["url"])  # served from the export folder itself: a download, not a page
    assert response.status_code == 200 and response.headers["content-disposition"].startswith("attachment")
    written = {f for f in cache.rglob("*") if f.is_file()} - before
    assert written and all(export.EXPORT_ROOT in f.parents for f in written), [str(f) for f in written][:3]
    assert sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) <= export.EXPORT_MAX_BYTES


def test_concurrent_requests_all_finish(url) -> None:
    results: list[str] = []

    def one(i: int) -> None:
        results.append(client(url).predict(**{**RUN, "prompt": f"p{i}", "max_new_tokens": 3}, api_name="/generate")[OUT["status"]])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert len(results) == 3 and all("Done." in r for r in results)


def test_the_api_documents_only_the_public_endpoints_with_every_value_named(url) -> None:
    from explorer.wiring import PUBLIC_API

    endpoints = client(url).view_api(return_format="dict", print_info=False)["named_endpoints"]
    assert sorted(endpoints) == sorted(f"/{name}" for name in PUBLIC_API)
    for name, endpoint in endpoints.items():
        inputs = [p["parameter_name"] for p in endpoint["parameters"]]
        outputs = [r["label"] for r in endpoint["returns"]]
        assert not [n for n in inputs if n.startswith("param_")], (name, inputs)
        assert outputs and not [n for n in outputs if n.startswith("value_")], (name, outputs)
    assert output_names(client(url), "/generate") == [n for n in live.GENERATE_OUTPUTS if n != "session"]


def test_browser_plumbing_cannot_be_called_by_a_client(url) -> None:
    from explorer.wiring import BROWSER_ONLY

    c = client(url)
    for name in BROWSER_ONLY:
        with pytest.raises(ValueError, match="Cannot find a function"):
            c.predict(api_name=f"/{name}")


def test_a_sweep_row_load_without_a_click_says_what_to_do() -> None:
    from explorer.sweep_tab import SWEEP_LOAD_OUTPUTS, load_sweep_setting

    values = load_sweep_setting(None)
    assert "Click a row" in str(values[SWEEP_LOAD_OUTPUTS.index("sweep_note")])


def test_the_readme_gradio_client_snippet_runs(url, capsys) -> None:
    """Exactly the README's snippet, pointed at this test's server."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## gradio_client\n", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert 'Client("http://127.0.0.1:7860/")' in code
    exec(compile(code.replace("http://127.0.0.1:7860/", url), "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert any(line.startswith("Generating") for line in printed) and printed[-1].endswith("]")
    assert any(line.startswith("Done.") for line in printed)
