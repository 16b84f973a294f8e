"""Handlers that only redraw or set controls: the schedule preview, the views of a finished run, presentation mode,
the model and example pickers, and the scenarios' controls. None of them runs the model."""

from __future__ import annotations

import html
from typing import Any

import gradio as gr

from d3.config import default_core
from d3.models import ModelFacts
from d3.research.data import example_prompts
from explorer import views
from explorer.controls import (
    CONTROL_NAMES,
    DEFAULTS,
    PAGE_TOKENS,
    Controls,
    check_sliders,
    clamped_core,
    core_of,
    default_attention_layer,
    derived,
    fitted,
    model_defaults,
    page_words,
    parse_controls,
    parse_schedule,
    slider_ranges,
    takes_controls,
)
from explorer.memory import DROPPED, dropped_view
from explorer.parse import as_choice
from explorer.parse import shown as shown_value
from explorer.pool import ModelPool
from explorer.scenarios import (
    ARITHMETIC,
    INTERRUPTED,
    SCENARIOS,
    fill_finding,
    scenario_controls,
    scenario_finding,
    scenario_text,
)
from explorer.session import Session
from explorer.ui import core_sliders, ordered, refused, slider_range, user_errors
from explorer.views import planned

# Presentation mode redraws every view drawn from the session's run, and hides every explanation.
DRAWN_ON_OPEN = (*views.drawn_from_session(), planned.KEY)  # views `open_view` draws when their tab opens
VIEW_OUTPUTS = (*views.drawn_from_session(), "root", *(f"explain_{v.key}" for v in views.registry() if v.tab))
SCENARIO_OUTPUTS = (*CONTROL_NAMES, "scenario_text", "scenario_finding", "example")
SIZED_OUTPUTS = ("core_head", "core_tail", "attention_layer", "attention_head", "chat_template", "alpha", "drop_order",
                 "layer_order", "max_new_tokens")
# A model switch also empties the panes and the views: what they showed was a run of the other model.
CLEARED_OUTPUTS = ("d3_title", "d3_tokens", "d3_counters", "full_tokens", "full_counters",
                   *views.drawn_from_session(), "layers_note")  # the note said what Use this order set: reset now
MODEL_OUTPUTS = (*SIZED_OUTPUTS, "status", "session", *CLEARED_OUTPUTS)


def new_session() -> Session:
    """The page's session: it opens on the first view tab, and only the open view is drawn (`Session.due`)."""
    return Session(view=next(v.key for v in views.registry() if v.tab))


def view_opened(key: str, session: Session | None) -> None:
    """Remember which view tab is open (views drawn only while their tab is open, such as the lens, check it)."""
    if session is not None:
        session.opened(key)


@takes_controls
def open_view(pool: ModelPool, key: str, session: Session | None, controls: Controls) -> Any:
    """A person opened view `key`'s tab: draw it if what it shows is stale (it changed while its tab was hidden),
    else send nothing."""
    if session is None or not session.opened(key):
        return gr.skip()
    pool.sessions.touch(session)
    if key == planned.KEY:
        return redraw_schedule.__wrapped__(pool, None, controls)[1]  # the controls already parsed into `Controls`
    with user_errors():
        return _draw(key, session, controls)


def _draw(key: str, session: Session, controls: Controls) -> Any:
    """View `key` of the session's run; a view of attention that was dropped to make room says so."""
    if dropped_view(session, key):
        return views.waiting(DROPPED, presentation=controls.view.presentation)
    return views.draw(key, views.Shown.of(session), controls.view)


SCENARIO_QUESTION = "Worked arithmetic (the scenarios' question)"


def prompt_titles() -> dict[str, str]:
    """The Example prompt menu: title -> prompt, the example prompts and the scenarios' arithmetic question (so that
    the menu names the prompt a scenario set, never goes blank)."""
    return {**{p.title: p.prompt for p in example_prompts()}, SCENARIO_QUESTION: ARITHMETIC}


def use_example(title: str) -> str:
    prompts = prompt_titles()
    with user_errors():
        return prompts[as_choice("example", title, tuple(prompts))]


