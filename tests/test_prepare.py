"""A public server's models prepared once in the background: a run on a model not ready yet is refused at once with
how far its preparation is, the page's line says the same, and nothing is prepared inside a request."""

from __future__ import annotations

import threading

import gradio as gr
import pytest

from d3.models import ModelFacts
from explorer import live, page
from explorer.pool import ModelPool
from explorer.prepare import Preparation, percent
from explorer.session import Session
from explorer.view_handlers import model_changed
from tests.apphelpers import DEFAULTS, OUT, tiny_factory

WAIT_S = 60  # a bound on waiting for the background thread, never a measured time


class Held:
    """A preparation that reports one stage and then waits until released (or fails, for names in `fail`)."""

    def __init__(self, stage: str = "dequantizing the GGUF's tensors: 136 of 339", fail: tuple[str, ...] = ()):
        self.stage, self.fail = stage, fail
        self.reported, self.release = threading.Event(), threading.Event()
        self.calls: list[str] = []

    def __call__(self, name: str, report) -> None:
        self.calls.append(name)
        if name in self.fail:
            raise ValueError("the packages are damaged")
        report(self.stage)
        self.reported.set()
        assert self.release.wait(WAIT_S)


def finish(preparation: Preparation, held: Held) -> None:
    held.release.set()
    assert preparation._thread is not None
    preparation._thread.join(WAIT_S)
    assert preparation.done()


@pytest.mark.parametrize("stage, want", [("dequantizing the GGUF's tensors: 136 of 339 (12 s so far)", 40),
                                         ("assembling the GGUF: part 22 of 22", 100),
                                         ("downloading Qwen/x from the hub: 7% of 3.1 GB", 7),
                                         ("loading the converted weights", None)])
def test_percent_reads_the_stage_line(stage, want) -> None:
    assert percent(stage) == want


def test_models_are_prepared_one_after_another_and_say_how_far_they_are() -> None:
    held = Held()
    preparation = Preparation(("qwen2.5-coder-1.5b", "gemma3-270m"), prepare=held)
    assert preparation.message("qwen2.5-coder-1.5b") is None and preparation.line() == ""  # nothing started
    preparation.start()
    assert held.reported.wait(WAIT_S)
    assert preparation.message("qwen2.5-coder-1.5b") == ("qwen2.5-coder-1.5b is being prepared: 40% (dequantizing "
                                                         "the GGUF's tensors: 136 of 339). Try again when it is ready")
    assert "gemma3-270m is waiting to be prepared" in (preparation.message("gemma3-270m") or "")
    assert preparation.line() == ("Preparing the models once for this server: qwen2.5-coder-1.5b is being "
                                  "prepared: 40%; gemma3-270m waiting")
    assert preparation.message("a-model-not-ours") is None
    finish(preparation, held)
    assert held.calls == ["qwen2.5-coder-1.5b", "gemma3-270m"]
    assert preparation.message("qwen2.5-coder-1.5b") is None and preparation.message("gemma3-270m") is None
    assert preparation.line() == "" and preparation.html() == ""


def test_a_model_that_fails_to_prepare_is_said_and_the_others_go_on() -> None:
    held = Held(fail=("gemma3-270m",))
    preparation = Preparation(("gemma3-270m", "smollm2-135m"), prepare=held).start()
    finish(preparation, held)
    assert "could not be prepared on this server (the packages are damaged)" in (preparation.message("gemma3-270m") or "")
    assert preparation.message("smollm2-135m") is None and "could not be prepared" in preparation.line()


def test_a_public_server_refuses_a_run_on_a_model_being_prepared_at_once(tiny_engine) -> None:
    """The run is answered with the preparation's message and the model is never loaded inside the request; once
    the preparation is done the same run goes through. The model picker says it too."""
    held = Held()
    loads: list[str] = []
    factory = tiny_factory(tiny_engine)
    pool = ModelPool(lambda name: loads.append(name) or factory(name), public=True, names=("tiny",),
                     facts={"tiny": ModelFacts(num_layers=6, num_heads=4, chat_template=True)})
    preparation = Preparation(("tiny",), prepare=held)
    pool.preparing = preparation.message  # as page.build_demo wires a public server's pool
    preparation.start()
    assert held.reported.wait(WAIT_S)
    outputs = []
    with pytest.raises(gr.Error, match=r"tiny is being prepared: 40%"):
        for update in live.generate(pool, Session(), **{**DEFAULTS, "max_new_tokens": 2}):
            outputs.append(update)
    assert "tiny is being prepared: 40%" in outputs[-1][OUT["status"]]
    assert loads == [] and not pool.is_loaded("tiny")
    with pytest.raises(ValueError, match="being prepared"):
        pool.engine("tiny")
    assert "tiny is being prepared" in str(model_changed(pool, "tiny"))
    finish(preparation, held)
    last = list(live.generate(pool, Session(), **{**DEFAULTS, "max_new_tokens": 2}))[-1]
    assert "Done." in last[OUT["status"]] and loads == ["tiny"]


def test_the_public_page_shows_the_preparation_at_its_top_and_its_pool_asks_it(tiny_engine) -> None:
    preparation = Preparation(("tiny",), prepare=Held())
    demo = page.build_demo(tiny_factory(tiny_engine), public=True, model_names=("tiny",), preparation=preparation)
    assert demo.preparation is preparation and demo.pool.preparing == preparation.message
    shown = [b for b in demo.blocks.values() if isinstance(b, gr.HTML) and b.elem_id == "preparing"]
    assert len(shown) == 1
    (tick,) = [fn for fn in demo.fns.values() if shown[0] in fn.outputs]
    assert any(isinstance(demo.blocks[t[0]], gr.Timer) for t in tick.targets)  # refreshed by its timer
    assert tick.api_visibility == "private"  # not in gradio_client's API
    assert tick.fn()[0]["visible"] is False  # nothing started yet: no line
    preparation.start()
    assert preparation._prepare.reported.wait(WAIT_S)
    shown = tick.fn()[0]
    assert shown["visible"] is True and "tiny is being prepared: 40%" in shown["value"]
    finish(preparation, preparation._prepare)


def test_a_local_server_prepares_nothing(tiny_engine) -> None:
    demo = page.build_demo(tiny_factory(tiny_engine), public=False, model_names=("tiny",))
    assert demo.preparation is None and demo.pool.preparing is None
    assert not [b for b in demo.blocks.values() if isinstance(b, gr.HTML) and b.elem_id == "preparing"]


def test_quick_models_are_prepared_before_slow_ones(monkeypatch, tmp_path) -> None:
    """A model in the hub cache (nothing to do) before one to download, before one to convert from its packages."""
    from d3 import models
    from explorer.prepare import prepare_order

    hub = {"smollm2-135m": "cached/smol", "qwen2.5-coder-1.5b": "to/download"}
    monkeypatch.setattr(models, "hub_fallback", lambda name: hub.get(name))
    monkeypatch.setattr(models, "hub_cached", lambda hub_id: hub_id.startswith("cached/"))
    monkeypatch.setenv("D3_CACHE_DIR", str(tmp_path))  # nothing converted
    assert prepare_order(("gemma3-270m", "qwen2.5-coder-1.5b", "smollm2-135m", "mine")) == (
        "smollm2-135m", "qwen2.5-coder-1.5b", "gemma3-270m", "mine")
