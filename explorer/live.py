"""Handlers of the Live tab's runs: generate (both panes streamed, then the comparison), compare fills, stop."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import gradio as gr

from d3.config import FILLS
from d3.trace import measured_speedup
from explorer import views
from explorer.caps import Caps
from explorer.controls import Controls, ViewOptions, page_words, takes_controls
from explorer.deadline import Deadline
from explorer.pool import ModelPool
from explorer.runs import LiveUpdate, RunSetup, check_run, fill_comparison, prepare_run, side_by_side
from explorer.session import Session
from explorer.ui import caller_check, ordered, refused, user_errors
from explorer.views import decay, errors, fills
from viz import counters_html, token_html

# The panes, the decay curve, every view a run draws (the view registry), the fill view (emptied by a new run) and
# the run history.
RUN_VIEWS = views.drawn_after_run()
GENERATE_OUTPUTS = ("session", "status", "d3_title", "d3_tokens", "d3_counters", "full_tokens", "full_counters",
                    decay.KEY, *RUN_VIEWS, *(() if fills.KEY in RUN_VIEWS else (fills.KEY,)), "history")
FILLS_OUTPUTS = ("session", "status", fills.KEY)


ASKED = "A new run is asked for: the one before stops within one token…"


class _Streaming:
    """How many runs stream on this server now, every visitor's together: a run's wait for its first token says
    when another run shares the CPU (or holds the slot it waits for). A count, not anyone's data."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def one(self) -> Iterator[None]:
        with self._lock:
            self.count += 1
        try:
            yield
        finally:
            with self._lock:
                self.count -= 1


STREAMING = _Streaming()


def others_note(others: int) -> str:
    """What another visitor's run does to this one: it shares the CPU (or holds a run slot this one waits for)."""
    if others <= 0:
        return ""
    runs = "1 other run is" if others == 1 else f"{others} other runs are"
    return f"{runs} generating on this server: this one shares the CPU with it or waits for it to finish."


def first_token_note(prompt_tokens: int, others: int) -> str:
    """What happens before the first token: each run reads the prompt at full depth (the prefill), then D3's first
    token, then full depth's; on a busy server another run shares the CPU (a bare "Generating…" for 40 s says
    nothing)."""
    prefill = (f"Prefill: each run reads the {prompt_tokens} prompt tokens at full depth before its first token…"
               if prompt_tokens else "Prefill: each run reads the prompt at full depth before its first token…")
    return " ".join(n for n in (prefill, others_note(others)) if n)


def interrupt(session: Session | None) -> str:
    """A new run was asked for: stop this session's running one now, before the new one waits in the queue, and say
    so at once (the click is answered before the queue reaches the run)."""
    own = 0
    if session is not None:
        own = 1 if session.running is not None else 0
        session.trigger()
    return views.status_html(None, None, ASKED, note=others_note(STREAMING.count - own))


def stop(session: Session | None) -> str:
    if session is None or session.running is None:  # idle: say so, with the last run's numbers as it ended
        s = session or Session()
        if s.d3 is None or not s.ended:
            return views.status_html(None, None, "Nothing is running.")
        return views.status_html(s.d3, s.full, s.ended, comparison=s.comparison, note="Nothing is running.")
    session.request_stop()
    return views.status_html(session.d3, session.full, "Stopping… (within one token)")


def _refuse(outputs: tuple[str, ...], err: ValueError, session: Session | None = None) -> Iterator[tuple[Any, ...]]:
    """Say once, in the status line, why a run cannot start, and leave the last run's panes and figures as they
    are; the error still ends the event (for API callers) but shows no toast and no error badge on the outputs
    (the page puts the event's progress and error state on a hidden element, see wiring). The session remembers
    it, so that fixing the control takes it back (view_handlers.check_controls)."""
    if session is not None:
        session.problem = str(err)
    yield ordered(outputs, status=views.problem_html(page_words(str(err))))
    raise refused(err)


PANES_EVERY_S = 0.15  # while streaming, panes and counters go to the page at most this often
FIGURES_EVERY_S = 1.5  # and the layer grid and decay curve at most this often (a redraw costs the page ~0.3 s)


