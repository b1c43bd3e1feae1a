"""PE array: ``B`` token-parallel LSB-augmented bit-slice PEs
(:class:`elmoe3d.hw.pe.BitSlicePE` with ``tokens = P``) in lockstep: PE
``b`` is paired with HB bank ``b`` and multiplies its slice vector with
``P`` tokens' activations in the same cycle (the token-parallel array: each
weight word is used ``P`` times; the field decode and the beat-rule checker
of a PE serve all its token lanes).

Every beat carries one ``PEBeat`` per PE (the ``P`` lanes' activations;
mode, keep and ``last`` shared; PE ``b``'s slice vector); every PE therefore
holds the same state and their ``ready``/``valid`` agree cycle by cycle. A
lane without a token in a step gets the beat's activations anyway (zeros
from the issue stage) and its result is ignored downstream (the lane's
``valid`` in the tag). A dot product's tag
(``Desc``) waits in a FIFO from its last beat to its results, and leaves with
them as one ``ArrayResult`` through a register slice (so the array's
``i.ready`` does not depend on the vector unit's ``ready``); ``i.ready`` is
the AND of two flip-flops (the PEs' credit and a registered "room for a
tag").

Latency: the PE's (a result ``LATENCY`` cycles after its ``last`` beat) plus
one for the register slice; one beat per cycle.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..pe import BitSlicePE
from ..streams import RegisterSlice
from ..vocab import pe_beat
from .payloads import array_beat, array_result, desc
from .queue import Queue

__all__ = ["PEArray"]

#: Dot products that may be between their last beat and their result.
TAG_DEPTH = 8


class PEArray(wiring.Component):
    """``B x P`` PEs in lockstep with a tag queue.

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
        B, P = g.B, g.P
        pes = [BitSlicePE(lanes=g.L, slice_bits=g.s, max_len=g.cfg.max_len, tokens=P)
               for _ in range(B)]
        for b, pe in enumerate(pes):
            m.submodules[f"pe{b}"] = pe
        # every dot product between its last beat and its result has a tag
        # (a pipelined PE holds up to `depth` results); a full tag queue only
        # holds the input back
        # (a `Queue` on a `QueueFIFO`: `SyncFIFOBuffered`'s cycles without a level
        # counter: in round 15 the read enable, the results' handshake from
        # the PE's output FIFO, passed the counter's up/down enable, the
        # worst path of a seed; its level as a pointer distance is not used
        # either, see `used` below)
        depth = max(TAG_DEPTH, getattr(pes[0], "depth", 0) + 4)
        tags = m.submodules.tags = Queue(desc(g), depth)
        out = m.submodules.out = RegisterSlice(array_result(g))
        wiring.connect(m, out.o, wiring.flipped(self.o))

        PEBeat = pe_beat(g.s, g.L, P)
        # room for a tag, as a flip-flop: `used` (the tags in the queue) is at
        # most `depth - 2`, so a write never meets the queue's inner memory
        # full (it holds `depth - 1`, the output register one more):
        # `i.ready` is two flip-flops and the issue stage's FIFO read enable
        # does not wait for a level compare. The next `used` and `tag_room`
        # are worked out from `used` alone for each of the four outcomes, and
        # the write and the read (late: the results' handshake) only select
        # one (a pointer distance, tried first, was three carry chains in
        # series, 9.2 ns; the sum `used + write` then compared, 7 LUT levels).
        tag_room = Signal(init=1)
        used = Signal(range(depth + 1))
        u_inc, u_dec = Signal.like(used), Signal.like(used)
        wr = Signal()
        m.d.comb += [u_inc.eq(used + 1), u_dec.eq(used - 1)]
        rd = tags.o.ready
        m.d.sync += [used.eq(Mux(wr, Mux(rd, used, u_inc), Mux(rd, u_dec, used))),
                     tag_room.eq(Mux(wr, Mux(rd, used <= depth - 2, used <= depth - 3),
                                     Mux(rd, used <= depth - 1, used <= depth - 2)))]
        ready = pes[0].i.ready & tag_room
        m.d.comb += self.i.ready.eq(ready)
        for b, pe in enumerate(pes):
            beat = Signal(PEBeat, name=f"beat{b}")
            m.d.comb += [beat.act.eq(self.i.payload.act[0] if P == 1 else self.i.payload.act),
                         beat.sv.eq(self.i.payload.sv[b]),
                         beat.mode.eq(self.i.payload.mode), beat.keep.eq(self.i.payload.keep),
                         beat.last.eq(self.i.payload.last),
                         pe.i.payload.as_value().eq(beat.as_value()),
                         pe.i.valid.eq(self.i.valid & tag_room)]
        m.d.comb += [tags.i.payload.eq(self.i.payload.desc),
                     wr.eq(self.i.valid & ready & self.i.payload.last), tags.i.valid.eq(wr)]
        res = out.i.payload
        m.d.comb += [out.i.valid.eq(pes[0].o.valid), tags.o.ready.eq(out.i.valid & out.i.ready),
                     res.desc.eq(tags.o.payload),
                     res.error.eq(Cat(*[pe.o.payload.error for pe in pes]).any())]
        for b, pe in enumerate(pes):
            m.d.comb += pe.o.ready.eq(out.i.ready)
            for p in range(P):
                m.d.comb += res.value[p][b].eq(pe.o.payload.value if P == 1
                                               else pe.o.payload.value[p])
        return m
