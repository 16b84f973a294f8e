"""Reading figures in tests (no torch, no gradio: the pure viz tests import it too)."""

from __future__ import annotations


def message(fig) -> str:
    """The message of a placeholder figure (`viz.layout.empty_figure`), its wrapped lines joined by spaces."""
    return fig.layout.annotations[0].text.replace("<br>", " ")
