"""A FIFO of named payloads with ``i``/``o`` streams, for the FIFOs inside
the batched MoE datapath's components (Glasgow's ``Queue(shape=, depth=)``).

It is one of the timing FIFOs of :mod:`elmoe3d.hw.streams` behind a shape
and two streams, with the same logic and cycles: ``QueueFIFO`` (the fill
level as a pointer distance) or, with ``counter``, ``CreditFIFO`` (a level
counter). With ``credit`` the producer keeps its own credit and never
offers an entry the queue has no room for (``i.valid`` only while
``i.ready`` would be high), so the write is ``i.valid`` alone and the
storage's write enable is the producer's own register, not the level
compare.
"""

from __future__ import annotations

from amaranth.hdl import Module, Shape
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..common import check_int
from ..streams import CreditFIFO, QueueFIFO

__all__ = ["Queue"]


class Queue(wiring.Component):
    """``depth`` entries of ``shape``.

    Parameters
    ----------
    shape : shape-like
        The payload (a ``data.Struct``, a layout or an unsigned width).
    depth : int
        Entries (``>= 2``: the inner memory holds ``depth - 1``, the output
        register one).
    credit : bool
        The producer never writes into a full queue: the write is
        ``i.valid`` alone (``CreditFIFO``'s rule; always so with ``counter``).
    counter : bool
        A level counter (``CreditFIFO``) instead of a pointer distance
        (``QueueFIFO``).

    Raises
    ------
    TypeError, ValueError
        For a shape that is not one, or a depth that is not an integer of
        at least 2, naming it.

    Members
    -------
    i : ``In(stream.Signature(shape))``
    o : ``Out(stream.Signature(shape))``
        ``amaranth.lib.fifo.SyncFIFOBuffered``'s cycles: an entry written at
        cycle ``t`` is offered from ``t + 2``.
    level : ``Out(range(depth + 1))``
        Entries held (the output register included).
    """

    def __init__(self, shape, depth: int, *, credit: bool = False, counter: bool = False):
        Shape.cast(shape)
        check_int("queue depth", depth, 2, 1 << 16)
        self.shape, self.depth = shape, depth
        self.credit, self.counter = bool(credit), bool(counter)
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape)),
                          "level": Out(range(depth + 1))})

    def elaborate(self, platform):
        m = Module()
        width = Shape.cast(self.shape).width
        m.submodules.fifo = f = (CreditFIFO(width=width, depth=self.depth) if self.counter
                                 else QueueFIFO(width=width, depth=self.depth, credit=self.credit))
        m.d.comb += [f.w_data.eq(self.i.payload), f.w_en.eq(self.i.valid),
                     self.i.ready.eq(f.w_rdy),
                     self.o.payload.eq(f.r_data), self.o.valid.eq(f.r_rdy),
                     f.r_en.eq(self.o.ready), self.level.eq(f.level)]
        return m
