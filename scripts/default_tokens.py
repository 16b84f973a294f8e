"""Each model's default new tokens on the page, chosen by measurement (issue 40; figures in docs/speed.md).

For each model: the page's default run on it (its default prompt and D3 setting, both panes, tracing, the comparison
after them: `explorer.live.generate`, the handler the Generate button calls) measured at `--tokens` new tokens while
`--beside` other visitors' default runs on the same model go on beside it (as many as D3_CONCURRENCY lets run at
once besides it: a second slot), on this machine. From the measured run: the wait before the first token, the pace
while decoding (tokens per second per pane), and the time after the last token (the comparison). The default picked
is the largest multiple of 8, at most the page's 64, whose run is predicted to end within `--margin` of D3_MAX_RUN_S
(8, with "fits": false, when not even 8 tokens do):

    first token wait + N / pace + comparison time * N / tokens  <=  margin * D3_MAX_RUN_S

Usage (one model per process keeps memory in bounds; never two Qwen processes at once):
    nice -n 5 python scripts/default_tokens.py --model smollm2-135m --json results/default_tokens/smollm2-135m.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PAGE_MAX = 64  # the page's default before this measurement, and the most a default is set to
STEP = 8


@dataclass
class Measured:
    model: str
    tokens_asked: int
    tokens_written: int  # the fewer of the two panes
    first_token_s: float  # from pressing Generate to D3's first token (prompt prefill, and waiting for the engine)
    decode_s: float  # from the first token to the last one, both panes
    after_s: float  # from the last token to Done (the comparison and the figures)
    total_s: float
    phase: str
    beside: int
    threads: int
    load_avg: tuple[float, float, float]

    @property
    def pace(self) -> float:
        """Tokens per second per pane while decoding (both panes advance together)."""
        return (self.tokens_written - 1) / self.decode_s if self.decode_s > 0 else float("nan")


def default_controls(model: str, tokens: int) -> dict[str, object]:
    """What the page sends on Generate for `model` before a person touches anything, with `tokens` new tokens."""
    from dataclasses import fields

    from d3.config import default_core
    from d3.models import KNOWN_MODELS
    from d3.research.data import example_prompts
    from explorer.controls import model_defaults

    c = model_defaults(model)
    layers = KNOWN_MODELS[model].facts.num_layers
    head, tail = default_core(layers)
    values = {f.name: getattr(c, f.name) for f in fields(c)}
    values.update(prompt=example_prompts()[0].prompt, model=model, core_head=head, core_tail=tail,
                  max_new_tokens=tokens, chat_template=KNOWN_MODELS[model].facts.chat_template)
    return values


def run_once(pool, model: str, tokens: int, stop: threading.Event | None = None) -> tuple[float, float, float, int, str]:
    """One default run through the page's handler: (first token s, last token s, total s, tokens written, phase)."""
    from explorer import live
    from explorer.session import Session

    session = Session()
    started = time.monotonic()
    first = last = None
    written = 0
    for _ in live.generate(pool, session, **default_controls(model, tokens)):
        if stop is not None and stop.is_set():
            break
        now_written = min((len(t.steps) if t is not None else 0) for t in (session.d3, session.full))
        if now_written >= 1 and first is None:
            first = time.monotonic() - started
        if now_written > written:
            written, last = now_written, time.monotonic() - started
    total = time.monotonic() - started
    return first or total, last or total, total, written, session.ended or "?"


def measure(model: str, tokens: int, beside: int) -> Measured:
    from explorer.caps import Caps
    from explorer.page import tune_process
    from explorer.pool import ModelPool

    tune_process()  # as the server does: D3_TORCH_THREADS, if set, is the threads torch computes with
    caps = Caps.from_env()
    pool = ModelPool(caps=Caps(**{**asdict(caps), "max_new_tokens": max(caps.max_new_tokens, tokens)}))
    pool.engine(model)  # loaded (and converted if need be) before anything is timed
    run_once(pool, model, 4)  # warm: the first forward passes allocate
    stop = threading.Event()

    def other() -> None:  # another visitor's default run, again and again until the measured one ends
        while not stop.is_set():
            run_once(pool, model, PAGE_MAX, stop)

    others = [threading.Thread(target=other, daemon=True) for _ in range(beside)]
    for thread in others:
        thread.start()
    time.sleep(2.0 if beside else 0.0)  # the other run is past its prefill and decoding
    first, last, total, written, phase = run_once(pool, model, tokens)
    load = os.getloadavg()
    stop.set()
    for thread in others:
        thread.join(600)
    import torch

    return Measured(model, tokens, written, round(first, 1), round(last - first, 1), round(total - last, 1),
                    round(total, 1), phase, beside, torch.get_num_threads(), tuple(round(x, 1) for x in load))  # type: ignore[arg-type]


def pick(m: Measured, limit_s: float, margin: float) -> int:
    """The largest multiple of STEP up to PAGE_MAX whose predicted run ends within margin * limit_s."""
    budget = margin * limit_s
    after_per_token = m.after_s / max(m.tokens_written, 1)
    best = STEP
    for n in range(STEP, PAGE_MAX + 1, STEP):
        if m.first_token_s + (n - 1) / m.pace + after_per_token * n <= budget:
            best = n
    return best


def main(argv: list[str] | None = None) -> int:
    from explorer.caps import Caps

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", type=int, default=PAGE_MAX, help="new tokens of the measured run (64)")
    parser.add_argument("--beside", type=int, default=1, help="other default runs beside it (1: a second slot)")
    parser.add_argument("--margin", type=float, default=0.5, help="share of D3_MAX_RUN_S the default may use (0.5)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    limit = Caps.from_env().max_run_s
    m = measure(args.model, args.tokens, args.beside)
    chosen = pick(m, limit, args.margin)
    predicted = round(m.first_token_s + (chosen - 1) / m.pace + m.after_s / max(m.tokens_written, 1) * chosen, 1)
    row = {**asdict(m), "pace_tokens_per_s_per_pane": round(m.pace, 2), "limit_s": limit, "margin": args.margin,
           "default_new_tokens": chosen, "predicted_default_run_s": predicted,
           "fits": predicted <= args.margin * limit}  # False: not even STEP tokens fit under this load
    print(json.dumps(row, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(row, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
