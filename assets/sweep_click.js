() => {
  // A click on a point of the Sweep tab's Pareto view writes that point's row index (the trace's customdata)
  // into the hidden #sweep-point box, whose change event loads the row into the live controls. gr.Plot has no
  // click event of its own; the listener is attached to each Plotly div the plot renders, exactly once.
  const attach = () => {
    const plot = document.querySelector('#plot-sweep .js-plotly-plot');
    if (!plot || typeof plot.on !== 'function' || plot.__d3PointClick) return;
    plot.__d3PointClick = true;
    plot.on('plotly_click', (event) => {
      const point = event && event.points && event.points.find((p) => p.customdata !== undefined);
      const box = document.querySelector('#sweep-point textarea, #sweep-point input');
      if (!point || !box) return;
      const row = Array.isArray(point.customdata) ? point.customdata[0] : point.customdata;
      box.value = `${row}@${Date.now()}`;  // the stamp makes a second click on the same point a change too
      box.dispatchEvent(new Event('input', { bubbles: true }));
    });
  };
  setInterval(attach, 400);
}
