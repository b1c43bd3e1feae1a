"""Golden model of the HB bank controller (:class:`HBModel`, the
specification of :mod:`elmoe3d.hw.hb_bank`). The LPDDR expert image and the
stream engine's contract are in :mod:`elmoe3d.golden.layout` and
:mod:`elmoe3d.golden.ext_stream`.

HB contract
-----------
The address map is :mod:`elmoe3d.golden.layout`'s (every bank the same):
the dense region at ``[0, D)``, expert slot ``j`` at ``D + j*SW`` (``SW``
words), the KV region at the top ``[W - kv, W)`` growing downwards, ``kv``
being the boundary register (KV words per bank, ``0 <= kv <= W - D``). Slot
``j`` is *covered* when the KV region reaches into it
(:func:`~elmoe3d.golden.layout.slot_covered_mask`). A *region* is one of the
``S`` expert slots or the dense region; HB addresses a region by
``{region, slot, word offset}`` and never decodes the planes inside it.

* **Resident.** A region is resident from the cycle its fill's COMMIT takes
  effect until a later fill of it starts, or (a slot) the KV region covers it.
  A fill's first DATA beat makes the region non-resident (*pending*); ABORT
  leaves it so. A covered slot is never resident.
* **Reads** (``HBRead``): ``count`` words from ``offset`` of a region. A read
  of a resident region within its bounds returns the words the region held
  when the read started, which are the words of exactly one committed fill
  (no fill writes a region while a read of it is open). Any other read -- a
  region that is not resident (never filled, pending, aborted, covered or
  being covered by a pending move), ``count = 0``, a range past the region's
  end, a slot index ``>= S`` -- is *refused*: one beat with ``last`` and
  ``error``.
* **Fills** (``FillBeat``): a fill is DATA beats of one region followed by
  one COMMIT or ABORT of that region. DATA beats come in address order,
  bank fastest: an expert fill starts at offset 0, bank 0 and writes every
  word of the slot exactly once before its COMMIT; a dense fill starts at any
  offset (bank 0) and writes whole rows (every bank of each offset) of a
  contiguous range. A fill that breaks these
  rules (a beat out of order or out of range, a bank not a multiple of
  ``fill_words``, another region, an unknown kind, COMMIT before the last
  word) is MALFORMED: nothing more of it is written and its COMMIT does not
  make the region resident. A fill that starts while its slot is being read
  is refused (BUSY), one that starts on a covered slot, or on a slot a
  pending KV move will cover, is refused (COVERED): nothing of it is written,
  and the refusal is what its end reports, whatever its later beats do.
  COMMIT/ABORT with no fill open is STRAY and ignored. Every fill's end is
  reported (``FillDone``); only COMMITTED makes the region resident. A fill
  never writes the KV region, and only a DENSE fill writes the dense region.
* **KV accesses** (``KVAccess``) address a bank word; one outside
  ``[W - kv, W)`` (or a bank ``>= B``) is refused with ``error`` and changes
  nothing. A KV access never touches a slot or the dense region.
* **Boundary moves** set ``kv``: the newly covered slots lose their valid
  bit (the ``KVMove`` report names them, and which were resident); uncovered
  slots come back non-resident. A move beyond ``W - D`` is refused
  (``error``, nothing changes). HB applies a move only when no slot whose
  coverage it changes is being read or filled and no KV access is in flight;
  KV accesses and moves take effect in acceptance order.

:class:`HBModel` is the sequential form of these rules (what happens when
events take effect in a given order); *when* an event takes effect is the
RTL's choice within the rules above, so the testbench checks every read
against the versions a region held while the read was open, and every fill
result against the reasons it may have.

Everything here is plain Python / NumPy with explicit integer types.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import bitslice as gbs
from . import layout as L
from .vocab import FillKind, FillResult, HBRegion

__all__ = ["HBModel", "FillParser", "FillStart", "FillEnd", "FillResult", "HBRegion",
           "FillKind", "axi_beat_words", "hb_planes_for", "AXI_4K"]

AXI_4K = 4096


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


# ---------------------------------------------------------------------------
# HB: regions, the fill parser and the sequential model
# ---------------------------------------------------------------------------

def _region_index(cfg, kind, slot) -> int | None:
    """Region index: ``slot`` for an expert slot (``None`` when ``slot >= S``),
    ``S`` for the dense region."""
    if HBRegion(kind) is HBRegion.DENSE:
        return cfg.tag_slots
    return int(slot) if 0 <= slot < cfg.tag_slots else None


def _region_span(cfg, index: int) -> tuple[int, int]:
    """``(base, size)`` in bank words of a region index."""
    if index == cfg.tag_slots:
        return 0, cfg.dense_words
    return cfg.expert_base + index * cfg.slot_words, cfg.slot_words


@dataclass(frozen=True)
class FillStart:
    """A fill's first DATA beat (it makes its region pending)."""
    region: int | None
    kind: HBRegion
    slot: int


