"""`d3-explorer`: serve the D3 Explorer page (what `python app.py` does, with host and port flags)."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="d3-explorer",
        description="Serve the D3 Explorer page: D3 streamed beside full depth on a real model, with live views.")
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                        help="address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
                        help="port to listen on (default 7860)")
    parser.add_argument("--share", action="store_true", help="also open a public gradio.live link")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Imported after parsing, so `--help` answers without loading gradio and torch.
    from explorer.page import build_demo, launch, tune_process

    logging.basicConfig(level=logging.INFO)
    demo = build_demo()
    tune_process()
    launch(demo, server_name=args.host, server_port=args.port, share=args.share)
    return 0
