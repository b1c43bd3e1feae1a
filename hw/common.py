"""Small helpers shared by the Amaranth blocks."""

from __future__ import annotations

from amaranth.hdl import Value

__all__ = ["adder_tree", "check_int"]


def check_int(name: str, value, lo: int, hi: int | None = None) -> int:
    """Validate an elaboration parameter: ``TypeError`` for a non-integer,
    ``ValueError`` naming the value when out of range."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, not {value!r}")
    if value < lo or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise ValueError(f"{name} must be {rng}, not {value!r}")
    return value


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
