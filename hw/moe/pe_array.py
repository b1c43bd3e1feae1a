"""PE array: ``B`` LSB-augmented bit-slice PEs (:class:`elmoe3d.hw.pe.BitSlicePE`)
in lockstep, PE ``b`` paired with HB bank ``b``.

Every beat carries one ``PEBeat`` per PE (shared activations, mode, keep and
``last``; PE ``b``'s slice vector); every PE therefore holds the same state
and their ``ready``/``valid`` agree cycle by cycle. A dot product's tag
(``Desc``) waits in a FIFO from its last beat to its results, and leaves with
them as one ``ArrayResult`` through a register slice (so the array's
``i.ready`` does not depend on the vector unit's ``ready``); ``i.ready`` is
the AND of two flip-flops (the PEs' credit and a registered "two tags
free").

Latency: the PE's (a result ``LATENCY`` cycles after its ``last`` beat) plus
one for the register slice; one beat per cycle.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..pe import BitSlicePE
from ..streams import RegisterSlice
from ..vocab import pe_beat
from .payloads import array_beat, array_result, desc

__all__ = ["PEArray"]

#: Dot products that may be between their last beat and their result.
TAG_DEPTH = 8


class PEArray(wiring.Component):
    """``B`` PEs in lockstep with a tag queue.

    Members
    -------
    i : ``In(stream.Signature(ArrayBeat))``
    o : ``Out(stream.Signature(ArrayResult))``
        ``error`` is the OR of the PEs' result errors (a beat outside its
        mode's planes, or too long a dot product).
    """

    def __init__(self, g):
        self.g = g
        super().__init__({"i": In(stream.Signature(array_beat(g))),
                          "o": Out(stream.Signature(array_result(g)))})

    def elaborate(self, platform):
        m = Module()
        g = self.g
        B = g.B
        pes = [BitSlicePE(lanes=g.L, slice_bits=g.s, max_len=g.cfg.max_len) for _ in range(B)]
        for b, pe in enumerate(pes):
            m.submodules[f"pe{b}"] = pe
        # every dot product between its last beat and its result has a tag
        # (a pipelined PE holds up to `depth` results); a full tag queue only
        # holds the input back
        depth = max(TAG_DEPTH, getattr(pes[0], "depth", 0) + 4)
        tags = m.submodules.tags = SyncFIFOBuffered(width=data.Layout.cast(desc(g)).size,
                                                    depth=depth)
        out = m.submodules.out = RegisterSlice(array_result(g))
        wiring.connect(m, out.o, wiring.flipped(self.o))

        PEBeat = pe_beat(g.s, g.L)
        # room for a tag, as a flip-flop: at least two free entries last cycle
        # (one tag per cycle at most, so one is still free): `i.ready` is two
        # flip-flops and the issue stage's FIFO read enable does not wait for
        # the tag queue's level compare
        tag_room = Signal()
        m.d.sync += tag_room.eq(tags.level <= depth - 2)
        ready = pes[0].i.ready & tag_room
        m.d.comb += self.i.ready.eq(ready)
        for b, pe in enumerate(pes):
            beat = Signal(PEBeat, name=f"beat{b}")
            m.d.comb += [beat.act.eq(self.i.payload.act), beat.sv.eq(self.i.payload.sv[b]),
                         beat.mode.eq(self.i.payload.mode), beat.keep.eq(self.i.payload.keep),
                         beat.last.eq(self.i.payload.last),
                         pe.i.payload.as_value().eq(beat.as_value()),
                         pe.i.valid.eq(self.i.valid & tag_room)]
        m.d.comb += [tags.w_data.eq(self.i.payload.desc),
                     tags.w_en.eq(self.i.valid & ready & self.i.payload.last)]
        res = out.i.payload
        m.d.comb += [out.i.valid.eq(pes[0].o.valid), tags.r_en.eq(out.i.valid & out.i.ready),
                     res.desc.eq(tags.r_data),
                     res.error.eq(Cat(*[pe.o.payload.error for pe in pes]).any())]
        for b, pe in enumerate(pes):
            m.d.comb += [res.value[b].eq(pe.o.payload.value), pe.o.ready.eq(out.i.ready)]
        return m