class _Pacer:
    """Which streamed updates go to the page. A browser redrawing every token of a fast model freezes (plotly
    redraws and HTML swaps pile up on its main thread), so while streaming the panes are sent at most every
    PANES_EVERY_S and the heavy figures on the first D3 token, then every `every` D3 tokens but at most every
    FIGURES_EVERY_S. Phase changes are always sent. Each update carries the whole run so far, so one that is
    skipped loses nothing."""

    def __init__(self, every: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.every, self.clock = every, clock
        self.panes_at = self.figures_at = -math.inf

    def panes(self, update: LiveUpdate) -> bool:
        now = self.clock()
        if update.phase == "streaming" and now - self.panes_at < PANES_EVERY_S and not self._first(update):
            return False
        self.panes_at = now
        return True

    def figures(self, update: LiveUpdate) -> bool:
        now = self.clock()
        if update.phase == "streaming" and not self._first(update):
            counted = update.pane == "d3" and update.d3 is not None and (len(update.d3.steps) - 1) % self.every == 0
            if not counted or now - self.figures_at < FIGURES_EVERY_S:
                return False
        self.figures_at = now
        return True

    @staticmethod
    def _first(update: LiveUpdate) -> bool:
        return update.pane == "d3" and update.d3 is not None and len(update.d3.steps) == 1


def _full_prob(update: LiveUpdate) -> Any:
    """Full depth's probability of each D3 token on D3's text, once the comparison is in (None before)."""
    c = update.comparison
    return c.full_prob if c is not None and c.full_logprob.size else None


def _full_ppl(update: LiveUpdate) -> float | None:
    c = update.comparison
    return c.full_perplexity() if c is not None and c.full_logprob.size else None


def _render(session: Session, setup: RunSetup, update: LiveUpdate, view: ViewOptions, figures: bool,
            note: str = "") -> tuple[Any, ...]:
    """The outputs of one streamed update: panes and counters always, heavy figures when due."""
    d3, full, p = update.d3, update.full, view.presentation
    measured = measured_speedup(d3, full)
    out: dict[str, Any] = dict(
        session=session, status=views.status_html(d3, full, update.phase, comparison=update.comparison, note=note),
        d3_tokens=token_html(d3, reference=full, full_prob=_full_prob(update), full_ppl=_full_ppl(update))
        if d3 else gr.skip(),
        d3_counters=counters_html(d3, reference=full, speedup=measured) if d3 else gr.skip(),
        full_tokens=token_html(full) if full else gr.skip(),
        full_counters=counters_html(full, paired=d3) if full else gr.skip())
    shown = views.Shown(d3, full, update.comparison, session.fills, update.phase)
    if figures:
        cfg, steps, layers = setup.strategy, setup.gen.max_new_tokens, setup.engine.num_layers
        live = session.due(v.key for v in views.registry() if v.live and v.after_run)
        out.update(decay=views.decay_view(cfg, layers, steps, trace=d3, others=setup.others, presentation=p),
                   **{key: views.draw(key, shown, view) for key in live})
    if update.phase == "comparing":  # the last tokens are in: the error view says it is being computed
        out.update({key: views.draw(key, shown, view) for key in session.due((errors.KEY,))})
    if update.finished:  # the heavy views once, at the end, and only the one whose tab is open (Session.due)
        out.update({key: views.draw(key, shown, view) for key in session.due(RUN_VIEWS)})
        out["history"] = session.history_frame()
    return ordered(GENERATE_OUTPUTS, **out)


def _first_outputs(session: Session, setup: RunSetup, view: ViewOptions, *, clear_fills: bool = True) -> tuple[Any, ...]:
    """Clear what the previous run left in the views, and name the strategy over the D3 pane. The fill view is
    sent only when it showed a comparison: it already says what Compare does otherwise, and a placeholder sent to
    a view whose tab was never opened is drawn by gradio as an empty box with an icon."""
    p = view.presentation
    blank = "<div class='d3-tokens'>(waiting for the first token…)</div>"
    emptied = {key: views.empty(key, p, running=True)
               for key in session.due(k for k in RUN_VIEWS if not views.by_key()[k].live)}
    fills_due = list(session.due((fills.KEY,) if clear_fills else ()))
    emptied_fills = {fills.KEY: views.empty(fills.KEY, p)} if fills_due else {}
    note = first_token_note(setup.prompt_tokens, STREAMING.count)
    return ordered(GENERATE_OUTPUTS, session=session, status=views.status_html(None, None, "streaming", note=note),
                   d3_title=f"### {views.pane_title(setup.strategy, 'D3')}", d3_tokens=blank, full_tokens=blank,
                   d3_counters="", full_counters="", **emptied, **emptied_fills)


def measuring_note(done: int, tokens: int) -> str:
    """What the comparison is measuring now, and how far it is."""
    if done < tokens:
        return (f"Teacher-forced D3 run on full depth's text (for the KL per token): token {done} of {tokens} "
                f"({100 * done // max(tokens, 1)}%).")
    return "Full depth's probabilities of D3's text (for the free-running KL and perplexity): one pass…"


def _time_limit_note(limit_s: int, written: int | None = None, asked: int | None = None,
                     first_s: float | None = None) -> str:
    """Why a run stopped early; with the tokens each pane wrote (`written`, the fewer of the two) of the `asked`,
    what would fit: on a slow model (Qwen2.5-Coder at ~0.3 token/s under load) a page run ends here mid-answer.
    `first_s`: how long the first token took (the prefill and any wait for another run). No pace of its own: the
    counters give the one pace, named "tokens/s while decoding" (issue 40: "0.12 tokens/s per pane" here against
    0.4 in the counters)."""
    if written is None or asked is None:
        return f"This run reached the server's time limit of {limit_s} s: try fewer tokens."
    wait = f" (the first token came after {first_s:.0f} s: the prefill and any wait for another run)" \
        if first_s is not None and written else ""
    fit = f"ask for {written} tokens or fewer" if written else "try a shorter prompt or a smaller model"
    return (f"This run reached the server's time limit of {limit_s} s after {written} of the {asked} tokens asked"
            f"{wait}: {fit} to see it finish.")


def _written(update: LiveUpdate) -> int:
    """Tokens both panes wrote (the fewer of the two)."""
    return min(len(t.steps) if t is not None else 0 for t in (update.d3, update.full))


def _stream(session: Session, run_id: int, setup: RunSetup, view: ViewOptions, caps: Caps) -> Iterator[tuple[Any, ...]]:
    label = views.pane_title(setup.strategy, "D3")
    deadline = Deadline(caps.max_run_s)  # a step that would end past the limit is not started
    run = side_by_side(setup.engine, setup.prompt, setup.strategy, setup.gen, setup.trace,
                       chat_template=setup.chat_template, should_stop=session.stopper(run_id, deadline))
    pace = _Pacer(caps.figure_every)
    started, first_s = time.monotonic(), None
    with contextlib.closing(run), STREAMING.one():
        for update in run:
            if first_s is None and update.d3 is not None and update.d3.steps:
                first_s = time.monotonic() - started
            if not session.is_current(run_id):
                return  # a newer run of this session owns the panes now
            if update.finished:
                session.finish(update, label)
            else:
                session.show(update)
            if update.measuring is not None:  # the comparison's progress: the status line alone
                yield ordered(GENERATE_OUTPUTS, status=views.status_html(update.d3, update.full, "comparing",
                                                                           note=measuring_note(*update.measuring)))
                continue
            late = update.phase == "stopped" and deadline.reached
            if update.phase == "stopped" and not late and not session.stopped_by_stop(run_id):
                return  # a newer run was asked for (RULES: only Stop says "Stopped."): the status is the new run's
            figures = pace.figures(update)
            if pace.panes(update) or figures:
                limit = _time_limit_note(caps.max_run_s, _written(update), setup.gen.max_new_tokens,
                                         first_s) if late else ""
                note = " ".join(n for n in (setup.note, limit) if n)
                rendered = _render(session, setup, update, view, figures, note)
                if not session.is_current(run_id):
                    return  # abandoned while it was drawn (a model switch): the page shows the new model's state
                yield rendered


@takes_controls
def generate(pool: ModelPool, session: Session | None, controls: Controls) -> Iterator[tuple[Any, ...]]:
    """Stream D3 (or the chosen strategy) and full depth side by side, then compare them."""
    session = session or Session()
    if not session.take_turn():
        return  # a newer run of this session waits behind this one: it runs instead (one run per visitor)
    with user_errors():
        try:
            checked = check_run(pool, controls)  # a mistake is reported before a slow model load
        except ValueError as err:
            yield from _refuse(GENERATE_OUTPUTS, err, session)
        run_id = session.begin()  # any earlier run of this session stops within one token
        try:
            if not pool.is_loaded(checked.model):
                yield ordered(GENERATE_OUTPUTS, session=session, status=views.status_html(None, None, "loading"))
                try:
                    for stage in pool.loading(checked.model):  # a first use converts: its stage, as it goes
                        yield ordered(GENERATE_OUTPUTS, status=views.status_html(None, None, "loading", note=stage))
                except ValueError as err:
                    yield from _refuse(GENERATE_OUTPUTS, err, session)
            try:
                setup = prepare_run(pool, checked)  # the controls parsed once, by check_run
            except ValueError as err:  # a prompt over the token limit is only known once the tokenizer is there
                yield from _refuse(GENERATE_OUTPUTS, err, session)
            had_fills = bool(session.fills)
            session.clear()
            session.problem = None
            yield _first_outputs(session, setup, controls.view, clear_fills=had_fills)
            yield from _stream(session, run_id, setup, controls.view, pool.caps)
        finally:
            session.end(run_id)
            pool.sessions.kept(session)  # one budget for what all sessions keep (explorer.memory)


@takes_controls
def compare_fills(pool: ModelPool, session: Session | None, controls: Controls) -> Iterator[tuple[Any, Any, Any]]:
    """Run the same prompt and schedule with each fill (copy, propagate, none) against full depth."""
    session = session or Session()
    if not session.take_turn():
        return  # superseded by a newer request waiting behind it
    with user_errors():
        try:
            checked = check_run(pool, controls)
            run_id = session.begin()
        except ValueError as err:
            yield from _refuse(FILLS_OUTPUTS, err)
        try:
            try:
                setup = prepare_run(pool, checked)
            except ValueError as err:
                yield from _refuse(FILLS_OUTPUTS, err)
            yield from _fills(session, run_id, setup, controls.view.presentation, pool.caps.max_run_s)
        finally:
            session.end(run_id)


def _fills(session: Session, run_id: int, setup: RunSetup, p: bool, limit_s: int) -> Iterator[tuple[Any, Any, Any]]:
    session.fills = {}
    yield session, views.status_html(None, None, "Comparing fills: running full depth…"), gr.skip()
    deadline = Deadline(limit_s)
    stopped, gone = session.stopper(run_id, deadline), caller_check()  # a caller who left stops it within one step
    runs = fill_comparison(setup.engine, setup.prompt, setup.strategy, setup.gen, chat_template=setup.chat_template,
                           should_stop=lambda: stopped() or gone())
    with contextlib.closing(runs):
        for name, comparison in runs:
            if not session.is_current(run_id):
                return
            session.fills = {**session.fills, name: comparison}
            yield (session, views.status_html(None, None, f"Comparing fills: {', '.join(session.fills)} done…"),
                   views.fills_view(session.fills, presentation=p) if session.due((fills.KEY,)) else gr.skip())
    done = "Fill comparison done: see the Fill strategies tab." if len(session.fills) == len(FILLS) else "Stopped."
    note = _time_limit_note(limit_s) if done == "Stopped." and deadline.reached else ""
    yield (session, views.status_html(None, None, done, note=note),
           views.fills_view(session.fills, presentation=p) if session.due((fills.KEY,)) else gr.skip())
