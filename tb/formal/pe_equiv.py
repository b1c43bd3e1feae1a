"""Formal equivalence of the augmented bit-slice PE against the INT8 MAC
baseline (issue 14, item 4), on a small instance, for every operand value.

The wrapper holds one augmented :class:`~elmoe3d.hw.pe.BitSlicePE` and one
:class:`~elmoe3d.hw.pe.Int8MacVector` of the same ``L`` lanes and
``max_len = C * L``. Its operands are solver-chosen constants
(``AnyConst``): ``C`` chunks of ``L`` INT8 activations and ``L`` INT8
weights, and the kept-plane count ``keep`` (``1 .. n-1``). A sequencer feeds,
back to back, with both ``o`` always ready:

* the PE three dot products of the same weight row, each in the
  consumption order of ``golden.layout.weight_beats`` (for each plane, all
  ``C`` chunks), the slices cut from the weights' bits:

  1. FULL (all ``n`` planes);
  2. MSB-partial (planes ``0 .. keep-1``);
  3. LSB-partial (planes ``keep .. n-1``);

* the MAC one dot product of the same activations and whole weights.

When all four results are in, it asserts that none has ``error`` set, that
``FULL == MAC`` (so the PE's FULL mode and the INT8 MAC compute the same
function, ``sum(a * w)``, at every operand value of the instance), and that
``MSB + LSB == FULL`` (at one more bit, so a wrap cannot hide a difference).
A bound assertion makes every result arrive by a fixed cycle, so the check
cannot pass by never getting there. BMC to that cycle explores every operand
value (they are constants of the trace, chosen freely), so the bounded check
is a complete proof for this instance and this sequence.
"""

from __future__ import annotations

from amaranth.asserts import AnyConst
from amaranth.hdl import (Assert, Assume, Cover, Elaboratable, Module, Mux, ResetSignal, Signal,
                          signed)

from ...golden import bitslice as gbs
from ...hw.vocab import PEMode

__all__ = ["PEEquivalence"]


class PEEquivalence(Elaboratable):
    """``pe``: an augmented (or mutant) bit-slice PE; ``mac``: an INT8 MAC
    vector with the same ``lanes`` and ``max_len``. Attribute :attr:`bound`:
    the cycle by which every result must have arrived (BMC depth ``bound +
    1`` checks everything)."""

    def __init__(self, pe, mac):
        if pe.lanes != mac.lanes or pe.max_len != mac.max_len:
            raise ValueError(f"PE and MAC differ: lanes {pe.lanes}/{mac.lanes}, "
                             f"max_len {pe.max_len}/{mac.max_len}")
        self.pe, self.mac = pe, mac
        self.L, self.s, self.n = pe.lanes, pe.slice_bits, pe.planes
        self.C = pe.max_chunks
        if self.n < 2:
            raise ValueError("the partial modes need at least two planes")
        beats = 2 * self.n * self.C
        self.bound = beats + pe.latency + 4

    def elaborate(self, platform):
        m = Module()
        m.submodules.pe = pe = self.pe
        m.submodules.mac = mac = self.mac
        L, s, n, C = self.L, self.s, self.n, self.C
        m.d.comb += Assume(~ResetSignal())

        act = [[Signal(signed(8), name=f"act{c}_{j}") for j in range(L)] for c in range(C)]
        wgt = [[Signal(signed(8), name=f"w{c}_{j}") for j in range(L)] for c in range(C)]
        for c in range(C):
            for j in range(L):
                m.d.comb += [act[c][j].eq(AnyConst(signed(8))), wgt[c][j].eq(AnyConst(signed(8)))]
        keep = Signal(range(n), name="keep")
        m.d.comb += keep.eq(AnyConst(range(n)))
        m.d.comb += Assume((keep >= 1) & (keep <= n - 1))

        # ---- PE: FULL, then MSB (planes < keep), then LSB (planes >= keep) ----
        nbeats = 2 * n * C
        ps = Signal(range(nbeats + 1), name="pe_step")
        p = pe.i.payload
        m.d.comb += pe.i.valid.eq(ps < nbeats)
        with m.If(pe.i.valid & pe.i.ready):
            m.d.sync += ps.eq(ps + 1)
        with m.Switch(ps):
            for k in range(nbeats):
                second, jj = divmod(k, n * C)
                q, c = divmod(jj, C)
                lo = s * (n - 1 - q)
                with m.Case(k):
                    for j in range(L):
                        m.d.comb += [p.act[j].eq(act[c][j]),
                                     p.sv.slices[j].eq(wgt[c][j].as_unsigned()[lo:lo + s])]
                    m.d.comb += [p.sv.plane.eq(q), p.keep.eq(keep)]
                    if not second:
                        m.d.comb += [p.mode.eq(PEMode.FULL), p.last.eq(q == n - 1 and c == C - 1)]
                    else:
                        m.d.comb += p.mode.eq(Mux(q < keep, PEMode.MSB, PEMode.LSB))
                        if c == C - 1:
                            m.d.comb += p.last.eq((q == keep - 1) | (q == n - 1))

        # ---- MAC: one dot product of the same operands ----
        ms = Signal(range(C + 1), name="mac_step")
        mp = mac.i.payload
        m.d.comb += mac.i.valid.eq(ms < C)
        with m.If(mac.i.valid & mac.i.ready):
            m.d.sync += ms.eq(ms + 1)
        with m.Switch(ms):
            for c in range(C):
                with m.Case(c):
                    for j in range(L):
                        m.d.comb += [mp.act[j].eq(act[c][j]), mp.weight[j].eq(wgt[c][j])]
                    m.d.comb += mp.last.eq(c == C - 1)

        # ---- results ----
        W = gbs.acc_width(pe.max_len, L)
        res = [Signal(signed(W), name=f"pe_res{k}") for k in range(3)]
        mres = Signal(signed(W), name="mac_res")
        err = Signal(name="any_error")
        rc = Signal(range(4), name="pe_results")
        mdone = Signal(name="mac_done")
        m.d.comb += [pe.o.ready.eq(1), mac.o.ready.eq(1)]
        with m.If(pe.o.valid):
            m.d.sync += rc.eq(rc + 1)
            with m.Switch(rc):
                for k in range(3):
                    with m.Case(k):
                        m.d.sync += res[k].eq(pe.o.payload.value)
            with m.If(pe.o.payload.error):
                m.d.sync += err.eq(1)
        with m.If(mac.o.valid):
            m.d.sync += [mres.eq(mac.o.payload.value), mdone.eq(1)]
            with m.If(mac.o.payload.error):
                m.d.sync += err.eq(1)
        m.d.comb += Assert(~(pe.o.valid & (rc == 3)), "more PE results than dot products")

        done = Signal(name="done")
        m.d.comb += done.eq((rc == 3) & mdone)
        with m.If(done):
            m.d.comb += [
                Assert(~err, "an error flag on a well-formed dot product"),
                Assert(res[0] == mres, "PE FULL differs from the INT8 MAC"),
                Assert(res[1] + res[2] == res[0], "MSB-partial + LSB-partial differs from FULL"),
            ]
        m.d.comb += Cover(done)
        cyc = Signal(range(self.bound + 2), name="cycle")
        with m.If(cyc <= self.bound):
            m.d.sync += cyc.eq(cyc + 1)
        with m.If(cyc == self.bound):
            m.d.comb += Assert(done, "the results did not all arrive by the bound")
        return m
