"""Formal wrapper of the PE family (``pe``, ``pe_plain``, ``mac_int8``,
``bitfusion``): the stream rules on every port, the result-slot bound, and
the dot-product contract against an independent reference.

What is checked (BMC; the depth is given by the test):

* **stream rules** on ``i`` (assumed) and ``o`` (asserted), via
  :func:`~elmoe3d.tb.formal.common.stream_rules_all`;
* **no result is ever refused**: whenever the pipeline writes a result, the
  credit-managed buffer has room (a result slot was reserved for it);
* **one result per last beat, in order, equal to the reference**: every
  accepted beat updates a reference written differently from the RTL
  (per-plane beat counters instead of the RTL's first-plane count and
  comparisons; the dot product spelled out at the weight level,
  ``a * slice * 2^(s (n-1-q))`` plus ``2^(d-1) a`` for DRAFT, instead of the
  RTL's ``(s+1)``-bit fields and half-unit shifts); on every ``last`` it
  pushes the expected ``(value, error)`` into a shadow queue, and every
  output transfer must match the queue's head: ``error`` always, ``value``
  when there is no error, compared at a width of ``acc_width + 8`` bits, so
  an accumulator that overflowed on an accepted dot product fails.

The reference's rule: a beat sequence is one dot product iff its mode (and
keep, except in FULL) never changes, ``keep`` is valid, it starts on the
mode's first plane, every plane change goes to the next plane without leaving
the mode's planes, it ends on the last plane, every plane of the mode has
the same number of beats, and that number is at most ``max_chunks``.
"""

from __future__ import annotations

from amaranth.hdl import Assert, Assume, Cat, Const, Cover, Module, Mux, ResetSignal, Signal, signed
from amaranth.lib import wiring

from ...golden import bitfusion as gbf
from ...golden import bitslice as gbs
from ...hw.vocab import BitFusionMode, PEMode
from .common import stream_rules_all

__all__ = ["PEFamilyFormal"]


