"""The page's words outside its views: the introduction, the Sweep tab's text and the status phases. (Each view's title
and explanation live in its own module, explorer/views/<key>.py.)"""

from __future__ import annotations

INTRO = """**D3 (Position-Aware Depth Decay Decoding)** makes a language model use fewer of its layers the
further it gets into its answer. Later tokens are easier to predict, so they need less depth.
The *i*-th new token runs `floor(L · α^i)` of the model's *L* layers. The first and last (*core*) layers
always run, and only the middle (*flex*) layers are skipped. When a later token needs the key/value state
of a layer that an earlier token skipped, that state is *filled*.
Below, D3 and the full model write side by side so that you can see what changes."""

PHASES = {
    # not "(first use only)": a model another visitor's switch set aside loads again (7-9 s); a first use that
    # converts says so in the loader's own stage line (ModelPool.loading)
    "loading": "Loading the model into memory…",
    "streaming": "Generating…",
    "comparing": "Both streams are done. Now measuring the error against full depth…",
    "done": "Done.",
    "stopped": "Stopped.",
}

SWEEP_EXPLAIN = (
    "**Sweep**: measure a few settings against full depth on your prompts (timing and greedy agreement / KL per "
    "setting) with the model chosen in the Live tab, and see them on the speed–quality plane with the Pareto front. "
    "**Click a point of the plot or a row of the table** to load that setting into the Live tab's controls, then "
    "press Generate there to watch it side by side with full depth. The full-depth row is the reference and loads "
    "nothing. Full depth's reference runs come first, then D3's rows, then the baselines, and full depth timed "
    "against itself (the timing noise) last, so a sweep that meets its 60 s limit has measured D3 first; the note "
    "says how many of its rows it measured. Each setting is timed in 3 pairs against full depth per prompt and the "
    "median is shown; timings are noisy on a busy machine (docs/speed.md: what the defaults measure on a busy 2-core "
    "CPU).")

