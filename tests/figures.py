"""Reading figures in tests (no torch, no gradio: the pure viz tests import it too)."""

from __future__ import annotations


def message(fig) -> str:
    """The message of a placeholder figure (`viz.layout.empty_figure`), its wrapped lines joined by spaces."""
    return fig.layout.annotations[0].text.replace("<br>", " ")


def title_text(fig) -> str:
    """A figure's title as a person reads it: its wrapped lines joined by spaces, without plotly's tags."""
    import re

    return " ".join(re.sub(r"<br>|<[^>]+>", " ", fig.layout.title.text or "").split())


def by_role(fig, role: str):
    """The traces a figure marks with this role (meta["role"])."""
    return [t for t in fig.data if (t.meta or {}).get("role") == role]


def role(fig, name: str):
    """The first trace a figure marks with this role (meta["role"])."""
    return next(t for t in fig.data if (t.meta or {}).get("role") == name)
