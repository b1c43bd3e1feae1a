"""Parameter checks shared by :class:`~elmoe3d.config.Config`, the derived
widths (:mod:`elmoe3d.geometry`), the Amaranth blocks and the golden models,
so that each refuses the same values with the same message. Imports nothing
from the package."""

from __future__ import annotations

__all__ = ["check_int"]


def check_int(name: str, value, lo: int, hi: int | None = None) -> int:
    """Validate an integer parameter: ``TypeError`` for a non-integer (bools
    included), ``ValueError`` naming the value when out of range. Shared by
    the Config, the Amaranth blocks and the golden models."""
    if isinstance(value, bool) or not isinstance(value, int):
        # NumPy integers are integers too
        try:
            import numpy as np
            if isinstance(value, np.integer):
                value = int(value)
            else:
                raise TypeError
        except (ImportError, TypeError):
            raise TypeError(f"{name} must be an integer, not {value!r}") from None
    if value < lo or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise ValueError(f"{name} must be {rng}, not {value!r}")
    return value