def _sized(facts: ModelFacts, model: str = "", max_tokens: int | None = None) -> dict[str, Any]:
    """The layer and head controls sized to a model, with its default core and attention layer: each core
    slider's maximum is computed from the other's new value, so the bounds are consistent at once."""
    layers = facts.num_layers
    head, tail = default_core(layers)
    return dict(**core_sliders(layers, head, tail),
                attention_layer=gr.update(**slider_range(layers - 1), value=default_attention_layer(layers, model)),
                attention_head=gr.update(**slider_range(facts.num_heads - 1), value=0),
                chat_template=gr.update(value=facts.chat_template), **_model_schedule(model, max_tokens))


def _model_schedule(model: str, max_tokens: int | None = None) -> dict[str, Any]:
    """α, the drop order, the calibrated order and the new tokens the page starts a model with (its measured best, if
    any; the tokens no more than the server's `max_tokens`: `Controls.new_tokens` refuses more)."""
    page = model_defaults(model)
    schedule = dict(alpha=page.alpha, drop_order=page.drop_order, layer_order=page.layer_order)
    if model in PAGE_TOKENS:  # a model of no table leaves the tokens a person chose as they are
        tokens = page.max_new_tokens if max_tokens is None else min(page.max_new_tokens, max_tokens)
        schedule["max_new_tokens"] = tokens
    return schedule


def _cleared(session: Session | None, model: str, presentation: bool = False) -> dict[str, Any]:
    """Stop this session's run and forget it (the history keeps it), and empty the panes and the views."""
    if session is None:
        return {}
    session.abandon()  # stop its run, which shows nothing more: no run follows a model switch (RULES)
    session.settled = session.released = None  # the controls are set anew: the next settle answers in full
    previous = session.d3.model if session.d3 is not None else None
    session.clear()
    session.problem = None
    blank = "<div class='d3-tokens'>(press Generate)</div>"
    p = presentation
    out = dict(session=session, d3_title="### D3", d3_tokens=blank, full_tokens=blank, d3_counters="",
               full_counters="", layers_note="",
               **{key: views.empty(key, p) for key in session.due(views.drawn_from_session())})
    was = f" (the last run, of {previous}, is in Run history)" if previous and previous != model else ""
    out["status"] = views.status_html(None, None, f"Model {model}: press Generate.{was}")
    return out


def model_changed(pool: ModelPool, model: str, session: Session | None = None, presentation: Any = False) -> tuple[Any, ...]:
    """Size the layer and head controls to the chosen model when that needs no load (a known or loaded model);
    otherwise say it is loading and leave the load to `load_model`, in the queue. Either way the panes and views
    of the other model's run are emptied. Answers at once; a name this server refuses is said in the status line
    (out of the queue an error would be an HTTP 500)."""
    try:
        facts = pool.known_facts(model)
        name = pool.check_name(model)
    except ValueError as err:
        return ordered(MODEL_OUTPUTS, status=views.problem_html(str(err)))
    cleared = _cleared(session, name, presentation is True)
    if facts is None:
        return ordered(MODEL_OUTPUTS, **{**cleared, "status": views.status_html(None, None, "loading",
                                                                                note=f"Model: {name}")})
    absent = pool.missing(name)  # a known model that is not installed: the command that installs it, now
    extra = {} if absent is None else {"status": views.problem_html(absent)}
    return ordered(MODEL_OUTPUTS, **{**cleared, **_sized(facts, name, pool.caps.max_new_tokens), **extra})


def load_model(pool: ModelPool, model: str) -> tuple[Any, ...]:
    """Load a model that is neither known nor loaded (in the queue, one load at a time), then size the controls."""
    try:
        name = pool.check_name(model)
    except ValueError as err:  # `model_changed` has said so in the status line already
        raise refused(err) from None
    with user_errors():
        if name in pool.names and pool.known_facts(name) is not None:
            return ordered(MODEL_OUTPUTS)  # one of the page's models, known or loaded: `model_changed` sized them
        facts = pool.facts(name)
    return ordered(MODEL_OUTPUTS, **_sized(facts, name, pool.caps.max_new_tokens),
                   status=views.status_html(None, None, f"Model {name} is loaded: press Generate."))


