"""explorer/moves.py: a person's moves wired as one event per trigger (issue 24's storm; tests/test_wiring.py checks
the page keeps to it)."""

from __future__ import annotations

import gradio as gr
import pytest

from explorer.moves import Moves


def test_moves_group_triggers_by_the_handlers_that_follow_them() -> None:
    calls = []
    with gr.Blocks() as blocks:
        a, b, out = gr.Slider(), gr.Slider(), gr.Textbox()
        moves = Moves()
        moves.on([a.input, b.input], lambda x, y: "settle", [a, b], [out], api_name="settle",
                 after=lambda event, first: calls.append(first))
        moves.on([a.input], lambda x: "redraw", [a], [out], api_name="redraw")
        moves.wire()
    fns = list(blocks.fns.values())
    heads = {block: fn for fn in fns for block, event in fn.targets if block is not None}
    assert set(heads) == {a._id, b._id} and heads[a._id] is not heads[b._id]  # {settle, redraw} and {settle}
    assert heads[a._id].api_name == "settle" and heads[b._id].api_name != "settle"  # the name once
    redraw = [fn for fn in fns if fn.api_name == "redraw"]
    assert len(redraw) == 1 and redraw[0].trigger_after == heads[a._id]._id  # after a's settle, on no trigger
    assert calls == [True, False]  # `after` once per event made for the handler, the first told so
    assert all(fn.trigger_mode == "always_last" for fn in fns)


def test_a_move_registered_after_wiring_is_refused() -> None:
    with gr.Blocks():
        a = gr.Slider()
        moves = Moves()
        moves.wire()
        with pytest.raises(RuntimeError, match="register every move first"):
            moves.on([a.input], lambda x: x, [a], [a])
