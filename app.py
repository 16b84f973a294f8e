"""D3 Explorer: the Gradio page, built and launched (the Spaces entry point). The page itself is in explorer/."""

from __future__ import annotations

import logging

from explorer.page import build_demo, launch, tune_process

demo = build_demo()

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    tune_process()
    launch(demo)
