"""The package: pyproject and requirements.txt agree, and `pip install .` gives working `d3` and `d3-explorer` commands."""

from __future__ import annotations

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
    assert project["scripts"] == {"d3": "d3.cli:main", "d3-explorer": "explorer.cli:main"}


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
    """A real install of this package (no editable link, run from outside the checkout). The venv sees the system's
    site-packages so torch and the rest are not downloaded again; `--no-deps --no-build-isolation` keeps it offline."""
    src = tmp_path / "src"
    src.mkdir()
    for name in PACKAGE_FILES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, src / name)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    bin_dir = env_dir / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    run = lambda *cmd: subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    pip = run(sys.executable, "-m", "pip", "--python", str(bin_dir / "python"), "install", "--quiet", "--no-deps",
              "--no-build-isolation", "--disable-pip-version-check", str(src))
    assert pip.returncode == 0, pip.stderr
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
