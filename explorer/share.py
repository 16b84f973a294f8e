"""Links that carry the prompt and every control of the Live tab in their query string, so that a teacher can
prepare a state and open it in class: "Copy link" writes the link, and opening it sets the controls again.

Not gr.DeepLinkButton: it stores a snapshot of every component (panes and figures too) in the server's
memory under an id, so its links die with the server process (a Space that restarts or sleeps) and carry
nothing a person can read or edit. A query string holds the controls themselves, survives restarts, and is
read back here through `Controls`, which names every control once."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

import gradio as gr

from d3.config import default_core
from explorer import views
from explorer.controls import (
    CONTROL_NAMES,
    CONTROLS,
    DEFAULTS,
    METRICS,
    PAGE_TOKENS,
    STRATEGY_LABELS,
    Controls,
    default_attention_layer,
    model_defaults,
    parse_strategy,
    takes_controls,
)
from explorer.parse import as_choice, as_flag, as_number, shown
from explorer.pool import ModelPool
from explorer.runs import check_run
from explorer.ui import core_sliders, ordered, slider_range

# How a link stores each control (the control table's `link`): true/false, text kept as sent, or a number.
FLAGS = tuple(n for n, c in CONTROLS.items() if c.link == "flag")
TEXTS = tuple(n for n, c in CONTROLS.items() if c.link == "text")
RESTORE_OUTPUTS = (*CONTROL_NAMES, "status")
MAX_QUERY_CHARS = 20_000  # a link longer than this is not one the page wrote (the prompt cap keeps ours shorter)
# Runs in the browser after `share_link`: the page's own address (whatever proxy serves it) + the query string,
# copied to the clipboard where the browser allows it, and shown in the link box in any case.
COPY_JS = """(query) => { const url = window.location.origin + window.location.pathname + query;
  if (navigator.clipboard) navigator.clipboard.writeText(url).catch(() => {});
  return url; }"""


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def controls_query(controls: Controls) -> str:
    """'?prompt=…&model=…&…': every control in page order (None, the model's default, left out)."""
    pairs = [(name, _text(getattr(controls, name))) for name in CONTROL_NAMES if getattr(controls, name) is not None]
    return "?" + urlencode(pairs)


@takes_controls
def share_link(controls: Controls) -> Any:
    """The query string of a link to these controls (the browser puts the page's address in front), in the link
    box, which shows from now on."""
    return gr.update(value=controls_query(controls), visible=True)


def _value(name: str, raw: str) -> Any:
    """A link's value as the page's control takes it. Text that is not a finite number is kept as sent: the checks
    of a run refuse it with the field's own range (`controls_from_query`)."""
    if name in FLAGS:
        return as_flag(name, raw)
    if name in TEXTS:
        return raw
    try:
        number = float(raw)
    except ValueError:
        return raw
    if not math.isfinite(number):
        return raw
    return int(number) if number.is_integer() else number


def controls_from_query(pool: ModelPool, params: Mapping[str, str]) -> dict[str, Any]:
    """The controls a link names, as the page's components take them, checked as a run would check them (every
    strategy's settings, not only the chosen one's); ValueError with a plain message. {} for a plain address."""
    if sum(len(k) + len(v) for k, v in params.items()) > MAX_QUERY_CHARS:
        raise ValueError("this link is too long to be one the page wrote")
    values = {name: _value(name, params[name]) for name in CONTROL_NAMES if name in params}
    if not values:
        return {}
    c = DEFAULTS.with_(**{"prompt": "a prompt", "model": pool.names[0], **values})  # a link may leave both out
    check_run(pool, c)  # the prompt, the model, the chosen strategy, the generation settings
    facts = pool.known_facts(c.model)
    if facts is None:  # never load a model here: this runs as the page opens
        raise ValueError(f"the link's model {c.model!r} is not loaded on this server yet: choose it in the Model "
                         "picker, then open the link again")
    for strategy in STRATEGY_LABELS:  # the sliders of the other strategies must hold valid values too
        parse_strategy(c.with_(strategy=strategy), facts.num_layers, pool.caps)
    as_choice("metric", c.metric, METRICS)
    as_number("attention_head", c.attention_head, 0, max(facts.num_heads - 1, 0), integer=True)
    for name, value in values.items():  # a number no check above reads: said plainly, never sent to the page
        if name not in FLAGS + TEXTS and isinstance(value, str):
            raise ValueError(f"{name}={shown(value)} is not a number")
    return values


def restore_from_link(pool: ModelPool, request: gr.Request | None) -> tuple[Any, ...]:
    """As the page opens: the controls of the link it was opened with, or a plain message saying why not (the
    controls then keep the page's defaults). A plain address changes nothing."""
    params = dict(request.query_params) if request is not None else {}
    try:
        values = controls_from_query(pool, params)
    except ValueError as err:
        return ordered(RESTORE_OUTPUTS, status=views.problem_html(f"this link's settings were not loaded: {err}"))
    if not values:
        return ordered(RESTORE_OUTPUTS)
    note = "Settings loaded from the link: press Generate to run them."
    return ordered(RESTORE_OUTPUTS, status=views.status_html(None, None, note), **sized_to_model(pool, values))


def sized_to_model(pool: ModelPool, values: dict[str, Any]) -> dict[str, Any]:
    """The link's controls, with the layer and head sliders ranged to its model (the page was built for its first
    model) and set to the link's values or that model's defaults."""
    facts = pool.known_facts(values.get("model") or pool.names[0])  # known: `controls_from_query` checked it
    layers = facts.num_layers
    if "model" in values:  # a link to another model starts from that model's own D3 setting, like the picker
        page = model_defaults(values["model"])
        own = {"max_new_tokens": min(page.max_new_tokens, pool.caps.max_new_tokens)} \
            if values["model"] in PAGE_TOKENS else {}
        values = {"alpha": page.alpha, "drop_order": page.drop_order, "layer_order": page.layer_order, **own, **values}
    head, tail = default_core(layers)
    head, tail = values.get("core_head", head), values.get("core_tail", tail)
    ranged = {"attention_layer": (layers - 1, values.get("attention_layer", default_attention_layer(layers))),
              "attention_head": (facts.num_heads - 1, values.get("attention_head", 0))}
    return {**values, **core_sliders(layers, head, tail),
            **{name: gr.update(**slider_range(top), value=value) for name, (top, value) in ranged.items()}}


def share_box(ui: dict[str, Any]) -> None:
    """The button and the box that shows the link (under the key controls)."""
    with gr.Group(elem_classes=["d3-share"]):
        ui["share"] = gr.Button("Copy link to these settings (prompt and every control)", size="sm", elem_id="share")
        ui["share_url"] = gr.Textbox(label="Link (copied; open it to get these settings back)", interactive=False,
                                     elem_id="share-url", buttons=["copy"], visible=False)


def wire_share(pool: ModelPool, ui: dict[str, Any], demo: gr.Blocks) -> Any:
    """Copy link: the query string from the controls (Python, one place), then the browser's address in front.
    Opening a link: the controls from its query string, as the page loads; returns that event, after which the
    schedule preview is redrawn (nothing runs the model until Generate)."""
    copied = ui["share"].click(share_link, [ui[n] for n in CONTROL_NAMES], ui["share_url"], api_name="share_link",
                               queue=False, preprocess=False, show_progress="hidden")
    copied.then(None, ui["share_url"], ui["share_url"], js=COPY_JS, api_name=False, queue=False)
    def restore(request: gr.Request) -> tuple[Any, ...]:  # gradio passes the request to a parameter typed so
        return restore_from_link(pool, request)

    return demo.load(restore, None, [ui[n] for n in RESTORE_OUTPUTS],
              api_name="restore_from_link", queue=False, preprocess=False, show_progress="hidden")
