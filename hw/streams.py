"""Small stream components shared by the blocks (Glasgow's
``gateware/stream.py`` style): each is a tiny ``wiring.Component`` with an
``i`` and an ``o`` ``amaranth.lib.stream`` port.

Why a register slice at every block boundary
--------------------------------------------
Inside the tile no ``ready`` may travel combinationally through more than one
block (``docs/architecture.md``). A block whose input ``ready`` is a function
of its output ``ready`` (a global-stall pipeline, a pass-through FIFO head)
chains its consumer's timing into its producer's; three such blocks in a row
put three blocks' worth of logic on one path. :class:`RegisterSlice` breaks
both directions: ``o.valid``/``o.payload`` come from registers, and
``i.ready`` is a register (the "skid" slot is empty), at full throughput.
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["RegisterSlice"]


class RegisterSlice(wiring.Component):
    """Full-throughput register slice (skid buffer) for one stream.

    Parameters
    ----------
    shape : shape-castable
        The payload shape (a ``data.Struct`` of the shared vocabulary).

    Members
    -------
    i : ``In(stream.Signature(shape))``
    o : ``Out(stream.Signature(shape))``

    Latency and throughput: a payload accepted on ``i`` is valid on ``o`` the
    next cycle; one transfer per cycle in steady state, whatever the pattern of
    ``o.ready``. ``i.ready`` and ``o.valid`` are flip-flop outputs (no
    combinational path from ``o.ready`` to ``i.ready`` or from ``i.valid`` to
    ``o.valid``). Cost: two payload registers.
    """

    def __init__(self, shape):
        self._shape = shape
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})
        #: the skid register and its valid bit (exposed for the formal wrapper)
        self.skid = Signal(shape, name="skid")
        self.skid_valid = Signal(name="skid_valid")

    def elaborate(self, platform):
        m = Module()
        skid, skid_valid = self.skid, self.skid_valid
        # i.ready is the skid slot being empty: a register
        m.d.comb += self.i.ready.eq(~skid_valid)
        accept = self.i.valid & ~skid_valid
        out_free = ~self.o.valid | self.o.ready
        with m.If(out_free):
            with m.If(skid_valid):
                m.d.sync += [self.o.payload.eq(skid), self.o.valid.eq(1), skid_valid.eq(0)]
            with m.Elif(accept):
                m.d.sync += [self.o.payload.eq(self.i.payload), self.o.valid.eq(1)]
            with m.Else():
                m.d.sync += self.o.valid.eq(0)
        with m.Elif(accept):
            m.d.sync += [skid.eq(self.i.payload), skid_valid.eq(1)]
        return m
