() => {
  // Fit every plot to its box. Plotly sizes a figure when it is drawn; one drawn while its tab is hidden gets
  // plotly's fallback width (700 px) and keeps it after the tab opens, and presentation mode widens the boxes
  // without a window resize. A ResizeObserver on each plot asks plotly to resize it (its responsive handler,
  // which gradio switches on) whenever the box changes; the scan also catches a plot redrawn at a stale width.
  const fits = (plot) => {
    const svg = plot.querySelector('.main-svg');
    return !svg || Math.abs(svg.getBoundingClientRect().width - plot.getBoundingClientRect().width) <= 2;
  };
  const fit = (plot) => {
    if (plot.offsetParent === null || !plot._responsiveChartHandler || fits(plot)) return;
    plot._responsiveChartHandler();
  };
  const watched = new WeakSet();
  const observer = new ResizeObserver((entries) => entries.forEach((e) => fit(e.target)));
  const scan = () => document.querySelectorAll('.js-plotly-plot').forEach((plot) => {
    if (!watched.has(plot)) { watched.add(plot); observer.observe(plot); }
    fit(plot);
  });
  setInterval(scan, 300);
}
