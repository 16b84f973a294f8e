"""One person's session: the traces of the current run, the comparisons, the run history and the stop flag."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from d3.research.stats import bootstrap_difference
from d3.trace import Comparison, Trace, measured_speedup, run_counts, speedup_fields, token_agreement
from explorer.deadline import Deadline
from explorer.runs import LiveUpdate
from viz.layout import short_label
from viz.stream import count_words, speed_words

# How long a model switch waits for the run it stops to leave its stream (one decoding step, as a rule): an update
# that run had begun to render would otherwise reach the page after the switch's own status line (walk D5).
ABANDON_WAIT_S = 3.0

HISTORY_COLUMNS = ["run", "strategy", "tokens", "mean layers", "theoretical ×", "measured ×", "speed, read how",
                   "agreement", "tokens agreeing", "agree 95%", "first divergence", "KL teacher", "KL free"]
HISTORY_LIMIT = 50  # runs kept per session, like everything a session keeps: bounded


@dataclass
class RunRecord:
    """A finished run, for the session's history table."""

    label: str
    summary: dict[str, Any]
    measured: float | None  # the measured speedup where the run could measure one (its interval excludes 1)
    text: str = ""  # what the skipping run wrote
    layers: tuple[int, ...] = ()  # layers it ran per token
    agree: tuple[bool, ...] = ()  # per position, whether its token equals full depth's
    prompt: str = ""  # what it answered (the unit of the history's paired interval)
    full_text: str = ""  # what full depth wrote beside it

    def detail(self) -> dict[str, Any]:
        """The summary with the run's text, full depth's, and its per-token layers and agreement (scenario findings)."""
        return {**self.summary, "text": self.text, "full_text": self.full_text, "layers": self.layers,
                "agree": self.agree}


