"""Layering: the engine (d3/) never imports viz or gradio, its pure parts never import torch, and its core (the
modules directly in d3/) imports neither the research tools (d3.research), the reports (d3.reports) nor the CLI."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

D3 = Path(__file__).resolve().parent.parent / "d3"
# The one place that wires the engine's report to viz's figures, inside the command that writes the HTML.
WIRING = {"d3/cli/report.py": {"viz.report"}}  # d3/cli/report.write_report


def _imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _loaded_after(code: str) -> set[str]:
    """Top-level package names in sys.modules after running `code` in a fresh interpreter."""
    probe = code + "\nimport sys, json; print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         cwd=D3.parent, timeout=300)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_no_d3_file_imports_viz_or_gradio() -> None:
    for path in sorted(D3.rglob("*.py")):
        rel = path.relative_to(D3.parent).as_posix()
        bad = {m for m in _imported(path) if m.split(".")[0] in ("viz", "gradio")} - WIRING.get(rel, set())
        assert not bad, f"{rel} imports {sorted(bad)}"


def test_importing_every_d3_module_and_building_the_cli_loads_neither_viz_nor_gradio() -> None:
    modules = sorted(".".join(p.relative_to(D3.parent).with_suffix("").parts).removesuffix(".__init__")
                     for p in D3.rglob("*.py") if p.name != "__main__.py")
    loaded = _loaded_after("import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules)
                           + "from d3.cli import build_parser\nbuild_parser()")
    assert "d3" in loaded and "torch" in loaded  # the probe really imported the engine
    assert not loaded & {"viz", "gradio"}, sorted(loaded & {"viz", "gradio"})


def test_configs_schedules_traces_sweep_specs_and_the_report_load_without_torch() -> None:
    loaded = _loaded_after("import d3, d3.research.sweep, d3.research.sweep.grid, d3.reports.sweep, d3.cli.common")
    assert "d3" in loaded and "pandas" in loaded
    assert "torch" not in loaded and "transformers" not in loaded


ABOVE_THE_CORE = ("d3.research", "d3.reports", "d3.cli", "explorer", "viz", "gradio")


def _core_modules() -> list[Path]:
    return sorted(p for p in D3.glob("*.py") if p.name != "__main__.py")


def test_the_core_imports_nothing_above_it() -> None:
    assert {p.stem for p in _core_modules()} >= {"config", "schedule", "engine", "decoder", "trace", "compare"}
    for path in _core_modules():
        bad = {m for m in _imported_anywhere(path) if m.startswith(ABOVE_THE_CORE)}
        assert not bad, f"d3/{path.name} imports {sorted(bad)}: the core must not reach up"


def _imported_anywhere(path: Path) -> set[str]:
    """Every absolute import in the file, also those inside functions, plus `from d3 import research`-style ones."""
    names = _imported(path)
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module == "d3":
            names |= {f"d3.{a.name}" for a in node.names}
    return names


def test_the_core_rule_catches_a_core_module_that_reaches_up(tmp_path: Path) -> None:
    bad = tmp_path / "engine.py"
    bad.write_text("def f():\n    from d3.research.calibrate import resolve\n    from d3 import reports\n")
    assert {"d3.research.calibrate", "d3.reports"} <= _imported_anywhere(bad)


def test_loading_the_engine_loads_no_research_tool() -> None:
    loaded = _loaded_after_full("import d3.engine, d3.compare, d3.models, d3.orders")
    assert "d3.engine" in loaded
    assert not {m for m in loaded if m.startswith(("d3.research", "d3.reports", "d3.cli"))}


def _loaded_after_full(code: str) -> set[str]:
    probe = code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         cwd=D3.parent, timeout=300)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))
