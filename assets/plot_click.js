() => {
  // gr.Plot has no click event of its own: a click on a plot's point writes what the point stands for into a hidden
  // box, whose change event acts on it. The Sweep's Pareto view writes the point's row (the trace's customdata),
  // which loads that setting into the live controls; the attention overview (layers across, heads down) writes the
  // cell's "layer,head", which opens that head in the per-head view. The stamp makes a second click on the same
  // point a change too. A listener is attached to each Plotly div a plot renders, exactly once, within 400 ms.
  const clicks = [
    {plot: '#plot-sweep', box: '#sweep-point', value: (points) => {
      const point = points.find((p) => p.customdata !== undefined);
      return point && (Array.isArray(point.customdata) ? point.customdata[0] : point.customdata);
    }},
    {plot: '#plot-heads', box: '#heads-cell', value: (points) => {
      const point = points[0];  // the cell's (layer, head): its customdata, else its x (layer) and y (head)
      return point && (Array.isArray(point.customdata) ? point.customdata : [point.x, point.y]).join(',');
    }},
  ];
  const attach = () => clicks.forEach(({plot: plotSel, box: boxSel, value}) => {
    const plot = document.querySelector(`${plotSel} .js-plotly-plot`);
    if (!plot || typeof plot.on !== 'function' || plot.__d3Click) return;
    plot.__d3Click = true;
    plot.on('plotly_click', (event) => {
      const shown = value((event && event.points) || []);
      const box = document.querySelector(`${boxSel} textarea, ${boxSel} input`);
      if (shown === undefined || shown === null || !box) return;
      box.value = `${shown}@${Date.now()}`;
      box.dispatchEvent(new Event('input', { bubbles: true }));
    });
  });
  setInterval(attach, 400);
}