SETTLE_OUTPUTS = ("status", "core_head", "core_tail", "layer_order")


def text_kind(prompt: Any) -> str:
    """The kind of text a prompt is, as the scenarios choose their order (`scenario_controls`): the worked
    arithmetic question, or chat."""
    return "arithmetic" if prompt == ARITHMETIC else "chat"


@takes_controls
def settle_controls(pool: ModelPool, session: Session | None, controls: Controls) -> tuple[Any, ...]:
    """After a person's move of a control (see `_settle`)."""
    return _settle(pool, session, controls)


POINTER = "pointer"  # a release from a pointer on a slider's track or its reset (assets/decay_preview.js)


@takes_controls
def settle_released(pool: ModelPool, session: Session | None, how: Any = POINTER,
                    controls: Controls = DEFAULTS) -> tuple[Any, ...]:
    """After a person let go of a slider: as `settle_controls`, except that a value just typed out of the slider's
    range keeps its message: the browser clamps the box to the slider's end as it loses focus, and that clamped
    value is not what the person asked for (`check_release` then runs nothing). The other core slider's bound
    still follows the clamped value. `how`: what the browser saw let go (`POINTER`, or a box left by a key or a
    click elsewhere, a click on Stop too): only a pointer's release runs (RULES, "a typed value")."""
    if session is not None:
        session.pointer_release = how == POINTER
    if session is not None and session.typed_out_of_range:
        facts = _facts(pool, controls)
        if facts is None:
            return ordered(SETTLE_OUTPUTS)
        return ordered(SETTLE_OUTPUTS, **_bounds(clamped_core(controls, facts.num_layers, session.core),
                                                 facts.num_layers, pool.caps))
    return _settle(pool, session, controls)


def _facts(pool: ModelPool, controls: Controls) -> ModelFacts | None:
    try:
        return pool.known_facts(controls.model)
    except ValueError:
        return None


def _bounds(controls: Controls, layers: int, caps: Any) -> dict[str, Any]:
    """The core sliders' maxima, as component updates that set nothing else (no value: the browser keeps it)."""
    return {k: gr.update(**v) for k, v in derived(controls, layers, caps).items()}


def _settle(pool: ModelPool, session: Session | None, controls: Controls) -> tuple[Any, ...]:
    """After a person's move of a control: what follows from the one state of the controls, set once, by the
    server, on components nothing listens to (so it starts no other update): the core sliders' maxima (head + tail
    below L; a value typed past a slider's end counts as that end, where the browser puts it), a calibrated order
    re-fitted to a new core (said in one line), and in the status line what is wrong with the controls, named as
    the page labels it with its real range, or that message taken back once every control is valid again. Nothing
    runs."""
    facts = _facts(pool, controls)
    if facts is None:
        return ordered(SETTLE_OUTPUTS)  # not loaded yet: Generate checks it after the load
    if session is not None:
        if session.settled == controls:  # already answered: an update of a slider can fire its input again (the
            return ordered(SETTLE_OUTPUTS)  # browser sent core-head's input ~7 times a second, issue 24)
        session.settled = controls
    layers = facts.num_layers
    last = session.core if session is not None else None
    try:
        check_sliders(controls, layers, pool.caps, last)
        typed = False
    except ValueError:
        typed = True
    out: dict[str, Any] = _bounds(clamped_core(controls, layers, last) if typed else controls, layers, pool.caps)
    if session is not None:
        session.typed_out_of_range = typed
        if not typed:
            session.core = core_of(controls, layers)
    controls, note = fitted(controls, layers, text_kind(controls.prompt))
    if note:
        out["layer_order"] = controls.layer_order
    try:
        if typed:
            check_sliders(controls, layers, pool.caps, last)
        parse_controls(controls, layers, pool.caps)
    except ValueError as err:
        message = page_words(str(err)) + (_clamped_note(controls, layers, pool.caps, last) if typed else "")
        if session is not None:
            session.problem = message
        return ordered(SETTLE_OUTPUTS, **out, status=views.problem_html(message))
    if session is not None and session.running is not None:
        return ordered(SETTLE_OUTPUTS, **out)  # the status line is the run's
    had_problem = session is not None and session.problem is not None
    if session is not None:
        session.problem = None
    if not note and not had_problem:
        return ordered(SETTLE_OUTPUTS, **out)
    s = session or Session()
    phase = s.ended if s.d3 is not None and s.ended else "Ready: press Generate."  # as the last run ended
    return ordered(SETTLE_OUTPUTS, **out, status=views.status_html(s.d3, s.full, phase, comparison=s.comparison,
                                                                     note=note))


