"""Small helpers shared by the Amaranth blocks."""

from __future__ import annotations

from amaranth.hdl import Value

from ..config import check_int  # noqa: F401  (re-exported for the blocks)

__all__ = ["adder_tree", "check_int"]


def adder_tree(values: list[Value]) -> Value:
    """Balanced binary sum; Amaranth widens each adder by one bit so no level
    can overflow."""
    values = list(values)
    if not values:
        raise ValueError("adder_tree needs at least one operand")
    while len(values) > 1:
        nxt = [values[i] + values[i + 1] for i in range(0, len(values) - 1, 2)]
        if len(values) % 2:
            nxt.append(values[-1])
        values = nxt
    return values[0]
