"""LPDDR port: the ``ExtBeat`` stream from the external-memory stream engine
into the LPDDR weight buffer, job by job.

For every job of a pass, in job order, whose decision leaves planes on
LPDDR (``p0 .. p0+planes-1``: ``0 ..`` for an LPDDR job, ``k ..`` for a split
one), the port expects exactly those planes of that expert in the order of
:func:`elmoe3d.golden.layout.weight_beats` with banks fastest: per segment,
per plane, per chunk, ``B / fill_words`` beats of ``fill_words`` words
(banks ``bank .. bank+fill_words-1``), the last one with ``last``. Each beat
is checked against that order (``plane``, ``row``, ``bank``, ``last``); a
beat with ``error`` or an early ``last`` ends the job's command, and the
port writes zero words for the rest of the job so that the issue stage
still finds every word it expects and the next job starts on the next
command. Every such case flags the pass.

A whole-resident job (decision ``lsb_hb``, precision FULL or VERIFY) takes
its planes ``k .. n-1`` from the LSB port instead (``lsb[b]``: one word
stream per bank, the HB reader's read of the job's LSB slot, in the same
order), all ``B`` banks per step: the buffer sees the same words in the same
places, so the issue stage cannot tell the two apart.

Throughput: one beat per cycle (``B`` LSB words per cycle) while every bank's buffer has space
(``ready`` follows the buffer's ``room``, one flip-flop: every bank had
room for three words two cycles ago).
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Module, Mux, Signal, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..vocab import CMD_ID_BITS, TokenRole, bits, ext_beat
from .common import pow2ceil, zext
from .payloads import job_entry, job_source
from .ports import BufferWrite, JobRead, PassCounters, PassProgress

__all__ = ["ExtWriter"]


class ExtWriter(wiring.Component):
    """LPDDR beats into the LPDDR weight buffer, checked against the job order.

    Members
    -------
    jobs : ``Out(JobRead)`` (job-table read port)
    progress : ``In(PassProgress)`` (scheduler; ``decided``, ``total``,
        ``total_valid``, ``epoch`` are read)
    ext : ``In(stream.Signature(ExtBeat))``
    buf : ``Out(BufferWrite)``
        The LPDDR weight buffer: ``we``, ``wdata`` per bank while ``room``
        (every bank at once).
    lsb : ``In(stream.Signature(unsigned(sv))).array(B)``
        The LSB port (per bank, from the HB reader through a FIFO), taken
        all banks at once.
    counters : ``Out(PassCounters)``
        Per buffer: LPDDR beats received (``count``); a beat out of order,
        with ``error``, or a misplaced ``last`` (``error``, rising the cycle
        after the beat's handshake).
    """

    def __init__(self, g):
        self.g = g
        self.jb = bits(pow2ceil(g.jobs))
        self.ExtBeat = ext_beat(g.sv, g.fw, g.n, g.rows, g.B, CMD_ID_BITS)
        super().__init__({
            "jobs": Out(JobRead(g)),
            "progress": In(PassProgress(g)),
            "ext": In(stream.Signature(self.ExtBeat)),
            "buf": Out(BufferWrite(g.B, g.sv)),
            "lsb": In(stream.Signature(unsigned(g.sv))).array(g.B),
            "counters": Out(PassCounters(g)),
        })

    def elaborate(self, platform):
        m = Module()
        g = self.g
        prog, ctr = self.progress, self.counters
        B, fw, n, k = g.B, g.fw, g.n, g.k
        groups = B // fw
        pe = Signal()
        j = Signal(range(g.jobs + 1))
        m.d.comb += self.jobs.addr.eq(Cat(zext(j, self.jb), pe))
        decided = Array(prog.decided)
        total = Array(prog.total)
        # walk: projection (0 GATE, 1 UP, 2 DOWN), group, plane, chunk, bank group
        proj = Signal(range(3))
        grp = Signal(range(max(g.g_in, g.g_down) + 1))
        q = Signal(range(n + 1))
        c = Signal(range(max(g.c_in, g.c_down) + 1))
        bg = Signal(range(max(2, groups)))
        row0 = Signal(range(g.rows + 1))
        p0 = Signal(range(n + 1))
        planes = Signal(range(n + 1))
        pad = Signal()
        # the projection's chunks and groups (DOWN's or the others') are
        # registers, loaded as `proj` moves: the next row (`row0 + chunks`)
        # is then an adder of flip-flops, with no `proj` compare before it
        chunks = Signal(range(max(g.c_in, g.c_down) + 1))
        ngroups = Signal(range(max(g.g_in, g.g_down) + 1))
        # the walk's "last" compares as flip-flops, worked out wherever the
        # walk's counters are assigned (below, beside each assignment), so that
        # `adv` only enables registers whose next values come from registers
        last_c, last_q, last_g, last_bg = Signal(), Signal(), Signal(), Signal()
        last_beat = last_bg & last_c & last_q & last_g & (proj == 2)

        space = self.buf.room
        beat = self.ExtBeat(self.ext.payload)
        running = Signal()
        lsb = Signal()                       # the job's planes come from the LSB port
        m.d.comb += self.ext.ready.eq(running & ~lsb & ~pad & space)
        take = self.ext.valid & self.ext.ready
        adv = Signal()
        lsb_go = running & lsb & space & Cat(*[self.lsb[b].valid for b in range(B)]).all()
        m.d.comb += adv.eq(take | (running & ~lsb & pad & space) | lsb_go)
        for b in range(B):
            m.d.comb += [self.lsb[b].ready.eq(lsb_go),
                         self.buf.we[b].eq(adv & (lsb | (bg == b // fw))),
                         self.buf.wdata[b].eq(Mux(lsb, self.lsb[b].payload,
                                                  Mux(pad, 0, beat.words[b % fw])))]
        # (an LSB step is all banks at once: one bank group)
        one_group = Mux(lsb, 1, groups == 1)
        # the expected row and plane (`row0 + c`, `p0 + q`) kept as registers
        # beside the walk, so that the check compares the beat with registers
        erow = Signal.like(row0)
        eplane = Signal.like(p0)
        # Each field's mismatch is registered with the take; the flag of the
        # buffer rises a cycle later from those flip-flops (the compares,
        # their OR and the take in one cycle had been five LUT levels). It is
        # read long after, with the pass's outputs, and the other buffer's
        # clear (a new pass, below) comes at least two cycles after a job's
        # last take
        chk = Signal()
        chk_pe = Signal()
        mism = Signal(5)
        m.d.sync += [chk.eq(take), chk_pe.eq(pe),
                     mism.eq(Cat(beat.error, beat.plane != eplane, beat.row != erow,
                                 beat.bank != bg * fw, beat.last != last_beat))]
        with m.If(chk & mism.any()):
            m.d.sync += ctr.error.bit_select(chk_pe, 1).eq(1)
        with m.If(take):
            # an error or an early last ends the command: pad the rest of the job
            with m.If((beat.error | beat.last) & ~last_beat):
                m.d.sync += pad.eq(1)
        # The beat counters count a cycle after the handshake and clear a
        # cycle after the decision to (both from registers: `tk`, `tk_pe`,
        # `clr`), so neither the handshake nor the FSM's decision is in
        # front of their 2 x `stat_bits` clock enables (timing round 17: the
        # FSM's `go_end` -> the counters' enables, 4 LUTs and 6.8 ns of
        # routing). They are read at the pass's END, long after its last beat;
        # a clear names the buffer whose next pass is about to start, which
        # takes no beat for at least two cycles after it.
        tk, tk_pe = Signal(), Signal()
        clr = Signal(2)
        m.d.sync += [tk.eq(take), tk_pe.eq(pe), clr.eq(0)]
        for p in range(2):
            with m.If(clr[p]):
                m.d.sync += ctr.count[p].eq(0)
            with m.Elif(tk & (tk_pe == p)):
                m.d.sync += ctr.count[p].eq(ctr.count[p] + 1)

        # The job decisions compare `j` with the scheduler's counters, which sit
        # far away: the compares are registered (`go_job`, `go_end`), each a
        # snapshot of the scheduler's epoch and counters of one cycle (which
        # it changes together: a new pass flips the epoch and clears the
        # counters at one edge), and a cycle in which `j`, `pe` or `running`
        # changed here is followed by one that decides nothing (`settle`), so
        # a snapshot older than this port's own state is never used. Within
        # a pass the counters only move towards a decision, so a snapshot a
        # cycle old can only decide a cycle late.
        my_epoch = Signal(2)
        fresh = prog.epoch.bit_select(pe, 1) != my_epoch.bit_select(pe, 1)
        go_job = Signal()
        go_end = Signal()
        settle = Signal()
        m.d.sync += [go_job.eq(fresh & (j < decided[pe])),
                     go_end.eq(fresh & prog.total_valid.bit_select(pe, 1) & (j == total[pe])),
                     settle.eq(0)]

        with m.If(adv):
            m.d.sync += [bg.eq(bg + 1), last_bg.eq(bg + 1 == groups - 1)]
            with m.If(last_bg):
                m.d.sync += [bg.eq(0), c.eq(c + 1), erow.eq(erow + 1),
                             last_bg.eq(one_group), last_c.eq(c + 1 == chunks - 1)]
                with m.If(last_c):
                    m.d.sync += [c.eq(0), q.eq(q + 1), erow.eq(row0), eplane.eq(eplane + 1),
                                 last_c.eq(chunks == 1), last_q.eq(q + 1 == planes - 1)]
                    with m.If(last_q):
                        m.d.sync += [q.eq(0), grp.eq(grp + 1), row0.eq(row0 + chunks),
                                     erow.eq(row0 + chunks), eplane.eq(p0),
                                     last_q.eq(planes == 1), last_g.eq(grp + 1 == ngroups - 1)]
                        with m.If(last_g):
                            # the next projection's limits (DOWN after UP)
                            m.d.sync += [grp.eq(0), proj.eq(proj + 1),
                                         chunks.eq(Mux(proj == 1, g.c_down, g.c_in)),
                                         ngroups.eq(Mux(proj == 1, g.g_down, g.g_in)),
                                         last_c.eq(Mux(proj == 1, g.c_down == 1, g.c_in == 1)),
                                         last_g.eq(Mux(proj == 1, g.g_down == 1, g.g_in == 1))]
                            with m.If(proj == 2):
                                m.d.sync += [running.eq(0), pad.eq(0), lsb.eq(0), j.eq(j + 1),
                                             settle.eq(1)]

        ent = job_entry(g)(self.jobs.entry)
        src = job_source(g)(self.jobs.src)
        need = Mux(ent.precision == TokenRole.DRAFT, k, n)
        whole = (~ent.shared & src.hb & src.lsb_hb & (ent.precision != TokenRole.DRAFT)
                 if n - k <= k else 0)
        with m.FSM(name="ext"):
            with m.State("IDLE"):
                with m.If(~running & ~settle & go_job):
                    m.next = "READ"
                with m.Elif(~running & ~settle & go_end):
                    m.d.sync += [pe.eq(~pe), j.eq(0), ctr.error.bit_select(~pe, 1).eq(0),
                                 settle.eq(1),
                                 my_epoch.bit_select(pe, 1).eq(prog.epoch.bit_select(pe, 1)),
                                 clr.eq(Mux(pe, 0b01, 0b10))]
            with m.State("READ"):
                m.d.sync += [proj.eq(0), grp.eq(0), q.eq(0), c.eq(0), bg.eq(0), row0.eq(0),
                             chunks.eq(g.c_in), ngroups.eq(g.g_in), lsb.eq(whole),
                             last_bg.eq((groups == 1) | whole), last_c.eq(g.c_in == 1),
                             last_g.eq(g.g_in == 1),
                             last_q.eq(Mux(src.hb, need - k, need) == 1),
                             settle.eq(1),
                             erow.eq(0), eplane.eq(Mux(src.hb, k, 0)),
                             pad.eq(0), p0.eq(Mux(src.hb, k, 0)),
                             planes.eq(Mux(src.hb, need - k, need))]
                with m.If(ent.shared | (src.hb & (ent.precision == TokenRole.DRAFT))):
                    m.d.sync += j.eq(j + 1)          # nothing on LPDDR
                with m.Else():
                    m.d.sync += running.eq(1)
                m.next = "IDLE"
        return m
