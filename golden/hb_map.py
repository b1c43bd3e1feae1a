"""Golden model of the HB address map and the HB bank contents: the
specification of :mod:`elmoe3d.hw.hb_bank`.

HB address map (every bank the same)
------------------------------------
Each of the ``B`` banks holds ``W`` words; a word is one slice vector
(``L`` slices of ``s`` bits, lane 0 in the low bits). A bank is split by the
*boundary* register ``b`` (in words, ``0 <= b <= W``)::

    word 0 ........ b-1 | b ................................. W-1
    KV-cache region     | expert region
                        ^ boundary

The expert region is addressed ``{slot, plane, row}``: slot ``j`` (an index of
the tag unit, ``0 <= j < S``) owns the ``slot_words = W // S`` words starting
at ``j * slot_words``; inside it the ``k`` cached MSB planes of one expert are
stored contiguously, plane after plane, ``rows`` words each
(``rows = slot_words // k``)::

    addr(slot, plane, row) = slot * slot_words + plane * rows + row

Bank ``b`` holds the rows of the expert that its paired PE consumes (see the
LPDDR layout below), so all ``B`` banks hold the same ``{slot, plane, row}``
coordinates of one expert. The KV region grows from word 0 upwards, so it
covers slots from slot 0 upwards: slot ``j`` is *covered* (unusable as a cache
slot) when any of its words lies below the boundary, i.e.
``j * slot_words < b``. Moving the boundary up invalidates exactly the newly
covered slots; moving it down uncovers slots, which come back empty (invalid).

The LPDDR expert image and the stream engine's contract moved to
:mod:`elmoe3d.golden.layout` and :mod:`elmoe3d.golden.ext_stream`.

Everything here is plain Python / NumPy with explicit integer types.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from . import bitslice as gbs

__all__ = ["HBMap", "HBModel", "FillKind", "axi_beat_words", "hb_planes_for", "AXI_4K"]

AXI_4K = 4096


class FillKind(enum.IntEnum):
    """Kind of one HB fill beat (the hardware encoding)."""
    DATA = 0      # words to write at {slot, plane, row} of banks bank0 ..
    COMMIT = 1    # the fill of `slot` is complete: the slot becomes resident
    ABORT = 2     # the fill of `slot` failed: the slot stays invalid


def _check_int(name, value, lo, hi=None):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, not {value!r}")
    if value < lo or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise ValueError(f"{name} must be {rng}, not {value!r}")
    return int(value)


def hb_planes_for(slice_bits: int) -> int:
    """Planes of an expert that HB caches: the MSB half (``k = max(1, n // 2)``:
    the 4-bit MSB draft of an INT8 weight for every slice width)."""
    return max(1, gbs.n_planes(slice_bits) // 2)


def axi_beat_words(axi_data_bits: int, sv_bits: int, banks: int) -> tuple[int, int]:
    """``(data_bits, fill_words)`` of the AXI port for a configuration.

    ``fill_words = data_bits // sv_bits`` slice vectors per beat, which must
    divide ``banks`` so one beat stays within one row of banks. When the
    configured width does not allow that, the width is adjusted: halved until
    ``fill_words`` divides ``banks``, or raised to one slice vector (if that is
    a power of two). ``ValueError`` naming the values when impossible."""
    d = axi_data_bits
    if sv_bits > d:
        d = sv_bits
    if d % sv_bits or d & (d - 1):
        raise ValueError(f"AXI data width {axi_data_bits!r} cannot carry whole {sv_bits}-bit "
                         f"slice vectors as a power-of-two bus width")
    w = d // sv_bits
    while w > 1 and banks % w:
        w //= 2
    return w * sv_bits, w


@dataclass(frozen=True)
class HBMap:
    """The HB address map (see the module docstring).

    Parameters
    ----------
    banks, words, slots : int
        ``B``, words per bank ``W`` (power of two), tag-unit slots ``S``.
    planes : int
        ``k``, MSB planes of one expert held per slot.
    sv_bits : int
        Bits of one word (slice vector).
    """
    banks: int
    words: int
    slots: int
    planes: int
    sv_bits: int

    def __post_init__(self):
        _check_int("HB bank count", self.banks, 1, 1024)
        _check_int("HB words per bank", self.words, 2)
        if self.words & (self.words - 1):
            raise ValueError(f"HB words per bank must be a power of two, not {self.words!r}")
        _check_int("HB slot count", self.slots, 1, self.words)
        _check_int("HB planes per slot", self.planes, 1, 8)
        _check_int("Slice-vector width", self.sv_bits, 1)
        if self.words % self.slots:
            raise ValueError(f"HB slot count {self.slots!r} must divide the bank's "
                             f"{self.words} words")
        if self.slot_words % self.planes:
            raise ValueError(f"HB planes per slot {self.planes!r} must divide the "
                             f"{self.slot_words} words of a slot")

    @property
    def slot_words(self) -> int:
        return self.words // self.slots

    @property
    def rows(self) -> int:
        """Words of one plane of one expert in one bank."""
        return self.slot_words // self.planes

    def slot_base(self, slot: int) -> int:
        return slot * self.slot_words

    def addr(self, slot: int, plane: int, row: int) -> int:
        """Bank word address of ``{slot, plane, row}``."""
        if not (0 <= slot < self.slots and 0 <= plane < self.planes and 0 <= row < self.rows):
            raise ValueError(f"{{slot, plane, row}} = {(slot, plane, row)!r} outside the map")
        return slot * self.slot_words + plane * self.rows + row

    def decode(self, addr: int) -> tuple[int, int, int]:
        """Inverse of :meth:`addr` (for an expert-region word)."""
        slot, off = divmod(addr, self.slot_words)
        plane, row = divmod(off, self.rows)
        return slot, plane, row

    def covered(self, boundary: int) -> int:
        """Bit mask of the slots that a KV region of ``boundary`` words covers."""
        _check_int("HB boundary", boundary, 0, self.words)
        mask = 0
        for j in range(self.slots):
            if j * self.slot_words < boundary:
                mask |= 1 << j
        return mask


@dataclass
class HBModel:
    """Bank contents, slot valid bits and boundary after a sequence of events.

    Events are applied in the order the controller accepts them (ties in one
    cycle: boundary move, KV access, PE read command, fill beat; see
    :mod:`elmoe3d.hw.hb_bank`). The controller's ordering rule makes this
    exact: a read command snapshots its words at acceptance, because no write
    can touch the slot it reads until it finishes.
    """
    map: HBMap
    mem: np.ndarray = field(init=False)
    valid: int = 0
    boundary: int = 0
    open_fill: dict = field(default_factory=dict)

    def __post_init__(self):
        self.mem = np.zeros((self.map.banks, self.map.words), dtype=object)

    # -- events -------------------------------------------------------------
    def fill(self, kind, slot, plane=0, row=0, bank0=0, words=()):
        """One fill beat. DATA beats write unless the slot is covered by the
        KV region (then they are consumed without writing: KV data is never
        overwritten); every beat invalidates the slot; COMMIT makes it
        resident (if not covered), ABORT leaves it invalid."""
        kind = FillKind(kind)
        m = self.map
        self.valid &= ~(1 << slot)
        covered = (m.covered(self.boundary) >> slot) & 1
        if kind is FillKind.DATA:
            if not covered:
                a = m.addr(slot, plane, row)
                for i, w in enumerate(words):
                    self.mem[bank0 + i, a] = int(w)
        elif kind is FillKind.COMMIT and not covered:
            self.valid |= 1 << slot

    def kv(self, write: bool, bank: int, addr: int, data: int = 0) -> tuple[int, int]:
        """One KV access; ``(data, error)``. Outside the KV region (``addr >=
        boundary``) it is refused: error 1, data 0, nothing written."""
        if addr >= self.boundary:
            return 0, 1
        if write:
            self.mem[bank, addr] = int(data)
            return 0, 0
        return int(self.mem[bank, addr]), 0

    def move_boundary(self, new: int) -> tuple[int, int]:
        """``(covered, invalidated)`` masks: slots newly covered by the move,
        and those of them that were resident (their valid bit is cleared)."""
        m = self.map
        newly = m.covered(new) & ~m.covered(self.boundary)
        inval = newly & self.valid
        self.valid &= ~newly
        self.boundary = new
        return newly, inval

    def read(self, bank: int, slot: int, plane: int, length: int) -> list[dict]:
        """Beats of one PE read command: ``length + 1`` words from
        ``{slot, plane, 0}``. A command reaching past the slot, or of a slot
        covered by the KV region, returns that many beats with ``error = 1``
        and zero data, plane and row."""
        m = self.map
        n = length + 1
        bad = (plane * m.rows + n > m.slot_words or plane >= m.planes
               or (m.covered(self.boundary) >> slot) & 1)
        out = []
        for i in range(n):
            if bad:
                out.append({"data": 0, "plane": 0, "row": 0, "last": int(i == n - 1), "error": 1})
                continue
            off = plane * m.rows + i
            p, r = divmod(off, m.rows)
            out.append({"data": int(self.mem[bank, m.slot_base(slot) + off]), "plane": p,
                        "row": r, "last": int(i == n - 1), "error": 0})
        return out

    def slot_words_of(self, slot: int) -> np.ndarray:
        """``(banks, slot_words)`` contents of a slot."""
        b = self.map.slot_base(slot)
        return self.mem[:, b:b + self.map.slot_words].copy()
