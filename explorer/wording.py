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
    "nothing. With the defaults (1 prompt, 16 tokens, 3 settings) it takes about 20 s for SmolLM2-135M on an idle "
    "2-core CPU (the largest request, 2 prompts × 24 tokens × 4 settings, about three times that); a sweep stops after "
    "60 s and shows the rows it finished, with a note saying so. Each setting is timed in 3 pairs against "
    "full depth per prompt and the median is shown; timings are still noisy on a busy machine.")

