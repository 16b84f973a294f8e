"""Figure titles that fit the narrowest box a figure gets (plotly never wraps a title: it cuts it at the edge)."""

from __future__ import annotations

from viz.layout import wrap_message

# A title fits the narrowest box a figure gets: a phone's (about 320 px) or the token scrubber's (about 310 px beside
# the layers at 1280 px). Presentation mode scales fonts and boxes alike (1.4x; the scrubber's box is 440 px there),
# so the same counts fit both. About 0.55 em per character: 28 at the title's size, 40 at a subtitle's (70%).
TITLE_CHARS = 28
SUBTITLE_CHARS = 40


def fit_title(head: str, *notes: str | tuple[str, str]) -> str:
    """A figure title that plotly draws inside a narrow box: `head` (wrapped at TITLE_CHARS) and each note wrapped
    into smaller subtitle lines (SUBTITLE_CHARS), one "<sub>" per line; a note given as (text, colour) is drawn in
    that colour. Plotly never wraps a title: one wider than the figure is cut at its right edge. Notes are plain
    text (plotly's escapes allowed, no tags)."""
    lines = wrap_message(head, TITLE_CHARS).split("<br>")
    for note in notes:
        text, color = note if isinstance(note, tuple) else (note, None)
        for line in wrap_message(text, SUBTITLE_CHARS).split("<br>"):
            lines.append(f"<sub><span style='color:{color}'>{line}</span></sub>" if color else f"<sub>{line}</sub>")
    return "<br>".join(lines)
