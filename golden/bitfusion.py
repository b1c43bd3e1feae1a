"""Golden model of the Bit-Fusion-style baseline PE (``hw/bitfusion.py``).

Each lane fuses sixteen 2-bit x 2-bit BitBricks (Sharma et al., "Bit Fusion",
ISCA 2018). With INT8 activations the lane computes either one INT8 x INT8
product (W8) or two INT8 x INT4 products (W4) per cycle; the INT4 weights are
a separate low-precision copy (it has no bit-nested storage).

Weights on the port: ``L`` bytes; in W8 each byte is one signed weight, in W4
each byte holds two signed nibbles (low nibble for activation ``2j``, high
for ``2j+1``). Activations: ``2L`` INT8, of which W8 uses the first ``L``.

The dot-product rule (:func:`result`): a dot product is 1 .. ``max_beats``
beats of one mode, closed by ``last``; W8 beats carry ``L`` elements, W4
beats ``2L``, and ``max_beats`` is ``ceil(max_len / L)`` in W8 and
``ceil(max_len / 2L)`` in W4, so both modes accept the same number of
elements. Anything else is an error result.
"""

from __future__ import annotations

import enum

import numpy as np

from ..geometry import fusion_max_beats
from .bitslice import SeqError

__all__ = ["Mode", "W8", "W4", "beat_dot", "pack_w4", "max_beats", "result"]


class Mode(enum.IntEnum):
    """Weight mode (the 1-bit hardware encoding)."""
    W8 = 0
    W4 = 1


W8, W4 = Mode.W8, Mode.W4


def pack_w4(w4) -> np.ndarray:
    """Pack ``2L`` signed INT4 weights into ``L`` bytes (unsigned 0..255)."""
    w4 = np.asarray(w4, dtype=np.int64)
    if w4.min() < -8 or w4.max() > 7:
        raise ValueError("INT4 weights must be in -8..7")
    lo, hi = w4[0::2] & 0xF, w4[1::2] & 0xF
    return lo | (hi << 4)


def beat_dot(act, wbytes, mode) -> int:
    """Sum of the products one beat contributes."""
    a = np.asarray(act, dtype=np.int64)
    b = np.asarray(wbytes, dtype=np.int64) & 0xFF
    L = b.size
    if mode == W8:
        w = np.where(b >= 128, b - 256, b)
        return int(np.sum(a[:L] * w))
    lo, hi = b & 0xF, b >> 4
    lo = np.where(lo >= 8, lo - 16, lo)
    hi = np.where(hi >= 8, hi - 16, hi)
    return int(np.sum(a[0::2] * lo) + np.sum(a[1::2] * hi))


def max_beats(mode, *, max_len: int, lanes: int) -> int:
    """Longest dot product in beats: ``ceil(max_len / L)`` (W8) or
    ``ceil(max_len / 2L)`` (W4): :func:`elmoe3d.geometry.fusion_max_beats`."""
    return fusion_max_beats(Mode(mode) is W4, max_len=max_len, lanes=lanes)


def result(beats, *, max_len: int, lanes: int):
    """``(value, error, reason)`` for one beat sequence of ``(act[2L],
    weight[L], mode)``: the sum of :func:`beat_dot`, or ``(None, 1, reason)``
    with ``MODE_CHANGE`` (a beat of another mode than the first) or
    ``TOO_LONG``."""
    mode = Mode(beats[0][2])
    for i, b in enumerate(beats):
        if Mode(b[2]) is not mode:
            return None, 1, SeqError.MODE_CHANGE
        if i + 1 > max_beats(mode, max_len=max_len, lanes=lanes):
            return None, 1, SeqError.TOO_LONG
    return sum(beat_dot(a, w, mode) for a, w, _ in beats), 0, SeqError.OK