def _clamped_note(controls: Controls, layers: int, caps: Any, last: tuple[int, int] | None) -> str:
    """What the box of a value typed past its slider's end shows once it loses focus (the browser puts it at that
    end), said beside the refusal: nothing ran, and Generate would run that value."""
    for name, (lo, hi, _) in slider_ranges(clamped_core(controls, layers, last), layers, caps).items():
        try:
            number = float(getattr(controls, name))
        except (TypeError, ValueError):
            continue
        if not lo <= number <= hi:
            shown = f"{min(max(number, lo), hi):g}"
            return f". The slider shows {shown}: nothing ran (press Generate to run {shown}, or type a value in range)"
    return ""


@takes_controls
def check_release(pool: ModelPool, session: Session | None, controls: Controls) -> None:
    """A slider let go runs only on a valid value: otherwise nothing runs (and `settle_controls` says why). A value
    typed out of the slider's range runs nothing either, though the browser clamped it as the box lost focus: the
    person asked for another value (the message says which range; Generate runs what the slider shows)."""
    if session is not None and not session.pointer_release:
        raise refused(ValueError("a value typed into a slider's box: press Generate to run it"))
    if session is not None and session.typed_out_of_range:
        session.typed_out_of_range = False
        raise refused(ValueError("a value typed out of the slider's range: press Generate to run what it shows"))
    if session is not None and session.released == controls:  # a release that changed nothing (or one the
        raise refused(ValueError("nothing changed since the last run: press Generate to run it again"))  # page repeats)
    try:
        facts = pool.known_facts(controls.model)
        if facts is not None:
            check_sliders(controls, facts.num_layers, pool.caps)
            parse_controls(fitted(controls, facts.num_layers, text_kind(controls.prompt))[0], facts.num_layers,
                           pool.caps)
    except ValueError as err:
        raise refused(ValueError(page_words(str(err)))) from None
    if session is not None:
        session.released = controls


@takes_controls
def redraw_schedule(pool: ModelPool, session: Session | None, controls: Controls) -> tuple[Any, Any]:
    """(decay curve, planned grid) from the controls alone: no model runs. While a slider moves, the browser
    redraws the curve itself (assets/decay_preview.js); this runs when it is let go or another control changes.
    A schedule that cannot be drawn says why in both."""
    p = controls.view.presentation
    try:
        facts = pool.known_facts(controls.model)  # a name this server refuses: said in the preview, like the rest
        if facts is None:  # never load a model here: this runs out of the queue, on every control change
            raise ValueError("the schedule is drawn once this model is loaded (press Generate)")
        s = parse_schedule(controls, facts.num_layers, pool.caps)
    except ValueError as err:  # shown in the preview; Generate says it in the status line
        message = views.waiting(f"Cannot draw this schedule:<br>{html.escape(page_words(str(err)))}", presentation=p)
        return message, message
    trace = session.d3 if session is not None else None
    grid = session.due((planned.KEY,)) if session is not None else (planned.KEY,)  # the grid: only if its tab is open
    return (views.decay_view(s.strategy, s.num_layers, s.steps, trace=trace, others=s.others, presentation=p),
            views.planned_view(s.strategy, s.num_layers, s.steps, layer_types=_layer_types(pool, controls.model),
                               presentation=p) if grid else gr.skip())


def _layer_types(pool: ModelPool, model: Any) -> tuple[str, ...] | None:
    """The loaded model's attention type per layer (what the engine fills by), None while it is not loaded: the
    preview never loads a model."""
    name = str(model)
    if not pool.is_loaded(name):
        return None
    return tuple(pool.engine(name).adapter.layer_types)


ATTENTION_OUTPUTS = ("attention", "heads")  # the views drawn for the attention layer and head