@dataclass
class Session:
    """One person's runs: traces, comparison, fill comparison, history, and the stop flag. Lives in gr.State,
    so no two people ever share one. Only the newest run of a session may stream: starting a run stops
    the one before it within one decoding step."""

    d3: Trace | None = None
    full: Trace | None = None
    comparison: Comparison | None = None
    fills: dict[str, Comparison] = field(default_factory=dict)
    history: list[RunRecord] = field(default_factory=list)
    run_id: int = 0
    stop_at: float = -math.inf  # when a run was last stopped: Stop, a newer run asked for, a model switch
    stop_pressed_at: float = -math.inf  # when Stop itself was last pressed: the only stop the status calls "Stopped."
    triggered_at: float | None = None  # when the page last asked for a run that has not begun yet
    running: int | None = None  # the run streaming now, if any (what Stop would stop)
    waiting: int = 0  # runs the page asked for (`trigger`) that have not taken their turn yet (`take_turn`)
    asks: int = 0  # runs and stops a person has asked for, counted: a scenario goes on only while none came after it
    scenario: tuple[str, int] | None = None  # the scenario whose runs go on, and the ask of its latest run
    ended_ask: int | None = None  # the ask under which the run that ended last began
    _asked: dict[int, int] = field(default_factory=dict, repr=False)  # the running run's ask
    ended: str = ""  # how the last run ended ("done" or "stopped"): a status said later keeps it, never rewrites it
    problem: str | None = None  # what the status line says is wrong with the controls, until it is fixed
    typed_out_of_range: bool = False  # a value typed into a slider's box outside its range, not yet fixed
    core: tuple[int, int] | None = None  # (head, tail) as last settled on valid values (which one a person typed)
    pointer_release: bool = True  # the last slider release came from a pointer on its track or reset (it may run)
    settled: Any = None  # the controls the last settle answered (an identical one sends no update: no event storm)
    released: Any = None  # the controls a slider's release last ran (the same again runs nothing)
    # The view tab open on the page (None: not a page but an API client, which gets every view). On the page only
    # that view is drawn; the others are `stale` and drawn when their tab opens (`due`, `opened`).
    view: str | None = None
    stale: set[str] = field(default_factory=set, repr=False)
    exports: deque[float] = field(default_factory=deque, repr=False)  # when this session last downloaded
    dropped: bool = False  # its run's attention was dropped to make room for others' runs (explorer.memory)
    _since: dict[int, float] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def trigger(self, run: bool = True) -> None:
        """A new run was asked for (before it waits in the queue): stop the running one now. A Stop
        pressed from here on also stops the new run, even while it still waits in the queue. A scenario whose run
        was going runs none of its next runs (`start_scenario`). `run`: a run follows in the queue, which takes its
        turn (`take_turn`); False where the page only stops (a model switch)."""
        with self._lock:
            self.stop_at = self.triggered_at = time.monotonic()
            self.asks += 1
            self.scenario = None
            self.waiting += 1 if run else 0

    def take_turn(self) -> bool:
        """A run asked for on the page reaches the front of the queue: False when a newer one was asked for since
        and waits behind it (this one is dropped, not played before it: one run per visitor). An API call that no
        trigger announced always runs."""
        with self._lock:
            self.waiting = max(self.waiting - 1, 0)
            return self.waiting == 0

    def begin(self) -> int:
        """Start a run; any earlier run of this session stops within one decoding step."""
        with self._lock:
            self.run_id += 1
            self._since = {self.run_id: self.triggered_at if self.triggered_at is not None else time.monotonic()}
            self.triggered_at = None
            self.running = self.run_id
            self._asked = {self.run_id: self.asks}
            return self.run_id

    def end(self, run_id: int) -> None:
        """Run `run_id` is over (finished, stopped, refused or closed): Stop has nothing left to stop."""
        with self._lock:
            if self.running == run_id:
                self.running = None
            if run_id in self._asked:
                self.ended_ask = self._asked.pop(run_id)

    def request_stop(self) -> None:
        """Stop pressed: the running run stops within one token, a run still waiting stops as it begins, and a
        scenario runs none of its next runs."""
        with self._lock:
            self.stop_at = self.stop_pressed_at = time.monotonic()
            self.waiting = 0  # those still queued begin and stop at once (stop_at): none waits on another
            self.asks += 1
            self.scenario = None

    def abandon(self) -> None:
        """The page's controls are set anew (a model switch): the running run stops within one token and shows
        nothing more (it is no longer current: its panes were emptied for the new model), and no run follows."""
        self.trigger(run=False)
        with self._lock:
            self.run_id += 1
            abandoned = self.running
        if abandoned is not None:  # its last update must not reach the page after the new model's status
            self.wait_ended(abandoned, ABANDON_WAIT_S)

    def wait_ended(self, run_id: int, timeout_s: float) -> bool:
        """Wait (at most `timeout_s`) until run `run_id` has left its stream (`end`): True once it has."""
        limit = time.monotonic() + timeout_s
        while self.running == run_id:
            if time.monotonic() >= limit:
                return False
            time.sleep(0.02)
        return True

    def stopped_by_stop(self, run_id: int) -> bool:
        """Whether run `run_id` was stopped by the Stop button (pressed after it was asked for), rather than by a
        newer run asked for or a model switch: only then does the status say "Stopped."."""
        return self.stop_pressed_at > self._since.get(run_id, math.inf)

    def start_scenario(self, key: str, step: int) -> bool:
        """Run `step` of scenario `key` is about to be set: stop the running run (`trigger`). Step 0 (a click)
        always starts; a later step goes on only after the scenario's own previous run, with nothing asked for
        since it was (no Generate, Stop, scenario, even this one again, or slider release): otherwise False, and
        the scenario's chain ends there."""
        if step > 0 and self.scenario_state(key) != "current":
            return False
        self.trigger()
        with self._lock:
            self.scenario = (key, self.asks)
        return True

    def scenario_state(self, key: str) -> str:
        """Where scenario `key` stands once one of its runs has ended: "current" (that run was its latest ask and
        nothing was asked for since), "replaced" (the scenario was clicked again, or another one, since that run
        began) or "interrupted" (a Stop, a Generate or a release came after it)."""
        with self._lock:
            if self.scenario is None:
                return "interrupted"
            return "current" if self.scenario == (key, self.asks) == (key, self.ended_ask) else "replaced"

    def is_current(self, run_id: int) -> bool:
        return run_id == self.run_id

    def stopper(self, run_id: int, deadline: float | Deadline = math.inf) -> Callable[[], bool]:
        """should_stop for run `run_id`: Stop was pressed after it was asked for, a newer run has begun, or the
        run is at its `deadline` (a `Deadline`: its next step would end past it; a time.monotonic() value: past
        it): a job nobody reads must not hold its slot for ever."""
        since = self._since.get(run_id, math.inf)
        late = deadline.passed if isinstance(deadline, Deadline) else lambda: time.monotonic() > deadline
        return lambda: run_id != self.run_id or self.stop_at > since or late()

    def due(self, keys: Iterable[str]) -> tuple[str, ...]:
        """Of these views (whose figures just changed), the ones to send to the page now: every one for an API
        client; on the page only the one whose tab is open, the others marked stale and drawn when their tab opens
        (`opened`). A figure sent into a hidden tab costs the browser as much as a shown one: re-sending every
        heavy view at every run end, scenario and model switch is what made a long walk over the page hang."""
        keys = tuple(keys)
        with self._lock:
            if self.view is None:
                return keys
            now = tuple(k for k in keys if k == self.view)
            self.stale.update(k for k in keys if k != self.view)
            self.stale.difference_update(now)
            return now

    def opened(self, key: str) -> bool:
        """The page opened view `key`'s tab: whether its figure is stale (then it is to be drawn now)."""
        with self._lock:
            self.view = key
            stale = key in self.stale
            self.stale.discard(key)
            return stale

    def clear(self) -> None:
        """Forget the previous run's results when a new run starts (the history stays)."""
        self.d3 = self.full = self.comparison = None
        self.fills = {}
        self.ended = ""
        self.dropped = False

    def show(self, update: LiveUpdate) -> None:
        """Keep the traces of the run in progress: the views redraw from them."""
        self.d3, self.full, self.comparison = update.d3, update.full, update.comparison

    def finish(self, update: LiveUpdate, label: str) -> None:
        """Keep the finished run and add it to the history."""
        self.show(update)
        self.ended = update.phase
        if update.d3 is not None and update.full is not None and update.d3.steps:
            summary = update.comparison.summary() if update.comparison else _stream_summary(update.d3, update.full)
            d3, full = update.d3, update.full
            agree = tuple(a == b for a, b in zip(d3.token_ids, full.token_ids))
            speedup = measured_speedup(d3, full)
            measured = speedup.ratio if speedup is not None and speedup.resolvable else None
            # the one count and speed reading of the run (d3.trace.run_counts), whichever way it ended
            summary = {"strategy": d3.strategy_name, **summary, **run_counts(d3, full), **speedup_fields(speedup)}
            self.history.append(RunRecord(label, summary, measured, text=d3.text,
                                          layers=tuple(int(n) for n in d3.layers_used), agree=agree, prompt=d3.prompt,
                                          full_text=full.text))
            del self.history[:-HISTORY_LIMIT]

    def history_frame(self) -> pd.DataFrame:
        rows = [{"run": i + 1, "strategy": r.label, "tokens": r.summary["tokens"],
                 "mean layers": round(r.summary["mean_layers"], 2),
                 "theoretical ×": round(r.summary["theoretical_speedup"], 2),
                 "measured ×": None if r.measured is None else round(r.measured, 2),
                 "speed, read how": _speed(r.summary),
                 "agreement": round(r.summary["agreement"], 3),
                 "tokens agreeing": count_words(r.summary, short_label({"strategy": r.summary.get("strategy", "d3")})), "agree 95%": agreement_interval(self.history[:i + 1]),
                 "first divergence": r.summary["first_divergence"],
                 "KL teacher": _round(r.summary.get("kl_teacher_mean")), "KL free": _round(r.summary.get("kl_free_mean"))}
                for i, r in enumerate(self.history)]
        return pd.DataFrame(rows, columns=HISTORY_COLUMNS)


