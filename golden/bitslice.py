"""Golden bit-slice model: the specification of slice encoding, augmented
reconstruction and every PE mode's integer dot product.

An INT8 weight ``w`` is cut into ``n = 8 // s`` planes of ``s`` bits. Plane 0
(the MSB plane) is signed, planes ``1 .. n-1`` are unsigned::

    w = sum(planes[p] * 2**(s * (n - 1 - p)) for p in range(n))

Keeping the top ``k`` planes drops ``d = s * (n - k)`` bits. Plain truncation
(``floor`` to a multiple of ``2**d``) is biased by ``-(2**d - 1) / 2`` on
average. LSB augmentation adds half of the dropped range, ``2**(d - 1)``,
which puts the reconstruction at the midpoint of the interval the dropped bits
span: round-to-nearest, unbiased over uniformly distributed low bits, and at
most ``2**(d - 1)`` away from ``w``.

PE modes (the values are the hardware encoding):

========  =====================================================================
FULL      all ``n`` planes, exact: ``sum(a * w)``
DRAFT     top ``keep`` planes, LSB-augmented: ``sum(a * (trunc_keep(w) + 2**(d-1)))``
MSB       top ``keep`` planes, truncated partial: ``sum(a * trunc_keep(w))``
LSB       planes ``keep .. n-1`` partial: ``sum(a * (w - trunc_keep(w)))``
========  =====================================================================

``MSB + LSB == FULL`` exactly for every ``keep``. MSB mode is also the "plain
truncation" draft that the augmented DRAFT is compared against.

The PE computes these through ``(s + 1)``-bit signed *fields* (see
:func:`field` and :func:`pe_dot`): an unsigned ``s``-bit slice needs a
sign-extension bit to enter a signed multiplier, the signed MSB slice does not,
so its spare bit becomes an implicit rounding bit (``{m, r}``, worth ``2m + r``
half-units of the MSB plane). With ``k = 1`` setting ``r = 1`` is exactly the
augmentation; with ``k > 1`` (only for ``s < 4``) the augmentation is the
activation sum scaled by ``2**(d - 1)``.

Everything here is plain NumPy with explicit ``int64`` arithmetic.
"""

from __future__ import annotations

import enum

import numpy as np

from ..geometry import (WEIGHT_BITS, acc_width, check_slice_bits, field_shift, max_abs_product,
                        max_chunks, n_planes)

__all__ = [
    "Mode", "WEIGHT_BITS", "n_planes", "check_slice_bits", "split", "combine",
    "truncate", "reconstruct", "effective_weights", "plane_range", "check_mode",
    "dot", "field", "field_shift", "pe_dot", "acc_width", "max_abs_product", "max_chunks",
    "SeqError", "check_beats", "pe_result", "mac_result",
]


class Mode(enum.IntEnum):
    """PE precision mode (the 2-bit hardware encoding)."""
    FULL = 0
    DRAFT = 1
    MSB = 2
    LSB = 3


def _as_int8_values(w) -> np.ndarray:
    w = np.asarray(w)
    if not np.issubdtype(w.dtype, np.integer):
        raise TypeError(f"Weights must be an integer array, not dtype {w.dtype}")
    w = w.astype(np.int64)
    if w.size and (w.min() < -128 or w.max() > 127):
        raise ValueError(f"Weights must be INT8 (-128..127), got range {w.min()}..{w.max()}")
    return w


def split(w, s: int) -> np.ndarray:
    """Slice INT8 weights into planes.

    Returns an ``int64`` array of shape ``(n,) + w.shape``; plane 0 is the
    signed MSB slice (``-2**(s-1) .. 2**(s-1)-1``), the others are unsigned
    (``0 .. 2**s - 1``).
    """
    n = n_planes(s)
    w = _as_int8_values(w)
    u = w & 0xFF
    planes = np.empty((n,) + w.shape, dtype=np.int64)
    mask = (1 << s) - 1
    for p in range(n):
        planes[p] = (u >> (s * (n - 1 - p))) & mask
    half = 1 << (s - 1)
    planes[0] = np.where(planes[0] >= half, planes[0] - (1 << s), planes[0])
    return planes


def combine(planes, s: int) -> np.ndarray:
    """Inverse of :func:`split` (all planes)."""
    n = n_planes(s)
    planes = np.asarray(planes, dtype=np.int64)
    if planes.shape[0] != n:
        raise ValueError(f"Expected {n} planes for slice width {s}, got {planes.shape[0]}")
    return sum(planes[p] << (s * (n - 1 - p)) for p in range(n))


def _check_keep(s: int, keep, lo: int, hi: int, what: str) -> int:
    if isinstance(keep, bool) or not isinstance(keep, (int, np.integer)):
        raise TypeError(f"Kept plane count must be an integer, not {keep!r}")
    if not lo <= keep <= hi:
        raise ValueError(f"{what}: kept plane count must be in {lo}..{hi} for slice width {s}, "
                         f"not {keep!r}")
    return int(keep)


