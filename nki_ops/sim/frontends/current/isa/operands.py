"""The operand and destination conventions of current-API instructions, which live in the core
(``core/outputs.py``: the ``Dst`` output spec); the names the LNC and collective instructions use."""

from __future__ import annotations

from ....core.outputs import Dst, take_turn

_step = take_turn


def _dst(dst, api: str, on_chip: bool = True):
    """``dst`` checked as an instruction's destination (``Dst``)."""
    return Dst(dst, api, on_chip).dst