class PEFamilyFormal(wiring.Component):
    """Wraps one PE-family component (``dut``, possibly a planted-bug
    mutant) with the properties above. ``kind``: ``"bitslice"``, ``"int8"``
    or ``"bitfusion"``."""

    def __init__(self, *args, **kwargs):
        raise TypeError("use PEFamilyFormal.build")

    @classmethod
    def build(cls, dut, *, kind: str, values: bool = False):
        """``values=False``: errors, result count and order, stream rules,
        result slots (every operand free). ``values=True``: also the result
        values, with every operand restricted to its extremes (activations
        -128 and 127; slices, weights and nibbles their minimum, maximum and
        0), which include the largest sums of every mode: a general multiplier
        equivalence is beyond the solver at these depths, and what the check is
        for is that no accepted dot product overflows."""
        if kind not in ("bitslice", "int8", "bitfusion"):
            raise ValueError(f"kind must be bitslice, int8 or bitfusion, not {kind!r}")
        self = cls.__new__(cls)
        self.dut, self.kind, self.values = dut, kind, values
        wiring.Component.__init__(self, dut.signature)
        return self

    def _extremes(self, m, p):
        def one_of(v, choices):
            return sum(((v == c) for c in choices), Const(0)) != 0
        for j in range(len(p.act)):
            m.d.comb += Assume(one_of(p.act[j], (-128, 127)))
        if self.kind == "bitslice":
            s = self.dut.slice_bits
            for j in range(self.dut.lanes):
                m.d.comb += Assume(one_of(p.sv.slices[j],
                                          (0, 1 << (s - 1), (1 << (s - 1)) - 1, (1 << s) - 1)))
        elif self.kind == "int8":
            for j in range(self.dut.lanes):
                m.d.comb += Assume(one_of(p.weight[j], (-128, 127, 0)))
        else:
            for j in range(self.dut.lanes):
                m.d.comb += Assume(one_of(p.weight[j], (0x80, 0x7F, 0x88, 0x77, 0x00)))

    # -- the reference ----------------------------------------------------------------------
    def _contribution(self, m, p):
        """The beat's contribution to the dot product, at the weight level."""
        dut, L = self.dut, self.dut.lanes
        if self.kind == "int8":
            return sum((p.act[j] * p.weight[j] for j in range(L)), Const(0, signed(2)))
        if self.kind == "bitfusion":
            w8 = sum((p.act[j] * p.weight[j].as_signed() for j in range(L)), Const(0, signed(2)))
            w4 = sum((p.act[2 * j] * p.weight[j][:4].as_signed()
                      + p.act[2 * j + 1] * p.weight[j][4:].as_signed() for j in range(L)),
                     Const(0, signed(2)))
            return Mux(p.mode == BitFusionMode.W4, w4, w8)
        s, n = dut.slice_bits, dut.planes
        q = p.sv.plane
        total = Const(0, signed(2))
        for j in range(L):
            sl = p.sv.slices[j]
            v = Mux(q == 0, sl.as_signed(), Cat(sl, Const(0, 1)).as_signed())
            total = total + p.act[j] * v
        weighted = Const(0, signed(2))
        for qq in range(n):
            weighted = Mux(q == qq, total << (s * (n - 1 - qq)), weighted)
        if dut.augment:
            asum = sum((p.act[j] for j in range(L)), Const(0, signed(2)))
            aug = Const(0, signed(2))
            for k in range(1, n):
                d = s * (n - k)
                aug = Mux(p.keep == k, asum << (d - 1), aug)
            weighted = weighted + Mux((p.mode == PEMode.DRAFT) & (q + 1 == p.keep), aug, 0)
        return weighted

    def _rule(self, m, p, take, first, last):
        """Sticky ``bad`` of the dot product up to this beat (combinational,
        for the beat being accepted) and the reference's state updates."""
        dut = self.dut
        # the limits from the golden model, not from the design
        if self.kind in ("int8", "bitfusion"):
            limits = ((gbs.max_chunks(dut.max_len, dut.lanes),) if self.kind == "int8" else
                      tuple(gbf.max_beats(md, max_len=dut.max_len, lanes=dut.lanes)
                            for md in gbf.Mode))
            cnt = Signal(range(max(limits) + 2), name="ref_cnt")
            mode0 = Signal(name="ref_mode0")
            bad = Signal(name="ref_bad")
            mode = p.mode.as_value() if self.kind == "bitfusion" else Const(0)
            cnt_now = Mux(first, 1, Mux(cnt > max(limits), cnt, cnt + 1))
            limit = _lim(Mux(first, mode, mode0), limits)        # the dot product's mode
            mode_ok = first | (mode == mode0)
            bad_now = Mux(first, 0, bad) | ~mode_ok | (cnt_now > limit)
            with m.If(take):
                m.d.sync += [cnt.eq(cnt_now), bad.eq(bad_now)]
                with m.If(first):
                    m.d.sync += mode0.eq(mode)
            return bad_now
        n, maxc = dut.planes, gbs.max_chunks(dut.max_len, dut.lanes)
        cnts = [Signal(range(maxc + 3), name=f"ref_cnt{q}") for q in range(n)]
        prev = Signal.like(p.sv.plane, name="ref_prev")
        mode0 = Signal(PEMode, name="ref_mode0")
        keep0 = Signal.like(p.keep, name="ref_keep0")
        bad = Signal(name="ref_bad")
        q = p.sv.plane
        mode = Mux(first, p.mode, mode0)
        keep = Mux(first, p.keep, keep0)
        full = mode == PEMode.FULL
        lsb = mode == PEMode.LSB
        lo = Mux(lsb, keep, 0)
        hi = Mux(full | lsb, n - 1, keep - 1)
        keep_ok = full | ((keep >= 1) & (keep <= n - 1))
        same_mk = (p.mode == mode0) & (full | (p.keep == keep0))
        move_ok = (q == prev) | ((q == prev + 1) & (q <= hi))
        beat_bad = Mux(first, ~keep_ok | (q != lo), ~same_mk | ~move_ok)
        cnt_now = [Mux(first, Mux(q == k, 1, 0),
                       Mux((q == k) & (cnts[k] <= maxc + 1), cnts[k] + 1, cnts[k]))
                   for k, _ in enumerate(cnts)]
        over = Const(0)
        for k in range(n):
            over = over | (cnt_now[k] > maxc)
        # at the last beat: it is on the last plane, and every plane from lo to
        # hi has as many beats as plane lo
        unequal = Const(0)
        for k in range(n):
            for k0 in range(n):
                unequal = unequal | ((lo == k0) & (k0 <= k) & (k <= hi) & (cnt_now[k] != cnt_now[k0]))
        end_bad = last & ((q != hi) | unequal)
        bad_now = Mux(first, 0, bad) | beat_bad | over | end_bad
        with m.If(take):
            m.d.sync += [prev.eq(q), bad.eq(bad_now)] + [c.eq(v) for c, v in zip(cnts, cnt_now)]
            with m.If(first):
                m.d.sync += [mode0.eq(p.mode), keep0.eq(p.keep)]
        return bad_now

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        wiring.connect(m, wiring.flipped(self.i), dut.i)
        wiring.connect(m, dut.o, wiring.flipped(self.o))
        m.d.comb += Assume(~ResetSignal())
        stream_rules_all(m, self)

        # a written result always finds a free slot
        buf = dut.result_buffer
        with m.If(buf.i.valid):
            m.d.comb += Assert(buf.i.ready, "result buffer full when a result was written")

        # reference accumulator and rule, one step per accepted beat
        p = self.i.payload
        take = self.i.valid & self.i.ready
        if self.values:
            self._extremes(m, p)
        fresh = Signal(init=1, name="ref_fresh")
        W = gbs.acc_width(dut.max_len, dut.lanes) + 8
        acc = Signal(signed(W), name="ref_acc")
        acc_now = Signal(signed(W), name="ref_acc_now")
        if self.values:
            m.d.comb += acc_now.eq(Mux(fresh, 0, acc) + self._contribution(m, p))
        bad_now = self._rule(m, p, take, fresh, p.last)
        with m.If(take):
            m.d.sync += [acc.eq(acc_now), fresh.eq(p.last)]

        # shadow queue of expected results
        D = dut.depth + 1
        qv = [Signal(signed(W), name=f"sq_value{k}") for k in range(D)]
        qe = [Signal(name=f"sq_error{k}") for k in range(D)]
        cnt = Signal(range(D + 1), name="sq_count")
        put = take & p.last
        get = self.o.valid & self.o.ready
        with m.If(get):
            m.d.comb += Assert(cnt != 0, "a result without a dot product")
            m.d.comb += Assert(self.o.payload.error == qe[0], "error flag differs from the rule")
            if self.values:
                with m.If(~qe[0]):
                    m.d.comb += Assert(self.o.payload.value == qv[0],
                                       "value differs from the reference (or overflowed)")
        m.d.comb += Assert(cnt <= dut.depth, "more results outstanding than result slots")
        # shift out on get, append at position cnt (- 1 if a get happens too)
        pos = Mux(get, cnt - 1, cnt)
        for k in range(D):
            nxt_v = qv[k + 1] if k + 1 < D else qv[k]
            nxt_e = qe[k + 1] if k + 1 < D else qe[k]
            with m.If(put & (pos == k)):
                m.d.sync += [qv[k].eq(acc_now), qe[k].eq(bad_now)]
            with m.Elif(get):
                m.d.sync += [qv[k].eq(nxt_v), qe[k].eq(nxt_e)]
        m.d.sync += cnt.eq(cnt + put - get)
        m.d.comb += Cover(get & ~self.o.payload.error & (cnt == 1))
        return m


def _lim(mode, limits):
    out = Const(limits[0], range(max(limits) + 1))
    for k, b in enumerate(limits[1:], 1):
        out = Mux(mode == k, b, out)
    return out
