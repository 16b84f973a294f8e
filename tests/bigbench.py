"""Small BIG-bench-shaped task files for the data and task tests, written where `d3.research.data` reads them."""

from __future__ import annotations

import json
from pathlib import Path

from d3.research import data


def write_task(data_dir: Path, path: str, task: dict) -> None:
    """Write `task` (BIG-bench task.json content) as task `path` under `data_dir`."""
    file = data.task_file(path, data_dir)
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(task), encoding="utf-8")
