() => {
  // Fit every plot to its box. Plotly sizes a figure when it is drawn; one drawn while its tab is hidden gets
  // plotly's fallback width (700 px) and keeps it after the tab opens, and presentation mode widens the boxes
  // without a window resize. A ResizeObserver on each plot asks plotly to resize it (its responsive handler,
  // which gradio switches on) whenever the box changes; the scan also catches a plot redrawn at a stale width.
  const fits = (plot) => {
    const svg = plot.querySelector('.main-svg');
    if (!svg) return true;
    const drawn = svg.getBoundingClientRect(), box = plot.getBoundingClientRect();
    // a figure with no height of its own takes its box's (the decay curve in presentation mode, assets/style.css)
    const free = plot.layout && !plot.layout.height && getComputedStyle(plot).height !== 'auto';
    return Math.abs(drawn.width - box.width) <= 2 && (!free || Math.abs(drawn.height - box.height) <= 2);
  };
  const fit = (plot) => {
    if (plot.offsetParent === null || fits(plot)) return;
    // A plot drawn before gradio made it responsive (on a loaded machine, the logit lens after tab switches kept
    // 700 px in a 644 px box; issue 35) has no handler yet: plotly's own resize fits it all the same.
    if (plot._responsiveChartHandler) plot._responsiveChartHandler();
    else if (window.Plotly && window.Plotly.Plots) window.Plotly.Plots.resize(plot);
  };
  // An observed element stays reachable from the observer: a plot gradio has replaced is let go here, or every
  // figure ever drawn would stay in memory with its whole DOM.
  const watched = new Set();
  const observer = new ResizeObserver((entries) => entries.forEach((e) => fit(e.target)));
  const scan = () => {
    watched.forEach((plot) => { if (!plot.isConnected) { observer.unobserve(plot); watched.delete(plot); } });
    document.querySelectorAll('.js-plotly-plot').forEach((plot) => {
      if (!watched.has(plot)) { watched.add(plot); observer.observe(plot); }
      fit(plot);
    });
  };
  setInterval(scan, 300);

  // A slider's number box: gradio sends its pointerup and its blur as the slider's release, and a release starts a
  // run. A click into the box to type, or a click in and out, changed nothing: a run nobody asked for (issue 35,
  // M5). Such a pointerup or blur is stopped here, in the capture phase, before gradio's own listeners see it; one
  // that follows a change (typed digits, the box's arrows) goes on as a release.
  const RELEASING = '#alpha, #core-head, #core-tail, #start';
  const box = (e) => {
    const t = e.target;
    return t instanceof HTMLInputElement && t.type === 'number' && t.closest(RELEASING) ? t : null;
  };
  const before = new WeakMap();  // each box's value when the person took it (focus, or the press of a click)
  const took = (e) => {
    const b = box(e);
    if (b && !(e.type === 'pointerdown' && b === document.activeElement)) before.set(b, b.value);
  };
  const unchanged = (e) => {
    const b = box(e);
    if (!b) return;
    if (before.has(b) && before.get(b) === b.value) e.stopPropagation();
    else if (e.type === 'blur') before.delete(b);
    else before.set(b, b.value);  // released at this value: a blur that follows changed nothing more
  };
  window.addEventListener('focus', took, true);
  window.addEventListener('pointerdown', took, true);
  window.addEventListener('pointerup', unchanged, true);
  window.addEventListener('blur', unchanged, true);

  // A run refused (the status line says "Cannot run this") after a person asked for one (a button, or Enter in the
  // prompt) is said in the status line, at the top of the page: a person scrolled down to the prompt and Generate
  // did not see it (issue 35: a 20,000-character prompt's refusal sat above the fold). The status line is brought
  // onto the screen, scrolled no further than it takes.
  let asked = false;
  document.addEventListener('click', (e) => { if (e.target.closest && e.target.closest('button')) asked = true; }, true);
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && e.target.closest && e.target.closest('#prompt')) asked = true;
  }, true);
  const refusedInView = () => {
    const status = document.querySelector('#status');
    if (!asked || !status) return;
    if (!status.querySelector('.d3-problem')) {
      if (/^(Done|Stopped)\./.test(status.innerText.trim())) asked = false;  // what was asked for ran
      return;
    }
    asked = false;
    const r = status.getBoundingClientRect();
    if (r.top < 0 || r.bottom > window.innerHeight) status.scrollIntoView({block: 'nearest'});
  };
  const statusWatch = new MutationObserver(refusedInView);
  const watchStatus = () => {
    const status = document.querySelector('#status');
    if (!status) return setTimeout(watchStatus, 300);
    statusWatch.observe(status, {childList: true, subtree: true, characterData: true});
  };
  watchStatus();

  // Hover linking: a token in either pane lights its row in the per-token layer grid (#plot-usage), and a row of
  // the grid lights its token in both panes. The pane spans carry data-step (viz/stream.py token_html) and the
  // grid's rows are at y = step; the row is marked by a band laid over the plot (.d3-row-hot, data-step), the
  // tokens by a class (.d3-tok-hot), so neither redraws the figure.
  const grid = () => document.querySelector('#plot-usage .js-plotly-plot');
  const PANE_TOKENS = '#d3-pane .d3-tok, #full-pane .d3-tok';
  const band = (step) => {
    const gd = grid();
    if (!gd) return;
    gd.querySelectorAll('.d3-row-hot').forEach((b) => b.remove());
    const full = gd._fullLayout;
    if (step === null || !full || !full.yaxis || !full.xaxis) return;
    const ya = full.yaxis, xa = full.xaxis;
    const a = ya.l2p(step - 0.5), b = ya.l2p(step + 0.5);
    if (!Number.isFinite(a) || !Number.isFinite(b)) return;
    const top = ya._offset + Math.min(a, b), bottom = ya._offset + Math.max(a, b);
    if (bottom < ya._offset || top > ya._offset + ya._length) return;  // not among the rows drawn
    const el = document.createElement('div');
    el.className = 'd3-row-hot';
    el.dataset.step = String(step);
    Object.assign(el.style, {top: `${top}px`, height: `${bottom - top}px`, left: `${xa._offset}px`,
                             width: `${xa._length}px`});
    (gd.querySelector('.svg-container') || gd).appendChild(el);
  };
  const light = (step, scroll) => {
    document.querySelectorAll('.d3-tok.d3-tok-hot').forEach((s) => s.classList.remove('d3-tok-hot'));
    if (step === null) return;
    document.querySelectorAll(`#d3-pane .d3-tok[data-step="${step}"], #full-pane .d3-tok[data-step="${step}"]`)
      .forEach((s) => {
        s.classList.add('d3-tok-hot');
        const box = scroll && s.closest('.prose');  // the pane's own scrolling box, never the page
        if (box && (s.offsetTop < box.scrollTop || s.offsetTop > box.scrollTop + box.clientHeight - 20)) {
          box.scrollTop = s.offsetTop - box.clientHeight / 2;
        }
      });
  };
  document.addEventListener('mouseover', (e) => {
    const tok = e.target.closest && e.target.closest(PANE_TOKENS);
    if (!tok) return;
    const step = Number(tok.dataset.step);
    light(step, false);
    band(step);
  });
  document.addEventListener('mouseout', (e) => {
    const tok = e.target.closest && e.target.closest(PANE_TOKENS);
    if (tok && !(e.relatedTarget && tok.contains(e.relatedTarget))) { light(null); band(null); }
  });
  const hook = () => {
    const gd = grid();
    if (!gd || typeof gd.on !== 'function' || gd.__d3RowHover) return;
    gd.__d3RowHover = true;
    gd.on('plotly_hover', (e) => {
      const point = e && e.points && e.points[0];
      if (!point || typeof point.y !== 'number') return;
      light(point.y, true);
      band(point.y);
    });
    gd.on('plotly_unhover', () => { light(null); band(null); });
  };
  setInterval(hook, 400);
}
