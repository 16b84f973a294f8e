"""README.md: its Python snippets run as written on the embedded model, and every CLI line in it parses."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def test_every_d3_command_line_in_the_readme_parses():
    from d3.cli import build_parser

    lines = [line.split("#", 1)[0].strip() for block in blocks("bash") for line in block.splitlines()]
    commands = [shlex.split(line)[1:] for line in lines if line.startswith("d3 ")]
    assert len(commands) >= 8
    parser = build_parser()
    for argv in commands:
        parser.parse_args(argv)  # raises CliError naming the flag on anything the CLI does not take


@pytest.mark.integration
@pytest.mark.parametrize("index", range(len([b for b in blocks("python") if "gradio_client" not in b])))
def test_python_snippets_run_as_written(index, monkeypatch):
    """The page's gradio_client snippet needs a server: tests/test_app_client.py runs that one."""
    code = [b for b in blocks("python") if "gradio_client" not in b][index]
    monkeypatch.chdir(ROOT)  # "hub/d3-generate" is a path from the repository root
    exec(compile(code, f"README.md python block {index}", "exec"), {"__name__": "readme"})