def truncate(w, s: int, k: int) -> np.ndarray:
    """Top ``k`` planes of ``w`` (floor to a multiple of ``2**(s*(n-k))``)."""
    n = n_planes(s)
    k = _check_keep(s, k, 1, n, "truncate")
    d = s * (n - k)
    return (_as_int8_values(w) >> d) << d


def reconstruct(w, s: int, k: int, augment: bool) -> np.ndarray:
    """Weights as seen with the top ``k`` planes, with or without LSB augmentation.

    ``k == n`` is full precision and returns ``w`` exactly (nothing dropped,
    nothing to augment).
    """
    n = n_planes(s)
    k = _check_keep(s, k, 1, n, "reconstruct")
    t = truncate(w, s, k)
    if augment and k < n:
        t = t + (1 << (s * (n - k) - 1))
    return t


def check_mode(s: int, mode, keep) -> tuple[Mode, int]:
    """Validate a (mode, keep) pair; returns it normalised.

    FULL ignores ``keep`` (returned as ``n``); DRAFT, MSB and LSB need
    ``1 <= keep <= n - 1``.
    """
    n = n_planes(s)
    try:
        mode = Mode(mode)
    except ValueError:
        raise ValueError(f"PE mode must be one of {[m.name for m in Mode]}, not {mode!r}") from None
    if mode is Mode.FULL:
        return mode, n
    return mode, _check_keep(s, keep, 1, n - 1, f"{mode.name} mode")


def plane_range(s: int, mode, keep) -> range:
    """Planes a PE must be streamed for this mode, MSB first."""
    n = n_planes(s)
    mode, keep = check_mode(s, mode, keep)
    if mode is Mode.LSB:
        return range(keep, n)
    return range(0, keep)


def effective_weights(w, s: int, mode, keep) -> np.ndarray:
    """The weight each mode multiplies by (the specification of a PE mode)."""
    mode, keep = check_mode(s, mode, keep)
    w = _as_int8_values(w)
    if mode is Mode.FULL:
        return w
    if mode is Mode.DRAFT:
        return reconstruct(w, s, keep, augment=True)
    if mode is Mode.MSB:
        return truncate(w, s, keep)
    return w - truncate(w, s, keep)


def dot(act, w, s: int, mode=Mode.FULL, keep=None) -> np.ndarray:
    """Integer dot product(s) over the last axis for a PE mode (``int64``)."""
    a = _as_int8_values(act)
    ew = effective_weights(w, s, mode, keep)
    return np.sum(a * ew, axis=-1, dtype=np.int64)


# --- the PE's arithmetic, field by field ----------------------------------------

def field(slices, plane: int, s: int, round_bit=0) -> np.ndarray:
    """Value of the ``(s+1)``-bit signed multiplier field for a slice.

    Plane 0: ``{m, r}`` = ``2*m + r`` (the spare sign-extension bit is the
    rounding bit ``r``). Other planes: ``{0, l}`` = ``l`` (zero sign
    extension); ``round_bit`` must be 0 for them.
    """
    slices = np.asarray(slices, dtype=np.int64)
    if plane == 0:
        return 2 * slices + int(round_bit)
    if round_bit:
        raise ValueError("Only the MSB plane has a rounding bit")
    return slices


def pe_dot(act_chunks, plane_chunks, planes_seq, s: int, mode, keep, augment=True) -> int:
    """The PE's algorithm on a beat sequence (one dot product).

    ``act_chunks[b]``, ``plane_chunks[b]`` are the activation and slice vector
    of beat ``b``, ``planes_seq[b]`` its plane index. Rounding (DRAFT) is
    applied on beats of plane ``keep - 1``: through the MSB field bit when that
    is plane 0, else by adding ``sum(a) << (field_shift - 1)``. With
    ``augment=False`` (the plain bit-slice baseline) DRAFT rounds nothing.
    """
    mode, keep = check_mode(s, mode, keep)
    acc = 0
    for a, sl, p in zip(act_chunks, plane_chunks, planes_seq):
        a = np.asarray(a, dtype=np.int64)
        rnd = augment and mode is Mode.DRAFT and p == keep - 1
        f = field(sl, p, s, round_bit=1 if (rnd and p == 0) else 0)
        acc += int(np.sum(a * f)) << field_shift(p, s)
        if rnd and p > 0:
            acc += int(np.sum(a)) << (field_shift(p, s) - 1)
    return acc


# --- the dot-product rule: which beat sequences are one dot product ----------------

class SeqError(enum.IntEnum):
    """Why a beat sequence is not one dot product (the first rule it breaks).

    The PE reports any of them as ``error = 1`` on the one result that the
    sequence (up to and including its ``last`` beat) produces; the next
    sequence starts clean."""
    OK = 0
    BAD_KEEP = 1        # DRAFT/MSB/LSB with keep outside 1 .. n-1
    MODE_CHANGE = 2     # a beat's mode (or, in a partial mode, keep) differs from the first beat's
    BAD_START = 3       # the first beat is not on the mode's first plane
    PLANE_ORDER = 4     # a plane change to anything but the mode's next plane (skipped,
    #                     repeated, backwards, or past the last plane)
    CHUNK_MISMATCH = 5  # a plane with a different number of chunks than the first plane
    MISSING_PLANE = 6   # `last` before the mode's last plane
    TOO_LONG = 7        # a plane with more than max_chunks(max_len, L) chunks


