"""Golden model of the HB address map, the HB bank contents and the
external-memory (LPDDR) expert layout: the specification of
:mod:`elmoe3d.hw.hb_bank` and :mod:`elmoe3d.hw.ext_stream`.

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

LPDDR expert layout
-------------------
An expert is ``n = 8 // s`` planes of ``rows x B`` slice vectors, stored
contiguously from its base address in ``{plane, row, bank}`` order (bank
fastest): word ``i = (plane * rows + row) * B + bank`` at byte
``base + i * sv_bytes``. One AXI beat of ``D`` bits carries
``fill_words = D / sv`` consecutive words, which therefore share ``plane`` and
``row`` and go to banks ``bank0 .. bank0 + fill_words - 1`` (this needs
``B % fill_words == 0``). A read command names the planes the PEs want (a
bit mask) and whether the expert's ``k`` MSB planes are to be cached in a slot;
the engine reads the union once and sends each beat to the PE stream, the HB
fill stream, or both.

Everything here is plain Python / NumPy with explicit integer types.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from . import bitslice as gbs

__all__ = ["HBMap", "HBModel", "ExpertLayout", "FillKind", "bursts", "split_command",
           "axi_beat_words", "hb_planes_for", "AXI_4K"]

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


# ---------------------------------------------------------------------------
# LPDDR layout and the stream engine's split
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ExpertLayout:
    """Where an expert's slices live in LPDDR and how one AXI read of it is
    cut into bursts and beats.

    Parameters
    ----------
    slice_bits, lanes, banks, rows, hb_planes : int
        ``s``, ``L``, ``B``, rows per plane per bank, and ``k`` MSB planes
        cached in HB.
    data_bits : int
        AXI data width; ``fill_words = data_bits // (L * s)`` must divide ``B``.
    max_burst : int
        Longest INCR burst in beats (1..256).
    """
    slice_bits: int
    lanes: int
    banks: int
    rows: int
    hb_planes: int
    data_bits: int
    max_burst: int = 16

    def __post_init__(self):
        gbs.check_slice_bits(self.slice_bits)
        _check_int("Lane count", self.lanes, 1, 1024)
        _check_int("Bank count", self.banks, 1, 1024)
        _check_int("Rows per plane", self.rows, 1)
        _check_int("HB planes", self.hb_planes, 1, self.planes)
        _check_int("AXI data width", self.data_bits, 8, 1024)
        _check_int("Maximum burst length", self.max_burst, 1, 256)
        if self.data_bits & (self.data_bits - 1):
            raise ValueError(f"AXI data width must be a power of two, not {self.data_bits!r}")
        if self.data_bits % self.sv_bits or self.banks % (self.data_bits // self.sv_bits):
            raise ValueError(
                f"AXI data width {self.data_bits!r} must be a multiple of the {self.sv_bits}-bit "
                f"slice vector whose word count divides the {self.banks} banks")

    @property
    def planes(self) -> int:
        return gbs.n_planes(self.slice_bits)

    @property
    def sv_bits(self) -> int:
        return self.lanes * self.slice_bits

    @property
    def fill_words(self) -> int:
        return self.data_bits // self.sv_bits

    @property
    def beat_bytes(self) -> int:
        return self.data_bits // 8

    @property
    def plane_beats(self) -> int:
        return self.rows * self.banks // self.fill_words

    @property
    def plane_bytes(self) -> int:
        return self.plane_beats * self.beat_bytes

    @property
    def expert_bytes(self) -> int:
        return self.planes * self.plane_bytes

    def msb_mask(self) -> int:
        return (1 << self.hb_planes) - 1

    def read_mask(self, planes: int, fill: bool) -> int:
        """Planes the engine reads: those wanted by the PEs, plus the MSB
        planes when the expert is being cached."""
        return (planes | (self.msb_mask() if fill else 0)) & ((1 << self.planes) - 1)

    def expert_bytes_of(self, weights_planes: np.ndarray) -> bytes:
        """LPDDR image of an expert from its slice words, shape
        ``(planes, rows, banks)`` of ``sv_bits``-bit unsigned integers."""
        w = np.asarray(weights_planes, dtype=object)
        if w.shape != (self.planes, self.rows, self.banks):
            raise ValueError(f"expert words must have shape "
                             f"{(self.planes, self.rows, self.banks)}, not {w.shape!r}")
        out = 0
        flat = [int(x) for x in w.reshape(-1)]
        for i, x in enumerate(flat):
            out |= (x & ((1 << self.sv_bits) - 1)) << (i * self.sv_bits)
        return out.to_bytes(self.expert_bytes, "little")

    def pack_weights(self, w_int8: np.ndarray) -> np.ndarray:
        """Slice words ``(planes, rows, banks)`` of an INT8 weight block of
        ``rows * banks * lanes`` weights (row-major ``(rows, banks, lanes)``:
        bank ``b`` of row ``r`` holds lanes ``[(r*B + b)*L, ...)``)."""
        w = np.asarray(w_int8).reshape(self.rows, self.banks, self.lanes)
        planes = gbs.split(w, self.slice_bits)          # (n, rows, banks, lanes)
        mask = (1 << self.slice_bits) - 1
        out = np.zeros((self.planes, self.rows, self.banks), dtype=object)
        for lane in range(self.lanes):
            field = (planes[..., lane].astype(np.int64) & mask).astype(object)
            out += field << (lane * self.slice_bits)
        return out


def bursts(lay: ExpertLayout, base: int, planes: int, fill: bool) -> list[dict]:
    """The AXI read bursts (in issue order) for one command: per read plane,
    INCR bursts of at most ``max_burst`` beats that never cross a 4 KiB
    boundary. Each item: ``addr``, ``len`` (beats), ``plane``, ``beat0``
    (first beat's index within the plane)."""
    base = base - base % lay.beat_bytes
    out = []
    mask = lay.read_mask(planes, fill)
    for p in range(lay.planes):
        if not (mask >> p) & 1:
            continue
        beat = 0
        while beat < lay.plane_beats:
            addr = base + p * lay.plane_bytes + beat * lay.beat_bytes
            to_4k = (AXI_4K - addr % AXI_4K) // lay.beat_bytes
            n = min(lay.max_burst, lay.plane_beats - beat, to_4k)
            out.append({"addr": addr, "len": n, "plane": p, "beat0": beat})
            beat += n
    return out


def split_command(lay: ExpertLayout, mem: bytes | bytearray, cmd: dict,
                  error_beat: int | None = None) -> tuple[list[dict], list[dict], dict]:
    """Golden split of one engine command into PE beats, HB fill beats and
    the response.

    ``cmd``: ``addr`` (byte address; low bits below one beat are ignored),
    ``planes`` (mask of planes for the PE stream), ``fill`` (cache the MSB
    planes), ``slot``, ``id``. ``error_beat``: index (in read order, over all
    beats of the command) of the first beat that came back with SLVERR or
    DECERR, or ``None``.

    Returns ``(pe_beats, fill_beats, response)``. Every beat before the first
    error beat is delivered; nothing from the erroring beat on. A fill ends
    with a COMMIT beat, or an ABORT beat when the command failed; the response
    is ``{"id", "ok", "resident", "slot"}`` with ``resident = fill and ok``.
    PE beats carry ``last`` on the final beat of the highest wanted plane
    (never on a failed command's truncated stream)."""
    planes, fill, slot = cmd["planes"], bool(cmd["fill"]), cmd["slot"]
    wmask = (1 << lay.sv_bits) - 1
    pe, fl = [], []
    top_pe = planes.bit_length() - 1 if planes else -1
    idx = 0
    failed = False
    for b in bursts(lay, cmd["addr"], planes, fill):
        for j in range(b["len"]):
            if error_beat is not None and idx >= error_beat:
                failed = True
                break
            beat = b["beat0"] + j
            addr = b["addr"] + j * lay.beat_bytes
            raw = int.from_bytes(mem[addr:addr + lay.beat_bytes], "little")
            words = [(raw >> (i * lay.sv_bits)) & wmask for i in range(lay.fill_words)]
            row, bank0 = divmod(beat * lay.fill_words, lay.banks)
            p = b["plane"]
            if (planes >> p) & 1:
                pe.append({"data": words, "plane": p, "row": row, "bank": bank0, "id": cmd["id"],
                           "last": int(p == top_pe and beat == lay.plane_beats - 1)})
            if fill and p < lay.hb_planes:
                fl.append({"kind": int(FillKind.DATA), "slot": slot, "plane": p, "row": row,
                           "bank": bank0, "data": list(words)})
            idx += 1
        if failed:
            break
    if error_beat is not None and idx >= error_beat:
        failed = True
    if fill:
        fl.append({"kind": int(FillKind.ABORT if failed else FillKind.COMMIT), "slot": slot,
                   "plane": 0, "row": 0, "bank": 0, "data": [0] * lay.fill_words})
    rsp = {"id": cmd["id"], "ok": int(not failed), "resident": int(fill and not failed),
           "slot": slot}
    return pe, fl, rsp
