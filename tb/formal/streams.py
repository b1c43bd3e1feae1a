"""Formal wrapper of :class:`elmoe3d.hw.streams.RegisterSlice`: stream rules
on both ports, in-order lossless delivery (checked against a 2-entry shadow
queue), at most 2 payloads inside, and ``i.ready`` independent of ``o.ready``
in the same cycle (it is a register)."""

from __future__ import annotations

from amaranth.hdl import Assert, Assume, Cover, Module, ResetSignal, Signal, unsigned
from amaranth.lib import wiring

from ...hw.streams import RegisterSlice
from .common import stream_rules_all

__all__ = ["RegisterSliceFormal"]


class RegisterSliceFormal(wiring.Component):
    def __init__(self, width: int = 4, *, bug: str | None = None):
        self.dut = RegisterSlice(unsigned(width))
        self.bug = bug
        super().__init__(self.dut.signature)

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        wiring.connect(m, wiring.flipped(self.i), dut.i)
        if self.bug == "drop":        # a wire that loses every other output transfer
            m.d.comb += [self.o.payload.eq(dut.o.payload), self.o.valid.eq(dut.o.valid),
                         dut.o.ready.eq(self.o.ready)]
            tog = Signal()
            with m.If(dut.o.valid & dut.o.ready):
                m.d.sync += tog.eq(~tog)
            m.d.comb += self.o.payload.eq(dut.o.payload ^ tog)
        else:
            wiring.connect(m, dut.o, wiring.flipped(self.o))
        m.d.comb += Assume(~ResetSignal())
        stream_rules_all(m, self)
        # shadow queue of accepted, not yet delivered payloads
        q = [Signal.like(self.i.payload, name=f"q{j}") for j in range(3)]
        n = Signal(range(4))
        put = self.i.valid & self.i.ready
        get = self.o.valid & self.o.ready
        with m.If(get):
            m.d.comb += Assert(n != 0, "output without input")
            m.d.comb += Assert(self.o.payload == q[0], "out of order or corrupted")
        m.d.comb += Assert(n <= 2, "more than two payloads inside")
        with m.If(get & ~put):
            m.d.sync += [q[0].eq(q[1]), q[1].eq(q[2]), n.eq(n - 1)]
        with m.Elif(put & ~get):
            for j in range(3):
                with m.If(n == j):
                    m.d.sync += q[j].eq(self.i.payload)
            m.d.sync += n.eq(n + 1)
        with m.Elif(put & get):
            m.d.sync += [q[0].eq(q[1]), q[1].eq(q[2])]
            for j in range(1, 4):
                with m.If(n == j):
                    m.d.sync += q[j - 1].eq(self.i.payload)
        # inductive strengthening: the shadow queue is the DUT's state
        if self.bug is None:
            m.d.comb += Assert(n == dut.o.valid + dut.skid_valid, "occupancy")
            with m.If(dut.o.valid):
                m.d.comb += Assert(dut.o.payload == q[0], "output register")
            with m.If(dut.skid_valid):
                m.d.comb += Assert(dut.o.valid & (dut.skid == q[1]), "skid register")
        m.d.comb += Cover(get & put & (n == 1))
        return m
