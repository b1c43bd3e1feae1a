"""Golden model of the weight-bit-serial MAC vector (UNPU/Stripes-style peer).

The peer is written from its published description, not from our PE: a
bit-serial (here digit-serial) MAC feeds every lane an INT8 activation and
``b`` bits of that lane's weight per cycle, most significant digit first, and
accumulates by shift-and-add (UNPU: Lee et al., "UNPU: A 50.6TOPS/W Unified
Deep Neural Network Accelerator with 1b-to-16b Fully-Variable Weight
Bit-Precision", ISSCC 2018; Stripes: Judd et al., MICRO 2016, serial in the
activations instead). A weight of ``p`` bits takes ``p / b`` cycles, so the
same hardware runs INT8 weights in ``8/b`` cycles per chunk and a 4-bit
(draft) weight in ``4/b``: precision trades for throughput with no extra
weight copy, which is exactly what our bit-slice PE does with planes. The
difference is in the arithmetic: the peer has no augmentation bit, so a 4-bit
draft is the plain truncated weight ``w >> 4`` (floor), computed as a 4-bit
number (its result is in units of 16 INT8 LSBs).

Contract (what :func:`run` computes from a beat sequence)
----------------------------------------------------------
A weight *group* is ``g = p / b`` consecutive beats, each carrying one digit
per lane; the first has ``msd`` (most significant digit, two's complement,
signed), the last ``lsd``; middle digits are unsigned. Lane ``j``'s weight is
``w_j = sum_k d_jk * 2^(b*(g-1-k))`` with ``d_j0`` signed. The group adds
``sum_j a_j * w_j`` to the dot product. A dot product ends on a beat with
``last``, which must also carry ``lsd``. ``error`` is set when a group has
more than ``8 / b`` digits, a beat that starts a group lacks ``msd`` (or a
beat inside one has it), ``last`` comes without ``lsd``, or the dot product
has more than ``ceil(max_len / L)`` groups; the next dot product starts
clean.
"""

from __future__ import annotations

import numpy as np

from ..config import check_int
from ..geometry import DIGIT_BITS, MAX_WEIGHT_BITS, check_digit_bits
from ..geometry import serial_acc_width as acc_width
from ..geometry import serial_max_groups as max_groups

__all__ = ["DIGIT_BITS", "check_digit_bits", "digits", "weight_beats", "dot_beats",
           "run", "truncate", "acc_width", "max_groups"]


def _check_prec(p: int, b: int) -> None:
    check_int("Weight precision", p, 1, MAX_WEIGHT_BITS)
    if p % b:
        raise ValueError(f"Weight precision {p} must be a multiple of the digit width {b}")


def digits(w, p: int, b: int) -> np.ndarray:
    """Digits of ``p``-bit signed weights ``w`` (any shape), most significant
    first: shape ``(p // b, *w.shape)``; digit 0 signed, the rest unsigned."""
    check_digit_bits(b)
    _check_prec(p, b)
    w = np.asarray(w, dtype=np.int64)
    lo, hi = -(1 << (p - 1)), (1 << (p - 1)) - 1
    if w.size and (w.min() < lo or w.max() > hi):
        raise ValueError(f"weights must be {p}-bit signed ({lo}..{hi})")
    g = p // b
    u = w & ((1 << p) - 1)
    out = np.stack([(u >> (b * (g - 1 - k))) & ((1 << b) - 1) for k in range(g)])
    top = out[0]
    out[0] = np.where(top >= (1 << (b - 1)), top - (1 << b), top)
    return out


def truncate(w8, p: int) -> np.ndarray:
    """The ``p``-bit draft of INT8 weights: the top ``p`` bits (floor)."""
    check_int("Draft precision", p, 1, 8)
    return np.asarray(w8, dtype=np.int64) >> (8 - p)


def weight_beats(act, w, p: int, b: int, lanes: int) -> list[dict]:
    """Beats of one dot product ``act . w`` (1-D, same length, ``p``-bit
    weights): chunks of ``lanes`` elements (zero padded), each ``p // b``
    beats, ``last`` on the final beat. Payload keys as the RTL's input layout:
    ``act``, ``digits``, ``msd``, ``lsd``, ``last``."""
    act = np.asarray(act, dtype=np.int64)
    w = np.asarray(w, dtype=np.int64)
    if act.shape != w.shape or act.ndim != 1 or act.size == 0:
        raise ValueError("act and w must be non-empty 1-D arrays of the same length")
    chunks = -(-act.size // lanes)
    pad = chunks * lanes - act.size
    a = np.concatenate([act, np.zeros(pad, np.int64)]).reshape(chunks, lanes)
    wp = np.concatenate([w, np.zeros(pad, np.int64)]).reshape(chunks, lanes)
    d = digits(wp, p, b)                      # (g, chunks, lanes)
    g = p // b
    beats = []
    for c in range(chunks):
        for k in range(g):
            beats.append({"act": [int(x) for x in a[c]],
                          "digits": [int(x) & ((1 << b) - 1) for x in d[k, c]],
                          "msd": int(k == 0), "lsd": int(k == g - 1),
                          "last": int(c == chunks - 1 and k == g - 1)})
    return beats


def dot_beats(act, w, p, b, lanes):
    """``(beats, value)``: the beats of one dot product and its exact value."""
    return weight_beats(act, w, p, b, lanes), int(np.dot(np.asarray(act, np.int64),
                                                         np.asarray(w, np.int64)))


def run(beats, *, b: int, lanes: int, max_len: int) -> list[tuple[int, int]]:
    """The contract: ``(value, error)`` per dot product of a beat sequence.

    ``value`` wraps to the accumulator width (it is only meaningful without
    ``error``)."""
    check_digit_bits(b)
    W = acc_width(max_len)
    gmax = MAX_WEIGHT_BITS // b
    limit = max_groups(max_len, lanes)
    out = []
    acc, bad, groups = 0, False, 0
    grp, ndig, in_group = 0, 0, False
    for beat in beats:
        d = [int(x) & ((1 << b) - 1) for x in beat["digits"]]
        if beat["msd"]:
            d = [x - (1 << b) if x >= (1 << (b - 1)) else x for x in d]
        psum = sum(int(a) * x for a, x in zip(beat["act"], d))
        if beat["msd"] != (not in_group):
            bad = True
        if beat["msd"]:
            grp, ndig = 0, 0
        grp = (grp << b) + psum
        ndig += 1
        if ndig > gmax:
            bad = True
        in_group = not beat["lsd"]
        if beat["lsd"]:
            groups += 1
            if groups > limit:
                bad = True
            acc += grp
        if beat["last"]:
            if not beat["lsd"]:
                bad = True
            v = acc & ((1 << W) - 1)
            v = v - (1 << W) if v >> (W - 1) else v
            out.append((v, int(bad)))
            acc, bad, groups, grp, ndig, in_group = 0, False, 0, 0, 0, False
    return out
