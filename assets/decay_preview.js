() => {
  // The curve's inputs the preview follows, from the page's control table (explorer/controls.PREVIEW_IDS, put here as
  // the page is wired): the name the figure's meta knows each by -> its element's id.
  const IDS = __PREVIEW_IDS__;
  // The names the formula below knows (d3.schedule.d3_budget's). Another number of the curve (a field added to D3's
  // registry) is drawn by the server: while one is off its default (the figure's meta says both), the preview
  // leaves the curve alone (tests/test_browser_page.py checks the formula against the engine's, field by field).
  const FORMULA = ['alpha', 'core_head', 'core_tail', 'start'];
  // The decay curve follows α, the core split and the start while a slider moves: it is redrawn here, in the
  // browser, from the formula of d3.schedule.d3_budget, so it keeps up with the pointer whatever the server is
  // doing (a run it starts on release shares its two cores). The server's own redraw, on release, then lands
  // with the same lines and the planned grid. viz/depth.py puts what a figure was drawn for in its layout meta
  // (d3_schedule) and names the lines to move; a figure that lands drawn for other values than the sliders now
  // hold (a run still streaming, an answer overtaken by a later move) is brought back in line as it lands.
  const budgets = (L, steps, alpha, head, tail, start) => {
    const raw = [], planned = [];
    for (let i = 0; i < steps; i++) {
      // The same epsilon as the engine: 30 * 1.0 floors to 30, not 29.
      const r = Math.floor(L * Math.pow(alpha, Math.max(0, i - start)) + 1e-9);
      raw.push(r);
      planned.push(i === 0 ? L : Math.min(L, Math.max(r, head + tail, 1)));  // token 0 is the prefill's
    }
    return {raw, planned};
  };
  const pyFloat = (x) => (Number.isInteger(x) ? x.toFixed(1) : String(x));  // as Python prints a float
  const label = (s, p) => {  // viz.layout.strategy_label for D3
    const parts = [`α=${pyFloat(p.alpha)}`];
    if (p.start) parts.push(`start ${p.start}`);
    if (s.label_core) parts.push(`core ${p.core_head}+${p.core_tail}`);
    return `D3 (${[...parts, ...s.label_extra].join(', ')})`;
  };
  const names = Object.keys(IDS);
  const drawnFor = (s) => Object.fromEntries(names.map((k) => [k, (s.fields || s)[k]]));
  const same = (a, b) => names.every((k) => a[k] === b[k]);
  // A value the formula does not read is at its default: its budget is the formula's (the parity test checks it).
  const known = (s, p) => names.every((k) => FORMULA.includes(k) || p[k] === (s.defaults || {})[k]);
  // The limits come with the figure (viz.depth.d3_schedule_meta: the registry's α range, the core rule's largest core).
  const valid = (s, p) => known(s, p) && p.alpha > s.alpha_lo && p.alpha <= s.alpha_hi
    && [p.core_head, p.core_tail, p.start].every(Number.isInteger)
    && p.core_head >= 0 && p.core_tail >= 0 && p.start >= 0 && p.core_head + p.core_tail <= s.core_max;

  const traceUpdate = (gd, s, p, lines, matches) => {
    const idx = [], y = [], name = [], visible = [];
    gd.data.forEach((t, i) => {
      const m = t.meta || {};
      if (m.role === 'raw' && s.main) {
        idx.push(i); y.push(lines.raw); name.push(t.name); visible.push(true);
      } else if (m.role === 'planned' && m.strategy === 'd3') {
        // D3's line beside another strategy's run (early exit, SkipDecode) is a legend entry to click: a slider
        // move redraws it where it is, never draws it as if it were the run's plan.
        idx.push(i); y.push(lines.planned); name.push(s.main && !s.short_names ? `${label(s, p)}: planned` : t.name);
        visible.push(s.main || t.visible === undefined ? true : t.visible);
      } else if (m.role === 'actual' && m.strategy === 'd3' && s.main) {
        // The layers a run used belong to the schedule it ran: shown only while the sliders are back on it.
        idx.push(i); y.push(t.y); name.push(t.name); visible.push(matches);
      }
    });
    return [{y, name, visible}, idx];
  };
  const layoutUpdate = (gd, s, p) => {
    const floor = p.core_head + p.core_tail, out = {};
    (gd.layout.shapes || []).forEach((sh, i) => {
      if (sh.name === 'core-floor') Object.assign(out, {[`shapes[${i}].y0`]: floor, [`shapes[${i}].y1`]: floor,
                                                         [`shapes[${i}].visible`]: floor > 0});
      if (sh.name === 'decay-start') Object.assign(out, {[`shapes[${i}].x0`]: p.start - 0.5,
                                                          [`shapes[${i}].x1`]: p.start - 0.5,
                                                          [`shapes[${i}].visible`]: p.start > 0});
    });
    (gd.layout.annotations || []).forEach((a, i) => {
      if (a.name === 'core-floor') Object.assign(out, {[`annotations[${i}].y`]: floor,
        [`annotations[${i}].visible`]: floor > 0,
        [`annotations[${i}].text`]: `core floor<br>${p.core_head}+${p.core_tail}=${floor}`});  // viz.depth.core_floor_text
      if (a.name === 'decay-start') Object.assign(out, {[`annotations[${i}].x`]: p.start - 0.5,
        [`annotations[${i}].visible`]: p.start > 0, [`annotations[${i}].text`]: ` decay starts at token ${p.start}`});
    });
    return out;
  };
  // What the figure shows now: what the server drew it for, or what it was last redrawn here for.
  const shown = (gd, s) => (gd.__d3PreviewOf === s ? gd.__d3Preview : drawnFor(s));
  const draw = (gd, p) => {
    const s = gd.layout && gd.layout.meta && gd.layout.meta.d3_schedule;
    if (!s || !window.Plotly || !valid(s, p) || same(shown(gd, s), p)) return;
    gd.__d3PreviewOf = s;
    gd.__d3Preview = p;
    const [traces, idx] = traceUpdate(gd, s, p, budgets(s.num_layers, s.steps, p.alpha, p.core_head, p.core_tail,
                                                        p.start),
                                      same(drawnFor(s), p));
    if (idx.length) window.Plotly.update(gd, traces, layoutUpdate(gd, s, p), idx);
    else window.Plotly.relayout(gd, layoutUpdate(gd, s, p));
  };

  // A number typed into a slider's box outside the slider's range is clamped by the browser when the box loses
  // focus, and that clamped value is what a run sends: the curve draws it from the start (the status line says
  // the typed value is not allowed, explorer/view_handlers.check_controls).
  const clamp = (id, v) => {
    const range = document.querySelector(`#${id} input[type=range]`);
    if (!range || !Number.isFinite(v)) return v;
    return Math.min(Number(range.max), Math.max(Number(range.min), v));
  };
  let wanted = null;  // the sliders' values, as their last change gave them
  // What the sliders on screen hold now (each clamped to its range, as a run sends it); a slider not on the page
  // keeps the value its last change gave. Read as a figure lands, never remembered across it: after a model switch
  // or a reset the server set the sliders, and a curve drawn for a move made before would belong to neither the
  // sliders nor the model (issue 35: "core 3+5" over Gemma's 18 layers while the sliders showed 2+2).
  const onScreen = () => {
  // The curve's inputs the preview follows, from the page's control table (explorer/controls.PREVIEW_IDS, put here as
  // the page is wired): the name the figure's meta knows each by -> its element's id.
  const IDS = __PREVIEW_IDS__;
  // The names the formula below knows (d3.schedule.d3_budget's). Another number of the curve (a field added to D3's
  // registry) is drawn by the server: while one is off its default (the figure's meta says both), the preview
  // leaves the curve alone (tests/test_browser_page.py checks the formula against the engine's, field by field).
  const FORMULA = ['alpha', 'core_head', 'core_tail', 'start'];
    const read = (id, key) => {
      const box = document.querySelector(`#${id} input[type=number]`);
      const v = box ? Number(box.value) : NaN;
      return Number.isFinite(v) && box.value !== '' ? clamp(id, v) : (wanted && key in wanted ? wanted[key] : NaN);
    };
    return Object.fromEntries(names.map((k) => [k, read(IDS[k], k)]));
  };
  const follow = (gd) => {
    const s = gd.layout && gd.layout.meta && gd.layout.meta.d3_schedule;
    if (!s) return;
    const p = onScreen(), drawn = drawnFor(s);
    names.forEach((k) => { if (!Number.isFinite(p[k])) p[k] = drawn[k]; });  // a box not drawn yet: the figure's own
    draw(gd, p);
  };
  // Gradio replaces the plot's element now and then (a new one draws its first answer at once), so each new
  // element is hooked as soon as it is added, before that first draw: a MutationObserver on the plot's box.
  const hook = () => {
  // The curve's inputs the preview follows, from the page's control table (explorer/controls.PREVIEW_IDS, put here as
  // the page is wired): the name the figure's meta knows each by -> its element's id.
  const IDS = __PREVIEW_IDS__;
  // The names the formula below knows (d3.schedule.d3_budget's). Another number of the curve (a field added to D3's
  // registry) is drawn by the server: while one is off its default (the figure's meta says both), the preview
  // leaves the curve alone (tests/test_browser_page.py checks the formula against the engine's, field by field).
  const FORMULA = ['alpha', 'core_head', 'core_tail', 'start'];
    const gd = document.querySelector('#plot-decay .js-plotly-plot');
    if (!gd || typeof gd.on !== 'function' || gd.__d3PreviewHooked) return gd;
    gd.__d3PreviewHooked = true;
    // Plotly.react (how gradio draws an answer) ends in one or the other, depending on what changed.
    gd.on('plotly_react', () => follow(gd));
    gd.on('plotly_afterplot', () => follow(gd));
    if (gd._fullLayout) requestAnimationFrame(() => follow(gd));  // hooked after its first draw
    return gd;
  };
  let box = null;
  const added = new MutationObserver(() => hook());
  const watch = () => {
  // The curve's inputs the preview follows, from the page's control table (explorer/controls.PREVIEW_IDS, put here as
  // the page is wired): the name the figure's meta knows each by -> its element's id.
  const IDS = __PREVIEW_IDS__;
  // The names the formula below knows (d3.schedule.d3_budget's). Another number of the curve (a field added to D3's
  // registry) is drawn by the server: while one is off its default (the figure's meta says both), the preview
  // leaves the curve alone (tests/test_browser_page.py checks the formula against the engine's, field by field).
  const FORMULA = ['alpha', 'core_head', 'core_tail', 'start'];
    const b = document.getElementById('plot-decay');
    if (!b || b === box) return;
    box = b;
    added.disconnect();
    added.observe(b, {childList: true, subtree: true});
    hook();
  };
  // What a slider's release was (explorer/wiring.RELEASE_JS asks as the release is sent): gradio sends a box's blur
  // and a click into it as a release too, and only a pointer let go on a track or a reset asks for a run. A click
  // on Stop or anywhere else, or a key in a box, is no request for a run (issue 43, D3).
  let pressed = false;
  document.addEventListener('pointerdown', (e) => {
    const t = e.target;
    pressed = !!(t && t.closest && (t.closest('input[type=range]') || t.closest('button.reset-button')));
  }, true);
  document.addEventListener('keydown', (e) => {
    if (e.target && e.target.matches && e.target.matches('input[type=number]')) pressed = false;
  }, true);
  window.d3Released = () => (pressed ? 'pointer' : 'typed');
  window.d3DecayPreview = {
    budgets, label, known, formula: FORMULA, ids: IDS,
    follow: (values) => {  // called by the sliders' input events with {name: value} (explorer/wiring.py)
      wanted = Object.fromEntries(Object.entries(values).map(([k, v]) => [k, clamp(IDS[k], Number(v))]));
      watch();
      const gd = hook();
      if (gd) follow(gd);
    },
  };
  watch();
  setInterval(watch, 400);
}