@dataclass(frozen=True)
class FillEnd:
    """A fill's COMMIT/ABORT as the fill rules judge it from the beats alone.

    ``predicted`` is COMMITTED (well formed and complete), ABORTED, MALFORMED
    or STRAY; ``writes`` the ``(bank, addr, word)`` of its well-formed prefix
    (what HB writes unless it refuses the whole fill)."""
    region: int | None
    kind: HBRegion
    slot: int
    predicted: FillResult
    writes: tuple
    data_beats: int

    def allowed(self, slots: int) -> frozenset:
        """Results HB may report for this fill: the prediction, or a refusal
        (BUSY; COVERED for an expert slot) -- a refusal is decided at the
        fill's start and wins over what the later beats say, because it
        means nothing of the fill was written."""
        if self.predicted is FillResult.STRAY or self.region is None:
            return frozenset({self.predicted})
        out = {self.predicted, FillResult.BUSY}
        if self.region < slots:
            out.add(FillResult.COVERED)
        return frozenset(out)


class FillParser:
    """The stream-local half of the fill rules: turns fill beats (dicts
    with ``kind``, ``region``, ``slot``, ``offset``, ``bank``, ``words``) into
    :class:`FillStart` / :class:`FillEnd` events. It depends on nothing but
    the beats, so the testbench runs it at acceptance time."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.open = None

    def beat(self, b: dict):
        cfg = self.cfg
        B, FW = cfg.pes, cfg.fill_words
        kind, slot, off, bank = int(b["kind"]), int(b["slot"]), int(b["offset"]), int(b["bank"])
        rk = HBRegion(int(b["region"]))
        r = _region_index(cfg, rk, slot)
        if kind in (FillKind.COMMIT, FillKind.ABORT):
            o, self.open = self.open, None
            if o is None:
                return FillEnd(r, rk, slot, FillResult.STRAY, (), 0)
            if kind == FillKind.ABORT:
                pred = FillResult.ABORTED
            elif o["good"] and o["complete"] and r == o["region"]:
                pred = FillResult.COMMITTED
            else:
                pred = FillResult.MALFORMED
            return FillEnd(o["region"], o["kind"], o["slot"], pred, tuple(o["writes"]),
                           o["beats"])
        # DATA (a beat of an unknown kind is a malformed DATA beat)
        size = _region_span(cfg, r)[1] if r is not None else 0
        in_range = (kind == FillKind.DATA and r is not None and off < size and bank < B
                    and bank % FW == 0)
        start = None
        if self.open is None:
            first_ok = bank == 0 and (off == 0 or rk is HBRegion.DENSE)
            self.open = {"region": r, "kind": rk, "slot": slot, "good": in_range and first_ok,
                         "next": None, "complete": False, "writes": [], "beats": 0}
            start = FillStart(r, rk, slot)
        else:
            o = self.open
            o["good"] = o["good"] and in_range and r == o["region"] and (off, bank) == o["next"]
        o = self.open
        o["beats"] += 1
        if o["good"]:
            base = _region_span(cfg, r)[0]
            o["writes"].extend((bank + i, base + off, int(w)) for i, w in enumerate(b["words"]))
            nb, no = bank + FW, off
            if nb == B:
                nb, no = 0, off + 1
            o["next"] = (no, nb)
            o["complete"] = no == size if rk is HBRegion.EXPERT else nb == 0
        return start


@dataclass
class HBModel:
    """HB contents, resident regions and the KV boundary (sequential rules).

    Parameters
    ----------
    cfg : Config
        The geometry (``golden/layout.py``'s HB map).

    Members
    -------
    mem : ndarray ``(B, W)`` of Python ints
        Bank words.
    valid : int
        Resident expert slots (bit ``j``); ``dense_valid`` the dense region.
    kv_words : int
        The boundary register (KV words per bank).
    """
    cfg: object
    mem: np.ndarray = field(init=False)
    valid: int = 0
    dense_valid: bool = False
    kv_words: int = 0

    def __post_init__(self):
        c = self.cfg
        self.mem = np.zeros((c.pes, c.hb_words), dtype=object)
        self._parser = FillParser(c)
        self._covered_at_start = False

    # -- state ----------------------------------------------------------------
    @property
    def covered(self) -> int:
        """Slots covered by the KV region."""
        return L.slot_covered_mask(self.cfg, self.kv_words)

    def resident(self, region: int) -> bool:
        """Whether region index ``region`` (slot, or ``S`` = dense) is resident."""
        if region == self.cfg.tag_slots:
            return self.dense_valid
        return bool((self.valid >> region) & 1)

    def region_index(self, kind, slot) -> int | None:
        return _region_index(self.cfg, kind, slot)

    def region_words(self, region: int) -> np.ndarray:
        """``(B, size)`` copy of a region's words."""
        base, size = _region_span(self.cfg, region)
        return self.mem[:, base:base + size].copy()

    def _set_valid(self, region, value: bool):
        if region is None:
            return
        if region == self.cfg.tag_slots:
            self.dense_valid = value
        elif value:
            self.valid |= 1 << region
        else:
            self.valid &= ~(1 << region)

    # -- reads ----------------------------------------------------------------
    def read_in_range(self, kind, slot, offset, count) -> bool:
        r = self.region_index(kind, slot)
        return r is not None and count >= 1 and offset + count <= _region_span(self.cfg, r)[1]

    def read_ok(self, kind, slot, offset, count) -> bool:
        """Whether a read starting now succeeds (in range and resident)."""
        return self.read_in_range(kind, slot, offset, count) and \
            self.resident(self.region_index(kind, slot))

    def read(self, bank, kind, slot, offset, count, plane=0) -> list[dict]:
        """The beats of a read that starts now: ``word``, ``plane``, ``last``,
        ``error`` each; a refused read is one beat ``{0, 0, 1, 1}``."""
        if not self.read_ok(kind, slot, offset, count):
            return [{"word": 0, "plane": 0, "last": 1, "error": 1}]
        base = _region_span(self.cfg, self.region_index(kind, slot))[0]
        return [{"word": int(self.mem[bank, base + offset + i]), "plane": int(plane),
                 "last": int(i == count - 1), "error": 0} for i in range(count)]

    # -- fills ------------------------------------------------------------------
    def start_fill(self, start: FillStart):
        """Effect of a fill's first DATA beat: its region is pending."""
        self._set_valid(start.region, False)

    def end_fill(self, end: FillEnd, result) -> FillResult:
        """Effect of a fill's end with the ``result`` HB reported; ``ValueError``
        when the rules do not allow that result for this fill."""
        result = FillResult(result)
        if result not in end.allowed(self.cfg.tag_slots):
            raise ValueError(f"Fill of {end.kind.name} slot {end.slot} cannot end {result.name}; "
                             f"the rules allow {sorted(x.name for x in end.allowed(self.cfg.tag_slots))}")
        if result in (FillResult.STRAY, FillResult.BUSY, FillResult.COVERED):
            return result
        for bank, addr, w in end.writes:
            self.mem[bank, addr] = w
        if result is FillResult.COMMITTED:
            self._set_valid(end.region, True)
        return result

    def apply_fill(self, beat: dict) -> FillResult | None:
        """One fill beat, taking effect now (no read is open: BUSY never
        happens here; COVERED when the slot is covered at the fill's start).
        Returns the result on the fill's COMMIT/ABORT, else ``None``."""
        ev = self._parser.beat(beat)
        if isinstance(ev, FillStart):
            r = ev.region
            self._covered_at_start = r is not None and r < self.cfg.tag_slots and \
                bool((self.covered >> r) & 1)
            self.start_fill(ev)
            return None
        if isinstance(ev, FillEnd):
            res = ev.predicted
            if res is not FillResult.STRAY and self._covered_at_start:
                res = FillResult.COVERED
            return self.end_fill(ev, res)
        return None

    # -- KV region and the boundary ------------------------------------------
    def kv_in_range(self, bank, addr) -> bool:
        c = self.cfg
        return 0 <= bank < c.pes and c.hb_words - self.kv_words <= addr < c.hb_words

    def kv(self, write: bool, bank: int, addr: int, data: int = 0) -> tuple[int, int]:
        """One KV access; ``(data, error)``. Outside the KV region it is
        refused: error 1, data 0, nothing written."""
        if not self.kv_in_range(bank, addr):
            return 0, 1
        if write:
            self.mem[bank, addr] = int(data)
            return 0, 0
        return int(self.mem[bank, addr]), 0

    def move(self, kv_words: int) -> tuple[int, int, int]:
        """Boundary move to ``kv_words``: ``(newly covered, invalidated,
        error)``; beyond ``W - D`` it is refused (``(0, 0, 1)``, nothing changes)."""
        if not 0 <= kv_words <= L.kv_limit(self.cfg):
            return 0, 0, 1
        new = L.slot_covered_mask(self.cfg, kv_words)
        newly = new & ~self.covered
        inval = newly & self.valid
        self.valid &= ~newly
        self.kv_words = int(kv_words)
        return newly, inval, 0

    def changed_by(self, kv_words: int) -> int:
        """Slots whose coverage a move to ``kv_words`` changes (either way)."""
        if not 0 <= kv_words <= L.kv_limit(self.cfg):
            return 0
        return L.slot_covered_mask(self.cfg, kv_words) ^ self.covered
