"""The page's words: view titles, the explanation beside each view, the introduction, the Sweep tab's text and the
status phases. Kept apart so the wording can be read and edited in one place."""

from __future__ import annotations

VIEWS: dict[str, str] = {
    "usage": "Per-token layer usage",
    "decay": "Decay curve",
    "planned": "Planned layer grid",
    "flow": "Information flow: core vs flex",
    "attention": "Attention: full depth vs D3",
    "errors": "Error propagation",
    "fills": "Fill strategies",
    "needs": "What each token needs",
    "layers": "Which layers matter",
    "lens": "Logit lens",
    "scrub": "Token scrubber",
}

EXPLAIN: dict[str, str] = {
    "usage": """**One row per generated token, one column per decoder layer.**
Blue cells ran. Every other cell was skipped, and its colour says what went into its key/value entry instead:
orange, a *copy* of a lower layer's entry (the default fill), green, *propagate*, red, a masked *hole* (fill
*none*); grey, nothing (no entry written). The purple bands are the **core** layers, which always run.

**What to look for:** the blue part of each row shrinks as the response goes on, and the skipped (orange, with
the default fill) block in the middle widens: later tokens run fewer layers. That is the depth decay. Every row
still spans all the layers, because every skipped layer gets an entry. Hover over a cell to see what happened to it.""",
    "decay": """**How many layers token *i* gets:** `floor(L · α^i)`, never below the core floor (head + tail).
The dashed line is the formula alone. The thick line is the planned budget, and the dots are what each token
actually ran. Other strategies' schedules are drawn on the same axes.

**What to look for:** α close to 1 decays slowly. Moving the α or core sliders redraws this at once,
without running the model. Letting go of a slider runs the model again.""",
    "planned": """**The schedule before any model runs:** which layers each future token *will* run
under the current controls. The middle (flex) layers are dropped first, in the chosen drop order.

**What to look for:** with *middle-out*, *top-down* or *bottom-up* each token's layers are a subset of the
previous token's layers (nested). With *strided* they are not, so a later token can read a layer that an
earlier token skipped.""",
    "flow": """**How much each sublayer changes the hidden state,** per layer, measured live on this prompt.
The change is 1 − cosine between the input and output of the sublayer, or the relative distance between them.
Dotted lines: averaged over the prompt. Solid lines: averaged over generated tokens (D3). Dashed lines: full depth.
Purple bands: core layers.

**What to look for:** the change is largest at the first and last layers. That is why D3 always runs
them (the *core*) and only skips the middle.""",
    "attention": """**Where one attention head looks** while each token is generated (rows), over the prompt and
the earlier tokens (columns): full depth on the left, D3 on the right. Choose the layer *before* generating,
because only that layer is recorded, to keep traces small. The head can be changed afterwards. The default
layer is a flex layer that the default D3 run keeps for about three quarters of its tokens, then drops. The dotted
line is where the prompt ends.

**What to look for:** grey rows are tokens for which D3 skipped this layer (no attention to show). Similar
patterns in the rows above them mean that skipping other layers left this head's behaviour intact.""",
    "errors": """**How far D3 drifts from full depth,** per position.
*Teacher-forced* KL: both models see the same full-depth text, so this is the local error of one step.
*Free-running* KL: D3 continues on its own text, so errors compound.
The bottom panel shows how wrong the key/value cache is at each layer, compared with full depth. Outlined
squares were filled instead of computed and are read by later tokens; grey dots were filled but no later token
ever reads them.

**What to look for:** a spike at the first divergence. With a nested drop order (the default) every filled entry
is a grey dot: errors there cannot propagate, the skipped layers' own absence is the error. With *strided* or
early exit, filled entries with a large error are read and the error propagates.""",
    "fills": """**The same prompt and schedule with each fill strategy:**
*copy* takes the key/value entry of the nearest lower layer that ran. *propagate* passes the hidden state
through the skipped layer unchanged and projects its own key/value from it. *none* leaves a hole and masks it.
This costs extra runs, so press **Compare fills** to compute it.

**What to look for:** with a nested drop order, all three fills give the same result, because no later token
reads a hole. With *strided*, the fills give different results.""",
    "needs": """**The depth each token of the full-depth answer really needs** (the *oracle*): the smallest D3
budget, with the same core and drop order, whose top-1 token is still full depth's, with every earlier token at
full depth. Dots are tokens; red crosses need more layers than D3 gives them at the current α. Hollow dots: the
*logit lens*, after how many layers the final token is already on top and stays there.
**Fit α to this prompt** sets α to the fastest decay that under-serves at most 10% of these tokens.

**What to look for:** D3 assumes that later tokens need fewer layers. If the dots do not fall to the right, the
decay cuts layers that these tokens need. Measuring runs every budget for every token: about a minute.""",
    "layers": """**Which flex layers can this model spare, on this prompt?** Each flex layer is dropped alone while
full depth's own answer is read back (teacher-forced: the prompt at full depth, the answer through the other
layers). Bars: the share of full depth's next tokens still on top; dots: the KL from full depth. The number on a
bar is its place in the **calibrated order**: greedily, the layer whose removal (on top of those already removed)
hurts least goes next. Below: tokens kept after dropping the first *k* layers of the calibrated order (green) and of
the order in use (orange, dashed; its first dropped layers are outlined above). **Use this order** sets the drop
order to the calibrated one.

**What to look for:** which layers D3 drops decides as much as how many. A layer that barely matters for prose
can carry arithmetic: measure on the kind of text you care about.""",
    "lens": """**What the model would say if it stopped after each layer** (the *logit lens*: the final norm and
the output head applied to the hidden state after that layer), for every D3 token of the last run.
One column per generated token, one row per layer. The colour is the probability of the token D3 finally
wrote. Grey hatched cells are layers that did not run for that token. The black line is the *prediction depth*:
the first layer from which the lens's top token is the final one and stays so.

**What to look for:** where the black line sits well below the grey cells, the skipped layers were not needed
for that token. Where it climbs into them, D3 cut layers that token was still using. The lens is recorded
during every run while the box above the view is ticked (the default); untick it for runs about 1.6x faster.""",
    "scrub": """**One token at a time.** Pick a generated token with the slider, or press **Play** to step through
them in order. Left: the layers it ran (blue), skipped (grey), and where each skipped layer's key/value
entry came from (copied from which layer, propagated, or a masked hole). Right: its top 5 next tokens under D3 and
at full depth. Full depth is shown only while it had written the same text so far, since after a divergence
it answers a different context.

**What to look for:** tokens where D3's top choice is close to full depth's even with many layers skipped, and
the token where the two first part ways.""",
}

INTRO = """**D3 (Position-Aware Depth Decay Decoding)** makes a language model use fewer of its layers the
further it gets into its answer. Later tokens are easier to predict, so they need less depth.
The *i*-th new token runs `floor(L · α^i)` of the model's *L* layers. The first and last (*core*) layers
always run, and only the middle (*flex*) layers are skipped. When a later token needs the key/value state
of a layer that an earlier token skipped, that state is *filled*.
Below, D3 and the full model write side by side so that you can see what changes."""

PHASES = {
    "loading": "Loading the model (first use only)…",
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
