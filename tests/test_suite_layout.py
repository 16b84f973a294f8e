"""The suite maps the code by module: every module of d3/, explorer/ and viz/ is imported, by its dotted name, by
some test file, or is listed in THROUGH with the test file that exercises it another way and the words in that file
that show how (a CLI subcommand by name, a view through the registry by its key). A module of the same stem in two
packages (d3/cli/paper.py, d3/research/paper.py) is told apart by its dotted name, not by a file's stem. No test module
leans on another (shared fixtures live in conftest.py, shared helpers in tests/apphelpers.py, tests/pagehelpers.py,
tests/figures.py, tests/traces.py, tests/tiny.py and tests/bigbench.py).

`python tests/test_suite_layout.py` prints the map: each module and the test files that import it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
# Modules that a test drives without importing them by name: (test file, words in it that show the route).
THROUGH: dict[str, tuple[str, str]] = {
    "d3.cli.calibrate": ("test_cli.py", '["calibrate", '),  # the subcommand, through d3.cli.main
    "d3.cli.install": ("test_install.py", '["install", '),
    "d3.cli.oracle": ("test_cli.py", '["oracle", '),
    "d3.cli.paper": ("test_cli.py", '["paper", '),
    "d3.research.calibration_sets": ("test_calibrate.py", "from d3.research import calibrate"),  # re-exported there
    "explorer.loadtest.classroom": ("test_load.py", "from explorer import loadtest"),  # the package's API
    "explorer.loadtest.client": ("test_load.py", "from explorer import loadtest"),
    "explorer.loadtest.phases": ("test_load.py", "from explorer import loadtest"),
    "explorer.loadtest.report": ("test_load.py", "from explorer import loadtest"),
    "explorer.loadtest.server": ("test_load.py", "from explorer import loadtest"),
    "explorer.views.attention": ("test_views.py", '"attention"'),  # each view through views.registry(), by key
    "explorer.views.decay": ("test_views.py", '"decay"'),
    "explorer.views.fills": ("test_views.py", '"fills"'),
    "explorer.views.lens": ("test_views.py", '"lens"'),
    "explorer.views.planned": ("test_views.py", '"planned"'),
    "explorer.views.stack": ("test_view_handlers.py", "open_view(pool, \"stack\""),  # opened as a person opens it
    "explorer.views.usage": ("test_views.py", '"usage"'),
    "viz.flow": ("test_viz.py", "viz.sublayer_flow("),  # through viz's package exports
    "viz.layers": ("test_viz.py", "viz.layers_vs_step("),
}


def modules() -> list[str]:
    """Every module of the core, the research tools, the CLI, the page and the figures (d3/, explorer/, viz/), as
    dotted names."""
    found = [p for package in ("d3", "explorer", "viz") for p in sorted((ROOT / package).rglob("*.py"))]
    return [p.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
            for p in found if not p.name.startswith("__")]


def imported_names(path: Path) -> set[str]:
    """The dotted names a test file imports: `import a.b`, `from a.b import c` (a.b, and a.b.c when c is a module)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def module_map() -> dict[str, list[str]]:
    """Each module and the test files that import it by name (an empty list: none does)."""
    imports = {path.name: imported_names(path) for path in sorted(TESTS.glob("*.py"))}
    return {module: [name for name, names in imports.items() if module in names] for module in modules()}


def test_every_module_is_imported_by_a_test_or_named_with_its_route() -> None:
    mapped = module_map()
    missing = [m for m, files in mapped.items() if not files and m not in THROUGH]
    assert not missing, f"no test file imports {missing}: import it in its tests, or add it to THROUGH with its route"


def test_every_route_is_real() -> None:
    stale = [m for m in THROUGH if m not in set(modules())]
    assert not stale, f"THROUGH names modules that do not exist: {stale}"
    wrong = {m: route for m, (test, words) in THROUGH.items()
             for route in [(test, words)] if not (TESTS / test).is_file()
             or words not in (TESTS / test).read_text(encoding="utf-8")}
    assert not wrong, f"THROUGH's routes not found in their test files: {wrong}"


def test_a_module_is_told_apart_from_its_namesake_by_its_dotted_name() -> None:
    """The map reads dotted names: d3.cli.paper and d3.research.paper are two entries, and a test file importing one
    does not count for the other."""
    mapped = module_map()
    assert "d3.research.paper" in mapped and "d3.cli.paper" in mapped
    assert "test_paper.py" in mapped["d3.research.paper"]
    assert "test_paper.py" not in mapped["d3.cli.paper"]


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


if __name__ == "__main__":
    for module, files in module_map().items():
        route = THROUGH.get(module)
        print(f"{module:40s} {', '.join(files) or (f'{route[0]} ({route[1]})' if route else '-')}")
    sys.exit(0)
