"""The suite mirrors the code: a newcomer finds a module's tests in tests/test_<module>.py, and no test module
leans on another (shared fixtures live in conftest.py, shared helpers in tests/apphelpers.py, tests/pagehelpers.py,
tests/figures.py, tests/traces.py, tests/tiny.py and tests/bigbench.py)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
# Modules whose tests sit in a file named after what a person does with them rather than after the module.
ELSEWHERE = {
    "d3/testing.py": "conftest.py",  # the tiny models every fast test builds
    "explorer/page.py": "test_browser_page.py",  # the page as built, in Chromium
    "explorer/cli.py": "test_packaging.py",  # the d3-explorer command, installed
    "explorer/ui.py": "test_robustness.py",  # gr.Error for a person's mistake, outputs in order
    "explorer/wording.py": "test_views.py",  # the views' titles and explanations
    "explorer/layout.py": "test_wiring.py",  # the components and what listens to them
    "d3/cli/common.py": "test_cli.py",  # the flags every subcommand shares, through the commands
    "d3/reports/generation.py": "test_generation_sweep.py",  # the generation sweep's report, on its own rows
    "d3/research/calibration_sets.py": "test_calibrate.py",  # the sets a calibration reads
}
# Packages whose modules are tested together, in one file: every module under the folder, there.
ELSEWHERE_UNDER = {
    "d3/research/sweep/": "test_sweep.py",  # spec, grid, measure, run, table, tasks (generation: its own file)
    "explorer/loadtest/": "test_load.py",
    "explorer/views/": "test_views.py",  # each view's module: the registry's tests, and test_browser.py drawn
    "viz/": "test_viz.py",  # the figure builders without a file of their own
}


def modules() -> list[str]:
    """Every module of the core, the research tools, the CLI, the page and the figures (d3/, explorer/, viz/), as
    paths from the repository root."""
    found = [p for package in ("d3", "explorer", "viz") for p in sorted((ROOT / package).rglob("*.py"))]
    return [p.relative_to(ROOT).as_posix() for p in found if not p.name.startswith("__")]


def _elsewhere(module: str) -> str:
    return ELSEWHERE.get(module) or next((f for under, f in ELSEWHERE_UNDER.items() if module.startswith(under)), "-")


def test_every_module_of_the_core_and_the_page_has_its_test_file() -> None:
    missing = [m for m in modules()
               if not (TESTS / f"test_{Path(m).stem}.py").is_file() and not (TESTS / _elsewhere(m)).is_file()]
    assert not missing, f"no tests/test_<module>.py for {missing}"


def test_no_test_module_imports_another() -> None:
    leaning = {}
    for path in sorted(TESTS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            bad = [n for n in names if n.split(".")[-1].startswith("test_") or n.startswith("tests.test_")]
            if bad:
                leaning.setdefault(path.name, []).extend(bad)
    assert not leaning, f"test modules importing other test modules: {leaning}"