def agreement_interval(runs: list[RunRecord]) -> str | None:
    """The last run's strategy's agreement over its runs so far on different prompts, with the 95% interval of a
    paired bootstrap over those prompts ("0.62-0.91 (3)"): each run is paired with full depth on its own prompt.
    None until that strategy has run on two prompts (one prompt's tokens are not independent draws)."""
    label = runs[-1].label
    by_prompt = {r.prompt: r.summary["agreement"] for r in runs if r.label == label}  # a prompt rerun counts once
    if len(by_prompt) < 2:
        return None
    d = bootstrap_difference([1.0] * len(by_prompt), list(by_prompt.values()))
    return f"{1 + d.low:.2f}-{1 + d.high:.2f} ({len(by_prompt)})"


def _speed(summary: dict[str, Any]) -> str:
    """The run's measured speedup read against theory (`viz.stream.speed_words`), as the Sweep's table reads its rows."""
    return speed_words(summary.get("measured_speedup"), summary.get("measured_speedup_low"),
                       summary.get("measured_speedup_high"), summary.get("theoretical_speedup"))


def _round(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 4)


def _stream_summary(skip: Trace, full: Trace) -> dict[str, Any]:
    """A history row for a run stopped before its comparison: agreement from the tokens alone."""
    agreement = token_agreement(skip.token_ids, full.token_ids)
    return {"tokens": len(skip.steps), "mean_layers": skip.mean_layers,
            "theoretical_speedup": skip.theoretical_speedup(), "agreement": agreement.agreement,
            "first_divergence": agreement.first_divergence, "kl_teacher_mean": None, "kl_free_mean": None}
