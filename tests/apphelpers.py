"""Helpers shared by the page's tests: exports and Gradio's cache kept in pytest's tmp dirs, live-object counts,
RSS, one torch thread."""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gradio as gr

from d3.config import GenerationConfig
from d3.engine import Engine
from d3.models import unknown_name_message
from explorer import live, page
from explorer.page import free_port
from explorer.runs import side_by_side

if TYPE_CHECKING:
    import numpy as np
    from gradio_client import Client

    from explorer.pool import ModelPool
    from explorer.session import Session

ROOT = Path(__file__).resolve().parent.parent


def alive(cls: type) -> int:
    """Instances of `cls` still reachable after a full collection (what a leak would keep)."""
    gc.collect()
    return sum(1 for obj in gc.get_objects() if isinstance(obj, cls))


def rss_mib() -> float:
    """This process's resident memory in MiB (/proc/self/status)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def new_client(url: str):
    """A gradio_client Client that downloads files into GRADIO_TEMP_DIR (this module's tmp dir, see above)."""
    from gradio_client import Client

    return Client(url, verbose=False, download_files=os.environ.get("GRADIO_TEMP_DIR") or "/tmp/gradio")


def api_figure(output) -> dict:
    """A gr.Plot output as an API client receives it ({"type": "plotly", "plot": JSON}), as a dict."""
    import json

    return json.loads(output["plot"])


def array(value) -> np.ndarray:
    """A plotly data array from a figure's JSON: a plain list, or plotly's base64 typed array {dtype, bdata, shape}."""
    import base64

    import numpy as np

    if isinstance(value, dict) and "bdata" in value:
        flat = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = [int(n) for n in str(value.get("shape", flat.size)).split(",")]
        return flat.reshape(shape)
    return np.asarray(value, dtype=float)


def all_endpoints(url: str) -> dict:
    """Every endpoint a client may call, undocumented ones too (view_api lists only the public API):
    {"/name": {"parameters": [...], "returns": [...]}}."""
    import httpx

    return httpx.get(f"{url.rstrip('/')}/gradio_api/info", params={"all_endpoints": "true"}, timeout=30).json()["named_endpoints"]


def call_undocumented(client, url: str, api_name: str, **values):
    """client.predict for an endpoint the API does not document: gradio_client takes only positional values there,
    so they are put in the endpoint's order, with the page's defaults for those not given."""
    params = all_endpoints(url)[api_name]["parameters"]
    unknown = set(values) - {p["parameter_name"] for p in params}
    assert not unknown, f"{api_name} has no parameter(s) {sorted(unknown)}"
    args = [values.get(p["parameter_name"], p.get("parameter_default")) for p in params]
    return client.predict(*args, api_name=api_name)


def output_names(client, api_name: str) -> list[str]:
    """The names view_api gives an endpoint's outputs, in order."""
    info = client.view_api(return_format="dict", print_info=False)["named_endpoints"][api_name]
    return [r["label"] for r in info["returns"]]


# ---------------------------------------------------------------- the page's tiny model, served and called


class CountingEngine(Engine):
    """The tiny engine, counting decode steps, optionally slowed down so a run outlasts a click."""

    def __init__(self, *args, delay: float = 0.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.delay = delay
        self.steps = 0
        self.closed = 0

    def run(self, *args, **kwargs):
        try:
            for item in super().run(*args, **kwargs):
                self.steps += 1
                time.sleep(self.delay)
                yield item
        finally:
            self.closed += 1


@contextlib.contextmanager
def serve(demo: gr.Blocks) -> Iterator[str]:
    """Serve `demo` on 127.0.0.1 on a free port; always closed afterwards."""
    for attempt in range(3):
        port = free_port()
        try:
            page.launch(demo, prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
            break
        except ValueError as err:  # gradio's own check of the new server gives up after one 3 s request
            demo.close()
            if "localhost is not accessible" not in str(err) or attempt == 2:
                raise
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        demo.close()


def tiny_engines(layers: dict[str, int]) -> dict[str, CountingEngine]:
    """Tiny random Llamas served under the embedded models' names with their layer counts ({name: layers})."""
    from tests.tiny import tiny_llama, tiny_tokenizer
    return {name: CountingEngine(tiny_llama(n), tiny_tokenizer(), name=name) for name, n in layers.items()}


@contextlib.contextmanager
def serve_engines(engines: dict[str, Engine], max_new_tokens: int = 64) -> Iterator[str]:
    """The page as a local server builds it (not public), over these engines; yields its address."""
    from explorer.caps import Caps
    demo = page.build_demo(engines.__getitem__, model_names=tuple(engines), public=False,
                           caps=Caps(max_new_tokens=max_new_tokens))
    with serve(demo) as address:
        yield address


def wait_until(condition, timeout: float = 60.0, every: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(every)


DEFAULTS = dict(prompt="hello there", model="tiny", chat_template=True, strategy="d3", alpha=0.9, core_head=1,
                core_tail=1, start=0, drop_order="middle_out", layer_order="", fill="copy", max_new_tokens=8,
                decoding="greedy",
                temperature=0.8, seed=0, unified_ratio=1.5, skipdecode_max=0, skipdecode_min=0, threshold=0.9,
                attention_layer=3, attention_head=0, metric="both", log_kl=False, presentation=False)


def tiny_factory(engine):
    def build(name: str):
        if name != "tiny":
            raise ValueError(unknown_name_message(name))  # as d3.models does
        return engine
    return build


def run(pool: ModelPool, session: Session | None = None, **overrides) -> list[tuple]:
    return list(live.generate(pool, session, **{**DEFAULTS, **overrides}))


# What the API tests send to /generate.
RUN = dict(prompt="hello there", alpha=0.9, core_head=1, core_tail=1, attention_layer=3, max_new_tokens=8)


# The outputs of a Generate stream by name; an output a step leaves as it was is a bare gr.update().
OUT = {name: i for i, name in enumerate(live.GENERATE_OUTPUTS)}


def is_skip(value) -> bool:
    return isinstance(value, dict) and value.get("__type__") == "update" and len(value) == 1


def last_value(outputs: list[tuple], name: str):
    """The newest value an output received over a stream (outputs left as they were are skipped)."""
    values = [o[OUT[name]] for o in outputs if not is_skip(o[OUT[name]])]
    return values[-1]


def api_defaults(client: Client) -> dict[str, dict[str, Any]]:
    """Each named endpoint's parameters with the page's default values (undocumented endpoints too)."""
    endpoints = all_endpoints(client.src)
    return {name: {p["parameter_name"]: p.get("parameter_default") for p in ep["parameters"]}
            for name, ep in endpoints.items()}


# The controls the needs and layers views are measured with in their handler tests.
NEEDS_CONTROLS = dict(prompt="hello there", model="tiny", chat_template=True, strategy="d3", alpha=0.9, core_head=1,
                      core_tail=1, start=0, drop_order="middle_out", fill="copy", max_new_tokens=10, decoding="greedy")


def run_pair(engine, strategy, tokens: int = 8, prompt: str = "hello there"):
    """The finished update of a side-by-side run on `engine`."""
    *_, last = side_by_side(engine, prompt, strategy, GenerationConfig(max_new_tokens=tokens))
    return last
