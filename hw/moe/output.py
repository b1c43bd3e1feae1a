"""Output stage: a pass's outputs, token by token, once the vector unit has
written its last ``y``, then the pass's counters.

The issue stage hands over a pass summary with the pass's END beat (token
count, step end, no-expert tokens, LPDDR error and counters); the vector
unit pulses ``done`` when END leaves its last stage (every ``y`` written,
every HB word in: HB words and error are latched then). The stage then
reads each token's ``y`` (``H / L`` words) into the output register — zeros
for a token that ran no expert — and offers it on ``o`` (``last`` on the
step's last token, ``error`` if the pass lost data). After the last token's
reads it tells the vector unit that ``y`` is free again (``out_done``), and
after the last transfer it offers the pass's ``PassStats`` on ``stats``.

Throughput: ``H / L + 2`` cycles per token when ``o`` is always ready.

Timing: ``y``'s read port is followed by a register with no enable and no
reset (``y_q``), which the ECP5 flow packs into the block RAM's output
register, so no logic sits behind the DP16KD's slow clock-to-out; a pass is
taken from the two FIFOs in a state of its own (``TAKE``), so their read
enables are decoded from the state register alone (the ``o.valid`` test ends
at the state register, one cycle earlier).
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..vocab import bits, moe_output, pass_stats
from .common import CycleCount, zext
from .payloads import pass_summary
from .ports import PassCounters, PassDone, YRead
from .queue import Queue

__all__ = ["OutputStage"]


class OutputStage(wiring.Component):
    """Outputs and counters of each pass.

    Members
    -------
    summary : ``In(stream.Signature(PassSummary))``
    pass_done : ``In(PassDone)`` (vector unit)
    hb_counters : ``In(PassCounters)`` (HB reader: words and error per buffer)
        Taken with ``pass_done``: every HB word of a pass has arrived by then
        (the vector unit's END waits for the pass constants, every other
        word is consumed before it), and the reader clears a buffer's
        counter only for the next pass in that buffer, after ``pass_done``.
    y : ``Out(YRead)``
        The vector unit's ``y`` memories (token ``t``'s words are lane ``t
        mod P``'s at lane-local ``t div P``); ``out_done``: passes whose
        ``y`` has been read (modulo 4).
    time : ``In(CycleCount)`` (the free-running cycle counter)
    o : ``Out(stream.Signature(MoEOutput))``
    stats : ``Out(stream.Signature(PassStats))``
    """

    def __init__(self, g):
        self.g = g
        cfg = g.cfg
        self.tb, self.cb = bits(g.Tl), bits(g.c_in)
        super().__init__({
            "summary": In(stream.Signature(pass_summary(g))),
            "pass_done": In(PassDone()),
            "hb_counters": In(PassCounters(g)),
            "y": Out(YRead(g)),
            "time": In(CycleCount(g)),
            "o": Out(stream.Signature(moe_output(g.H))),
            "stats": Out(stream.Signature(pass_stats(cfg.stat_bits, g.T, g.E + g.S))),
        })

    def elaborate(self, platform):
        m = Module()
        g = self.g
        done, hbc = self.pass_done, self.hb_counters
        T, C, L = g.T, g.c_in, g.L
        # (`Queue`s on `QueueFIFO`s: `SyncFIFOBuffered`'s cycles, the level
        # as a pointer distance: the FSM's read no longer passes a level
        # counter, the state -> `o.ready` -> the done queue's level, 8.1 ns in
        # timing round 17)
        sq = m.submodules.sq = Queue(pass_summary(g), 2)
        wiring.connect(m, wiring.flipped(self.summary), sq.i)
        sb = g.cfg.stat_bits
        # per done pass: error, HB words (>= passes in flight + 2 entries)
        dq = m.submodules.dq = Queue(data.StructLayout({"error": 1, "hb_words": sb}), 8)
        hbw = Mux(done.par, hbc.count[1], hbc.count[0])
        m.d.comb += [dq.i.payload.error.eq(done.error | hbc.error.bit_select(done.par, 1)),
                     dq.i.payload.hb_words.eq(hbw), dq.i.valid.eq(done.done)]
        hb_words = Signal(sb)
        cur = Signal(pass_summary(g))
        err = Signal()
        t = Signal(range(T + 1))
        c = Signal(range(C + 1))
        rd_valid = Signal()
        rd_c = Signal.like(c)
        rd_valid2 = Signal()
        rd_c2 = Signal.like(c)
        y_q = Signal(8 * L, reset_less=True)   # packed into the EBR's output register
        y = Signal(8 * g.H)
        P = g.P
        pb = bits(P) if P > 1 else 0
        # token `t`: lane `t mod P` (its low bits), lane-local index `t div P`
        m.d.comb += self.y.addr.eq(Cat(zext(c, self.cb), zext(t >> pb, self.tb)))
        # a token that selected no expert (`zero_mask`) gets zeros: applied as
        # its words are read, from a flip-flop, so that `o.y` is a register
        # (the 16:1 select by `t` no longer drives the output's H x 8 bits)
        zero = Signal()
        m.d.sync += zero.eq(cur.zero_mask.bit_select(t, 1))
        # (`t` does not change from a token's first read to its SEND)
        m.d.sync += y_q.eq(Array(self.y.data)[t[:pb]] if pb else self.y.data[0])
        with m.If(rd_valid2):
            m.d.sync += y.word_select(rd_c2, 8 * L).eq(Mux(zero, 0, y_q))
        m.d.sync += [rd_valid.eq(0), rd_c.eq(c), rd_valid2.eq(rd_valid), rd_c2.eq(rd_c)]
        o = self.o.payload
        cm1 = Signal.like(t)                 # the pass's count - 1, registered
        t_last = t == cm1
        m.d.comb += [o.y.eq(y), o.error.eq(err), o.last.eq(cur.step_last & t_last)]
        st = self.stats.payload
        m.d.comb += [st.cycles.eq(self.time.cycle - cur.start), st.hb_words.eq(hb_words),
                     st.ext_beats.eq(cur.ext_beats), st.mac_beats.eq(cur.mac_beats),
                     st.experts.eq(cur.experts), st.expert_tokens.eq(cur.expert_tokens),
                     st.tokens.eq(cur.count), st.error.eq(err)]
        cycles = Signal.like(self.time.cycle)
        with m.FSM(name="output") as fsm:
            with m.State("WAIT"):
                with m.If(sq.o.valid & dq.o.valid):
                    m.next = "TAKE"
            with m.State("TAKE"):
                # (both FIFOs had a word in WAIT and nothing else reads them)
                m.d.comb += [sq.o.ready.eq(1), dq.o.ready.eq(1)]
                m.d.sync += [cur.eq(sq.o.payload),
                             cm1.eq(sq.o.payload.count - 1),
                             err.eq(dq.o.payload.error | sq.o.payload.error),
                             hb_words.eq(dq.o.payload.hb_words),
                             t.eq(0), c.eq(0), cycles.eq(self.time.cycle)]
                m.next = "READ"
            with m.State("READ"):
                m.d.sync += [rd_valid.eq(1), c.eq(c + 1)]
                with m.If(c == C - 1):
                    with m.If(t_last):
                        m.d.sync += self.y.out_done.eq(self.y.out_done + 1)
                    m.next = "LAST_WORD"
            with m.State("LAST_WORD"):
                m.next = "LAST_WORD2"
            with m.State("LAST_WORD2"):
                m.next = "SEND"
            with m.State("SEND"):
                with m.If(self.o.ready):
                    m.d.sync += [t.eq(t + 1), c.eq(0)]
                    with m.If(t_last):
                        m.next = "STATS"
                    with m.Else():
                        m.next = "READ"
            with m.State("STATS"):
                m.d.comb += st.cycles.eq(cycles - cur.start)
                with m.If(self.stats.ready):
                    m.next = "WAIT"
        # valid as expressions of the state register, outside the FSM's
        # processes (Icarus 11 leaves an `always @*` that reads only registers
        # unevaluated after reset, so a valid set inside a state read X)
        m.d.comb += [self.o.valid.eq(fsm.ongoing("SEND")), self.stats.valid.eq(fsm.ongoing("STATS"))]
        return m