def check_beats(s: int, beats, *, max_len: int, lanes: int) -> SeqError:
    """The rule a PE enforces, on the metadata of one beat sequence.

    ``beats`` is a sequence of ``(plane, mode, keep)`` of the beats up to and
    including the one with ``last``. It is one dot product (``SeqError.OK``)
    exactly when it is the beats of one weight row in consumption order
    (``golden.layout.weight_beats``): for each plane of
    ``plane_range(s, mode, keep)``, increasing, all ``C`` chunks of the row,
    with the same ``C`` for every plane and ``1 <= C <= max_chunks(max_len,
    L)``; ``mode`` is the same on every beat, and so is ``keep`` unless the
    mode is FULL (which ignores it). Otherwise the first rule broken, in beat
    order, is returned. The accumulator (:func:`acc_width`) is sized for the
    longest accepted sequence, so an accepted dot product cannot overflow.
    """
    check_slice_bits(s)
    limit = max_chunks(max_len, lanes)
    beats = [(int(p), int(m), int(k)) for p, m, k in beats]
    if not beats:
        raise ValueError("A dot product has at least one beat")
    _, mode0, keep0 = beats[0]
    try:
        mode, keep = check_mode(s, mode0, keep0)
    except ValueError:
        return SeqError.BAD_KEEP
    planes = plane_range(s, mode, keep)
    cur, count, chunks = None, 0, None
    for plane, m, k in beats:
        if m != mode0 or (mode is not Mode.FULL and k != keep0):
            return SeqError.MODE_CHANGE
        if cur is None:
            if plane != planes.start:
                return SeqError.BAD_START
            cur, count = plane, 1
        elif plane == cur:
            count += 1
        elif plane == cur + 1 and plane < planes.stop:
            if chunks is None:
                chunks = count
            elif count != chunks:
                return SeqError.CHUNK_MISMATCH
            cur, count = plane, 1
        else:
            return SeqError.PLANE_ORDER
        if count > limit:
            return SeqError.TOO_LONG
        if chunks is not None and count > chunks:
            return SeqError.CHUNK_MISMATCH
    if cur != planes.stop - 1:
        return SeqError.MISSING_PLANE
    if chunks is not None and count != chunks:
        return SeqError.CHUNK_MISMATCH
    return SeqError.OK


def pe_result(s: int, beats, *, max_len: int, lanes: int, augment: bool = True):
    """The result a PE gives for one beat sequence: ``(value, error, reason)``.

    ``beats``: ``(act[L], slices[L], plane, mode, keep)`` per beat (``slices``
    as stored: the signed MSB slice as its ``s``-bit two's complement).
    ``value`` is ``None`` when ``error``. Otherwise it is the specification,
    :func:`dot` of the row: the activations of the first plane's chunks
    against the weights the given planes spell (planes outside the mode's
    range are zero, so MSB and DRAFT see ``truncate(w)``, LSB sees the low
    bits), in the beat's mode; ``augment=False`` (the plain bit-slice
    baseline) computes DRAFT as MSB truncation. The activations of chunk
    ``c`` must be the same on every plane (the caller's duty: the PE cannot
    check them).
    """
    n = n_planes(s)
    meta = [(b[2], b[3], b[4]) for b in beats]
    reason = check_beats(s, meta, max_len=max_len, lanes=lanes)
    if reason is not SeqError.OK:
        return None, 1, reason
    mode, keep = check_mode(s, beats[0][3], beats[0][4])
    pr = plane_range(s, mode, keep)
    chunks = len(beats) // len(pr)
    planes = np.zeros((n, chunks * lanes), dtype=np.int64)
    acts = []
    for i, (a, sl, p, _, _) in enumerate(beats):
        c = i % chunks
        v = np.asarray(sl, dtype=np.int64) & ((1 << s) - 1)
        if p == 0:
            v = np.where(v >= 1 << (s - 1), v - (1 << s), v)
        planes[p, c * lanes:(c + 1) * lanes] = v
        if p == pr.start:
            acts.append(np.asarray(a, dtype=np.int64))
    w = combine(planes, s)
    if not augment and mode is Mode.DRAFT:
        mode = Mode.MSB
    return int(dot(np.concatenate(acts), w, s, mode, keep)), 0, SeqError.OK


def mac_result(beats, *, max_len: int, lanes: int):
    """The INT8 MAC baseline's result for one beat sequence (``(act[L],
    weight[L])`` per beat): ``(sum(a * w), 0, OK)``, or ``(None, 1,
    TOO_LONG)`` beyond ``max_chunks(max_len, L)`` beats."""
    if len(beats) > max_chunks(max_len, lanes):
        return None, 1, SeqError.TOO_LONG
    a = np.concatenate([np.asarray(b[0], dtype=np.int64) for b in beats])
    w = _as_int8_values(np.concatenate([np.asarray(b[1]) for b in beats]))
    return int(np.sum(a * w)), 0, SeqError.OK
