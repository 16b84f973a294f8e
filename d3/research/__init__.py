"""Research tools built on the engine: calibrated drop orders, the depth oracle, sweeps, the paper's protocol,
benchmarks, and the tasks and data they read. They import the core (`d3.*`); the core never imports them."""