@takes_controls
def render_attention(session: Session | None, controls: Controls) -> tuple[Any, Any]:
    """The one-head and all-heads attention views for the chosen layer and head (each only if its tab is open)."""
    s = session or Session()
    with user_errors():
        return ordered(ATTENTION_OUTPUTS, **{key: _draw(key, s, controls) for key in s.due(ATTENTION_OUTPUTS)})


@takes_controls
def set_presentation(session: Session | None, controls: Controls) -> tuple[Any, ...]:
    """Presentation mode: bigger fonts everywhere, explanations hidden so each view takes the full width."""
    view = controls.view
    p = view.presentation
    classes = ["d3-root", "d3-present"] if p else ["d3-root"]
    explain = {f"explain_{v.key}": gr.update(visible=not p) for v in views.registry() if v.tab}
    shown = views.Shown.of(session)
    due = session.due(views.drawn_from_session()) if session is not None else views.drawn_from_session()
    with user_errors():
        return ordered(VIEW_OUTPUTS, **{key: views.draw(key, shown, view) for key in due},
                       root=gr.update(elem_classes=classes), **explain)


def apply_scenario(pool: ModelPool, key: str, step: int, session: Session | None, model: str) -> tuple[Any, ...]:
    """Set the controls of run `step` of a preset scenario (and stop whatever this session is running). A later
    run of a scenario is refused (silently: the chain of its runs ends) when a person asked for something else
    since its previous run began (Stop, Generate, another scenario, a slider released): it would set the controls
    under the newer run and stop it (issue 24, a scenario clicked during another's runs)."""
    if session is not None:
        if not session.start_scenario(key, step):
            raise refused(ValueError(f"the scenario {SCENARIOS[key].title!r} was interrupted"))
        session.settled = session.released = None  # the controls are set anew: the next settle answers in full
    wanted = SCENARIOS[key].runs[min(step, len(SCENARIOS[key].runs) - 1)].get("model", model)
    if wanted not in pool.names:  # a run on a model this page does not offer: the chain ends here
        raise refused(ValueError(f"the scenario {SCENARIOS[key].title!r} runs model={shown_value(wanted)}, which this "
                                 f"page does not offer: choose one of {', '.join(pool.names)}"))
    with user_errors():
        layers = pool.facts(wanted).num_layers
        values = scenario_controls(key, step, layers, wanted)
    values.update(core_sliders(layers, values["core_head"], values["core_tail"]))
    finding = {"scenario_finding": "*Running… the numbers appear here when the scenario's runs are done.*"} if step == 0 else {}
    titles = {prompt: title for title, prompt in prompt_titles().items()}  # the picker names the scenario's prompt
    return ordered(SCENARIO_OUTPUTS, scenario_text=scenario_text(key, step), **finding, **values,
                   example=gr.update(value=titles.get(values["prompt"])))


def scenario_interrupted(key: str, session: Session | None) -> Any:
    """A scenario's chain ended before its last run: say so under its text, unless another scenario's text is there."""
    return INTERRUPTED if session is not None and session.scenario_state(key) == "interrupted" else gr.skip()


def scenario_goes_on(key: str, session: Session | None) -> None:
    """Before a scenario's fill comparison: refused (silently, ending its chain) when something else was asked for
    since its run began."""
    if session is not None and session.scenario_state(key) != "current":
        raise refused(ValueError(f"the scenario {SCENARIOS[key].title!r} was interrupted"))


def show_finding(pool: ModelPool, key: str, session: Session | None, model: str) -> Any:
    """What a scenario's runs showed, with their numbers, under its text (after its last run or fill comparison);
    nothing when another scenario's runs came after them (that one's text is shown)."""
    if session is None or not session.history:
        return ""
    state = session.scenario_state(key)
    if state != "current":
        return gr.skip() if state == "replaced" else INTERRUPTED
    try:
        layers = pool.facts(model).num_layers
    except ValueError:
        return ""
    runs = len(SCENARIOS[key].runs)
    text = scenario_finding(key, [r.detail() for r in session.history[-runs:]], layers, model)
    if SCENARIOS[key].fills and session.fills:
        text += "\n\n" + fill_finding(session.fills)
    return text
