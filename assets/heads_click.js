() => {
  // A click on a cell of the attention overview (layers across, heads down) writes "layer,head@stamp" into the
  // hidden #heads-cell box, whose change event opens that head in the per-head view (as sweep_click.js does for
  // the Sweep's points). The listener is attached to each Plotly div the plot renders, exactly once.
  const attach = () => {
    const plot = document.querySelector('#plot-heads .js-plotly-plot');
    if (!plot || typeof plot.on !== 'function' || plot.__d3CellClick) return;
    plot.__d3CellClick = true;
    plot.on('plotly_click', (event) => {
      const point = event && event.points && event.points[0];
      const box = document.querySelector('#heads-cell textarea, #heads-cell input');
      if (!point || !box) return;
      // the cell's (layer, head): its customdata, else its x (layer) and y (head)
      const [layer, head] = Array.isArray(point.customdata) ? point.customdata : [point.x, point.y];
      box.value = `${layer},${head}@${Date.now()}`;  // the stamp makes a second click on one cell a change too
      box.dispatchEvent(new Event('input', { bubbles: true }));
    });
  };
  setInterval(attach, 400);
}
