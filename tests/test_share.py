"""explorer/share.py: a link carries every control and reads back the same; a bad link says why and leaves the
controls; a link naming another model sizes the layer sliders to it. The page opening a link is in
tests/test_browser_lens.py."""

from __future__ import annotations

from urllib.parse import parse_qsl

import gradio as gr
import pytest

from d3.config import default_core
from explorer.caps import Caps
from explorer.controls import CONTROL_NAMES, DEFAULTS, default_attention_layer
from explorer.page import build_demo
from explorer.share import FLAGS, RESTORE_OUTPUTS, TEXTS, controls_from_query, controls_query, restore_from_link
from tests.apphelpers import CountingEngine
from tests.tiny import tiny_llama, tiny_tokenizer

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]
LAYERS = 30


ENGINE_LAYERS = LAYERS  # the conftest `engine` fixture's layer count for this module


def test_a_link_carries_every_control_and_reads_back_the_same(demo) -> None:
    controls = DEFAULTS.with_(prompt="Ünïcode & ?x=1 #hash", model="tiny", alpha=0.93, core_head=2, core_tail=5,
                              start=3, drop_order="strided", fill="propagate", max_new_tokens=24, decoding="sample",
                              temperature=1.2, seed=7, unified_ratio=2.0, skipdecode_max=20, skipdecode_min=8,
                              threshold=0.8, attention_layer=11, attention_head=1, metric="cos", log_kl=True,
                              presentation=True, strategy="skipdecode", chat_template=False)
    params = dict(parse_qsl(controls_query(controls)[1:], keep_blank_values=True))  # an empty order box too
    assert set(params) == set(CONTROL_NAMES)
    assert controls_from_query(demo.pool, params) == {n: getattr(controls, n) for n in CONTROL_NAMES}


@pytest.mark.parametrize("params, message", [
    ({"alpha": "1.5"}, "alpha"), ({"core_head": "20", "core_tail": "12"}, "core"), ({"fill": "glue"}, "fill"),
    ({"prompt": " "}, "prompt is empty"), ({"max_new_tokens": "1000"}, "max_new_tokens"),
    ({"chat_template": "maybe"}, "chat_template"), ({"attention_head": "99"}, "attention_head"),
])
def test_a_bad_link_says_why_and_leaves_the_controls(demo, params, message) -> None:
    with pytest.raises(ValueError, match=message):
        controls_from_query(demo.pool, params)
    request = type("Request", (), {"query_params": params})()
    out = dict(zip(RESTORE_OUTPUTS, restore_from_link(demo.pool, request)))
    assert "not loaded" in out["status"] and all(isinstance(out[n], type(gr.skip())) for n in CONTROL_NAMES)


@pytest.mark.parametrize("name", [n for n in CONTROL_NAMES if n not in FLAGS + TEXTS])
def test_a_link_with_a_number_that_is_not_one_names_the_fields_real_range(demo, name) -> None:
    """Not "alpha must be a number in [-inf, inf]": the range said is the one the field is checked against."""
    with pytest.raises(ValueError, match=f"{name}='fast' is not a number") as err:
        controls_from_query(demo.pool, {name: "fast"})
    assert "inf" not in str(err.value), str(err.value)


def test_a_link_with_a_non_numeric_alpha_says_alphas_range(demo) -> None:
    for raw in ("fast", "nan", "1e999"):
        with pytest.raises(ValueError, match=r"alpha must be a number in \(0, 1\]"):
            controls_from_query(demo.pool, {"alpha": raw})


def test_a_link_to_another_model_sizes_the_layer_sliders_to_it() -> None:
    """The page is built for its first model (30 layers); a link naming a loaded 12-layer model resizes the core,
    attention-layer and head sliders to that model, with the link's values or the model's defaults."""
    engines = {"tiny": CountingEngine(tiny_llama(LAYERS), tiny_tokenizer(), name="tiny"),
               "tiny12": CountingEngine(tiny_llama(12), tiny_tokenizer(), name="tiny12")}
    two = build_demo(lambda name: engines[name], model_names=("tiny", "tiny12"), public=False,
                     caps=Caps(max_new_tokens=64))
    two.pool.facts("tiny12")  # loaded, as after choosing it in the Model picker
    request = type("Request", (), {"query_params": {"model": "tiny12", "core_head": "2", "prompt": "hi"}})()
    out = dict(zip(RESTORE_OUTPUTS, restore_from_link(two.pool, request)))
    head, tail = default_core(12)
    sized = {n: (out[n]["maximum"], out[n]["value"]) for n in ("core_head", "core_tail", "attention_layer")}
    assert sized == {"core_head": (11 - tail, 2), "core_tail": (11 - 2, tail),
                     "attention_layer": (11, default_attention_layer(12))}
    assert out["model"] == "tiny12" and out["prompt"] == "hi" and "loaded from the link" in out["status"]
