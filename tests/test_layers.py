"""The layers stay apart: viz/ (the figures) needs neither torch, transformers nor gradio, and the page lives in
explorer/ with app.py only launching it (d3/'s own guard is tests/test_d3_imports.py)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def modules(package: str) -> list[str]:
    """Every module of `package`, dotted."""
    return sorted(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                  for p in (ROOT / package).rglob("*.py"))


def imported_top_level(module: str) -> set[str]:
    """Top-level packages in sys.modules after importing `module` in a fresh interpreter."""
    code = f"import sys, json, {module}; print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def imports_anywhere(module: str) -> set[str]:
    """Top-level packages a module's source imports, at the top or inside a function."""
    path = ROOT / Path(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("module", modules("viz"))
def test_viz_needs_neither_torch_transformers_nor_gradio(module: str) -> None:
    assert not imports_anywhere(module) & {"torch", "transformers", "gradio", "explorer", "app"}


def test_importing_all_of_viz_loads_neither_torch_transformers_nor_gradio() -> None:
    loaded = imported_top_level(", ".join(modules("viz")))
    assert not loaded & {"torch", "transformers", "gradio"}


def test_the_page_is_one_package_and_app_py_only_launches_it() -> None:
    assert not (ROOT / "d3" / "live.py").exists() and not (ROOT / "viz" / "app_extras.py").exists()
    assert len((ROOT / "app.py").read_text().splitlines()) < 120
    for module in modules("explorer"):  # the load test too: it serves a tiny model from d3.testing
        assert "tests" not in imports_anywhere(module), module


def _dotted_imports(module: str) -> set[str]:
    path = ROOT / Path(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}  # `from explorer import views`
    return found


@pytest.mark.parametrize("module", modules("viz"))
def test_viz_imports_nothing_from_the_research_tools_or_the_reports(module: str) -> None:
    """viz draws what it is handed: the report's tables come in as `viz.report.ReportParts` (issue 33)."""
    assert not {m for m in _dotted_imports(module) if m.startswith(("d3.research", "d3.reports", "d3.cli"))}


def test_no_import_circle_between_the_page_modules() -> None:
    """explorer's modules import each other in one direction (views <-> wording was a circle, issue 33)."""
    graph = {m: {i for i in _dotted_imports(m) if i.startswith("explorer")} for m in modules("explorer")}
    graph = {m: {i for i in deps if i in graph} for m, deps in graph.items()}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(d == goal or (d not in seen and not seen.add(d) and reaches(d, goal, seen)) for d in graph[start])

    circles = sorted(f"{m} <-> {d}" for m in graph for d in graph[m] if reaches(d, m, set()))
    assert not circles, circles
