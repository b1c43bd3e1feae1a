"""HB reader: every HB read of a pass, on one ``HBRead`` stream per bank
(bank ``b`` feeds PE ``b``), and the split of the returned words between the
HB weight buffer and the requantisation-record path.

Per pass (buffer ``par``, layer ``l``), in this order, each command to all
``B`` banks at once (each bank's ``HBRead`` handshakes on its own):

1. ROUTER: the router, all ``n`` planes (``dense_layout.router_base(l)``,
   ``router_words``) -> weight buffer;
2. CONST: the bank's output-requantisation records and the softmax record
   (bank 0: also the SiLU table, contiguous after them) -> record path;
3. per job, as soon as its decision is in: its records (``per_expert``
   records of expert ``j``; routed ``j = e``, shared ``j = E + s``) ->
   record path; then its HB planes -> weight buffer: an HB-sourced expert
   from its slot (``k`` planes, offset 0, the whole slot: the slot's planes
   are segment-interleaved, so this is the consumption order); a shared
   expert from the dense region, all ``n`` planes in one read, or — when
   every token of the pass is DRAFT — planes ``0 .. k-1`` of each segment,
   one read per segment (the issue stage never skips a word it was sent);
   a whole-resident job (``lsb_hb``, precision FULL or VERIFY) reads its two
   slots segment by segment, alternating: the segment's MSB planes from the
   MSB slot -> weight buffer, then its LSB planes (``k .. n-1``) from the
   LSB slot -> the LSB port (``lsb[b]``, one word stream per bank), which the
   LPDDR writer puts into the LPDDR weight buffer in the job's turn, where a
   split job's LPDDR planes would go (so the issue stage has a segment's
   planes from both slots one segment after the job starts, not one slot
   later).

Errors end streams cleanly: an ``HBBeat`` with ``error`` (HB refuses a read
of a slot that is not resident) or a ``last`` before the command's count
ends the command; the reader writes zero words for the rest so that every
consumer still sees the count it expects, and flags the pass (the outputs
of the pass carry ``error``). A command whose count-th word lacks ``last``
is flagged too.

The pass constants of buffer ``par`` stay until the vector unit reports
the pass done (``pass_done``); the next pass in that buffer waits for it.
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ...geometry import expert_record_range, lut_share, record_words
from ..vocab import HBRegionKind, TokenRole, bits, hb_beat, hb_read
from .common import pow2ceil, zext
from ..streams import BlockFIFO, RegisterSlice
from .payloads import job_entry, job_source, rec_cmd, seg_params
from .ports import (BufferWrite, JobRead, PassConstants, PassCounters, PassDone, PassProgress,
                    PassView, SoftmaxRecord, out_record_write, silu_table_write)
from .queue import Queue

__all__ = ["HBReader", "RecordPath"]


class _RawView:
    """The unpacker's view of the word queue (``r_data``/``r_rdy``/``r_en``
    names of a FIFO's read side on a stream)."""

    def __init__(self, st):
        self.r_data, self.r_rdy, self.r_en = st.payload, st.valid, st.ready


class RecordPath(wiring.Component):
    """One bank's requantisation records: words in, records out.

    Words (``word``) queue in a FIFO deep enough for two jobs' records, so
    the HB stream is never held up by the one-record-per-cycle unpacker;
    the FIFO (:class:`~elmoe3d.hw.streams.BlockFIFO`) registers its block
    RAM's output before the unpacker's logic (for 125 MHz). Per command (``cmd``): skip ``skip`` records of the first word, take
    ``nrec`` records, drop the rest of the last word. A job's records become
    one ``SegParams`` per segment row (GATE: one record; UP: ``up_rq`` and
    ``prod_rq``; DOWN: one) on ``params``; the pass constants are written
    to the output-requantisation store (``out``, a ``WritePort``), the
    softmax record (``sm``, a ``SoftmaxRecord``) and the SiLU table (``lut``,
    a ``WritePort``; bank 0 only); ``const_done`` pulses after a constant
    command's last record (``const_par`` its buffer). Every write
    (``params``' queue, ``out``, ``sm``, ``lut``, ``const_done``) comes the
    cycle after the record is taken, from registers.
    """

    def __init__(self, g, bank: int):
        self.g, self.bank = g, bank
        cb = g.cfg.slice_vector_bits
        self.raw_depth = pow2ceil(2 * (-(-g.dense.record_index["per_expert"] * 32 // cb) + 1)
                                  + -(-(g.g_down + 65) * 32 // cb))
        super().__init__({
            "word": In(stream.Signature(unsigned(cb))),
            "cmd": In(stream.Signature(rec_cmd(g))),
            "params": Out(stream.Signature(seg_params())),
            "out": Out(out_record_write(g)), "lut": Out(silu_table_write()),
            "sm": Out(SoftmaxRecord()),
            "const_done": Out(1), "const_par": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        g = self.g
        sv = g.sv
        # the words queue in block RAM whose read data passes a plain register
        # (the EBR's output register on ECP5) before the unpacker's lane
        # select and the former: one word per cycle, flags from flip-flops
        raw = m.submodules.raw = BlockFIFO(sv, self.raw_depth)
        # the words pass a register slice first: the demux's write decision
        # (the layer's latest signal, with the queue's pop behind it) ends at
        # the slice's flip-flops, and the block RAM's write enable is one LUT
        # of flip-flops (`o.valid & ~full`). Round 12's worst path on three
        # seeds of five ran from the demux through the RAM's write-enable LUT,
        # which ABC shared with the pop and nextpnr placed beside the RAM.
        wslice = m.submodules.wslice = RegisterSlice(unsigned(sv))
        # (the reader offers a command only while `cmd.ready`: the queue writes
        # on `i.valid` alone and counts its level with pointers)
        cmdq = m.submodules.cmdq = Queue(rec_cmd(g), 4, credit=True)
        # the parameter queue's room is a flip-flop, so the word queue's read
        # enable does not wait for a level compare; the queue writes on
        # `i.valid` alone (a `CreditFIFO`), a cycle after the former decides
        # (below). `pq_room` at cycle t (from the level at t-1) allows a
        # write at t+1: at most the writes of t-1 and t come between, one per
        # cycle
        pq = m.submodules.pq = Queue(seg_params(), 16, counter=True)
        pq_room = Signal()
        m.d.sync += pq_room.eq(pq.level <= pq.depth - 3)
        wiring.connect(m, wiring.flipped(self.word), wslice.i)
        wiring.connect(m, wslice.o, raw.i)
        wiring.connect(m, wiring.flipped(self.cmd), cmdq.i)
        wiring.connect(m, pq.o, wiring.flipped(self.params))
        raw = _RawView(raw.o)
        cur = Signal(rec_cmd(g))
        ri = Signal.like(cur.nrec)
        rec = Signal(32)
        rec_valid = Signal()
        take = Signal()                     # the former takes `rec` this cycle
        # flip-flops beside `ri` (worked out as it advances), so that the
        # word queue's read enable is a few LUTs of registers: `ri` is the
        # command's last record; `ri` is an UP record
        Gi = g.g_in
        ri_last = Signal()
        is_up = Signal()

        # (`ri1` = `ri + 1` and `nrec_m1` = the command's `nrec - 1`, both
        # registers, so that neither flag has an adder before its compare)
        ri1 = Signal.like(ri)
        nrec_m1 = Signal.like(cur.nrec)

        def ri_load(nrec):
            m.d.sync += [ri.eq(0), ri1.eq(1), ri_last.eq(nrec == 1), is_up.eq(0),
                         nrec_m1.eq(nrec - 1)]

        def ri_next():
            m.d.sync += [ri.eq(ri1), ri1.eq(ri1 + 1), ri_last.eq(ri1 == nrec_m1),
                         is_up.eq((ri1 >= Gi) & (ri1 < 3 * Gi))]

        # ---- unpacker ---------------------------------------------------------------
        lane_end = Signal()                 # the lane is the word's last (R > 1)
        with m.FSM(name="unpack"):
            with m.State("IDLE"):
                with m.If(cmdq.o.valid):
                    m.d.comb += cmdq.o.ready.eq(1)
                    m.d.sync += cur.eq(cmdq.o.payload)
                    ri_load(cmdq.o.payload.nrec)
                    if sv >= 32 and sv // 32 > 1:
                        m.d.sync += lane_end.eq(cmdq.o.payload.skip == sv // 32 - 1)
                    m.next = "RUN"
            with m.State("RUN"):
                if sv >= 32:
                    R = sv // 32
                    lane = Signal(range(max(2, R)))
                    started = Signal()
                    cur_lane = Mux(started, lane, cur.skip) if R > 1 else Const(0, 1)
                    # (`end_word` is the flip-flop `lane_end`, worked out as
                    # the lane moves: the word queue's read enable, which
                    # drives the queue's credit counter by the block RAM, is
                    # two LUTs of flip-flops; round 16 had the lane's select
                    # and compare in front of it, then 3.6 ns of routing)
                    m.d.comb += [rec.eq(raw.r_data.word_select(cur_lane, 32) if R > 1
                                        else raw.r_data),
                                 rec_valid.eq(raw.r_rdy)]
                    with m.If(rec_valid & take):
                        ri_next()
                        m.d.sync += started.eq(1)
                        if R > 1:
                            m.d.sync += [lane.eq(cur_lane + 1),
                                         lane_end.eq(cur_lane + 1 == R - 1)]
                        end_word = lane_end if R > 1 else Const(1)
                        with m.If(end_word | ri_last):
                            m.d.comb += raw.r_en.eq(1)
                            if R > 1:
                                m.d.sync += [lane.eq(0), lane_end.eq(R == 1)]
                        with m.If(ri_last):
                            m.d.sync += started.eq(0)
                            m.next = "IDLE"
                else:
                    P = 32 // sv
                    acc = Signal(32)
                    have = Signal(range(P + 1))
                    m.d.comb += [rec.eq(acc), rec_valid.eq(have == P)]
                    with m.If((have < P) & raw.r_rdy):
                        m.d.comb += raw.r_en.eq(1)
                        m.d.sync += [acc.eq(Cat(acc[sv:], raw.r_data)), have.eq(have + 1)]
                    with m.If(rec_valid & take):
                        ri_next()
                        m.d.sync += have.eq(0)
                        with m.If(ri_last):
                            m.next = "IDLE"

        # ---- former -----------------------------------------------------------------
        # `rec` is a 16:1 select of flip-flops (the word queue's ring head, then
        # the lane): four LUT levels. The former decides from registers only
        # (`take`, the record's kind, the write flags) and registers the record
        # with its decision; every write happens a cycle later from those
        # registers, so no write - to the parameter queue, or to the vector
        # unit's SiLU table and output store, which place far away - starts
        # behind the select (round 11's worst paths on two seeds).
        Gd = g.g_down
        up_second = ri[0] ^ (Gi & 1)          # (ri - Gi) odd: the row's prod_rq
        rec_r = Signal(32, reset_less=True)
        par_r = Signal()
        out_addr_r = Signal.like(self.out.addr)
        lut_addr_r = Signal.like(self.lut.addr)
        w_out, w_sm, w_lut, w_done = Signal(), Signal(), Signal(), Signal()
        w_hold, w_emit, w_up = Signal(), Signal(), Signal()
        m.d.sync += [rec_r.eq(rec), par_r.eq(cur.par),
                     out_addr_r.eq(Cat(zext(ri, bits(Gd)), cur.par)),
                     lut_addr_r.eq(Cat(zext(ri - Gd - 1, 6), cur.par)),
                     w_out.eq(0), w_sm.eq(0), w_lut.eq(0), w_done.eq(0),
                     w_hold.eq(0), w_emit.eq(0), w_up.eq(is_up)]
        with m.If(cur.const):
            m.d.comb += take.eq(1)
            with m.If(rec_valid):
                m.d.sync += [w_out.eq(ri < Gd), w_done.eq(ri_last)]
                if self.bank == 0:
                    m.d.sync += [w_sm.eq(ri == Gd), w_lut.eq(ri > Gd)]
        with m.Elif(is_up & ~up_second):
            m.d.comb += take.eq(1)
            m.d.sync += w_hold.eq(rec_valid)
        with m.Else():
            m.d.comb += take.eq(pq_room)
            m.d.sync += w_emit.eq(rec_valid & pq_room)

        # the writes, from registers
        mult, shift = rec_r[:16], rec_r[16:22]
        held = Signal(22)
        pp = pq.i.payload
        m.d.comb += [self.out.en.eq(w_out), self.out.addr.eq(out_addr_r),
                     self.out.data.eq(rec_r[:22]),
                     self.sm.en.eq(w_sm), self.sm.par.eq(par_r), self.sm.mult.eq(mult),
                     self.sm.shift.eq(shift),
                     self.lut.en.eq(w_lut), self.lut.addr.eq(lut_addr_r), self.lut.data.eq(rec_r),
                     self.const_done.eq(w_done), self.const_par.eq(par_r),
                     pq.i.valid.eq(w_emit)]
        with m.If(w_hold):
            m.d.sync += held.eq(rec_r[:22])
        with m.If(w_up):
            m.d.comb += [pp.mult.eq(held[:16]), pp.shift.eq(held[16:22]),
                         pp.mult2.eq(mult), pp.shift2.eq(shift)]
        with m.Else():
            m.d.comb += [pp.mult.eq(mult), pp.shift.eq(shift)]
        return m


class HBReader(wiring.Component):
    """Per-pass HB commands for all banks and the return-word demux.

    Members
    -------
    passes : ``In(PassView)`` (token store; ``valid``, ``seq``, ``layer`` are read)
    jobs : ``Out(JobRead)`` (job-table read port)
    progress : ``In(PassProgress)`` (scheduler; ``decided``, ``total``,
        ``total_valid``, ``epoch`` are read)
    hb_cmd : ``Out(stream.Signature(HBRead)).array(B)``
    hb_data : ``In(stream.Signature(HBBeat)).array(B)``
        ``ready`` comes from registers only (the destination's space).
    buf : ``Out(BufferWrite)``
        The HB weight buffer (``we``, ``wdata`` while ``space``).
    lsb : ``Out(stream.Signature(unsigned(sv))).array(B)``
        The LSB port: a whole-resident job's LSB slot words, per bank.
    params : ``Out(stream.Signature(SegParams)).array(B)``
    consts : ``Out(PassConstants)``
        Writes of the pass constants (``out[b]``, ``lut``); ``out_loaded``,
        ``lut_loaded``: the constants of a buffer are complete (cleared by
        ``pass_done``).
    sm : ``Out(SoftmaxRecord)``
        The softmax record.
    pass_done : ``In(PassDone)`` (vector unit; ``done``, ``par`` are read)
    counters : ``Out(PassCounters)``
        Per buffer: HB words received (``count``); a command ended short /
        without ``last`` (``error``, raised two cycles after the word, from
        a per-bank flag).
    """

    def __init__(self, g):
        self.g = g
        cfg = g.cfg
        self.jb = bits(pow2ceil(g.jobs))
        HBRead = hb_read(cfg.tag_slots, cfg.slot_words, cfg.dense_words, cfg.planes)
        self.HBRead = HBRead
        super().__init__({
            "passes": In(PassView(g)),
            "jobs": Out(JobRead(g)),
            "progress": In(PassProgress(g)),
            "hb_cmd": Out(stream.Signature(HBRead)).array(g.B),
            "hb_data": In(stream.Signature(hb_beat(g.s, g.L))).array(g.B),
            "buf": Out(BufferWrite(g.B, g.sv)),
            "lsb": Out(stream.Signature(unsigned(g.sv))).array(g.B),
            "params": Out(stream.Signature(seg_params())).array(g.B),
            "consts": Out(PassConstants(g)),
            "sm": Out(SoftmaxRecord()),
            "pass_done": In(PassDone()),
            "counters": Out(PassCounters(g)),
        })

    def elaborate(self, platform):
        m = Module()
        g = self.g
        pv, prog, ctr = self.passes, self.progress, self.counters
        cfg = g.cfg
        B, E, S, n, k = g.B, g.E, g.S, g.n, g.k
        d = g.dense
        idx = d.record_index
        per = idx["per_expert"]
        jb = self.jb

        # ---- constants ------------------------------------------------------------------
        layers = range(cfg.layers)
        router_base = Array(Const(d.router_base(l), 16) for l in layers)
        params_base = Array(Const(d.params_base(l), 16) for l in layers)
        shared_base = Array(Const(d.shared_base(l, s), 16) for l in layers for s in range(max(S, 1)))
        const_cmd = []
        for b in range(B):
            nrec = g.g_down + 1 + len(lut_share(cfg, b))
            w0, words, skip = record_words(cfg, idx["out"], nrec)
            const_cmd.append((w0, words, skip, nrec))
        rec_cmds = [record_words(cfg, *expert_record_range(cfg, j)) for j in range(E + S)]
        rec_w0 = Array(Const(c[0], 16) for c in rec_cmds)
        rec_wn = Array(Const(c[1], 16) for c in rec_cmds)
        rec_skip = Array(Const(c[2], 8) for c in rec_cmds)

        # ---- per-bank destination queues and record paths --------------------------------
        # the longest command of any kind (the demux counts up to it)
        cnt_max = max([g.router_words, n * g.rows, k * g.rows, k * max(g.c_in, g.c_down)]
                      + [c[1] for c in const_cmd] + [c[1] for c in rec_cmds])
        # (`one`: `count == 1`, so that a new head's "last word" needs no compare)
        dest_l = data.StructLayout({"rec": 1, "lsb": 1, "count": unsigned(cnt_max.bit_length()),
                                    "par": 1, "one": 1})
        # (pointer-based level: a command's last word pops the queue without a
        # level counter behind the demux's late `take`; a command is offered
        # only while `i.ready`, so the queue writes on `i.valid` alone)
        dq = [Queue(dest_l, 4, credit=True) for _ in range(B)]
        rps = [RecordPath(g, b) for b in range(B)]
        for b in range(B):
            m.submodules[f"dq{b}"] = dq[b]
            m.submodules[f"rp{b}"] = rps[b]
            wiring.connect(m, rps[b].params, wiring.flipped(self.params[b]))
            cw = self.consts.out
            m.d.comb += [cw.en[b].eq(rps[b].out.en), cw.addr[b].eq(rps[b].out.addr),
                         cw.data[b].eq(rps[b].out.data)]
        # (the SiLU table and the softmax record come from bank 0)
        wiring.connect(m, rps[0].lut, wiring.flipped(self.consts.lut))
        wiring.connect(m, rps[0].sm, wiring.flipped(self.sm))

        # ---- constants' life --------------------------------------------------------------
        const_busy = Signal(2)
        bank_loaded = [Signal(2, name=f"loaded{b}") for b in range(B)]
        for b in range(B):
            with m.If(rps[b].const_done):
                m.d.sync += bank_loaded[b].bit_select(rps[b].const_par, 1).eq(1)
        all_loaded = bank_loaded[0]
        for b in range(1, B):
            all_loaded = all_loaded & bank_loaded[b]
        m.d.comb += [self.consts.out_loaded.eq(all_loaded),
                     self.consts.lut_loaded.eq(bank_loaded[0])]
        with m.If(self.pass_done.done):
            m.d.sync += const_busy.bit_select(self.pass_done.par, 1).eq(0)
            for b in range(B):
                m.d.sync += bank_loaded[b].bit_select(self.pass_done.par, 1).eq(0)

        # ---- command sequencer ------------------------------------------------------------
        ph = Signal()
        my_seq = Signal(2)
        layer = Signal.like(pv.layer[0])
        j = Signal(range(g.jobs + 1))
        ent = Signal(job_entry(g))
        src = Signal(job_source(g))
        acc = Signal(B)
        kind = Signal(range(5))            # 0 ROUTER, 1 CONST, 2 REC, 3 WEIGHTS, 4 LSB
        # per-segment reads of a DRAFT-only shared expert
        sproj = Signal(range(3))
        sgrp = Signal(range(max(g.g_in, g.g_down) + 1))
        srow = Signal(range(g.rows + 1))
        schunks = Mux(sproj == 2, g.c_down, g.c_in)
        sgroups = Mux(sproj == 2, g.g_down, g.g_in)
        # `sgrp == sgroups - 1` and `s_last` registered a cycle late: they are
        # read when a command is done, at least two cycles after `sgrp` or
        # `sproj` moved (a command is offered from its second active cycle)
        sg_end = Signal()
        s_last = Signal()
        m.d.sync += [sg_end.eq(sgrp == sgroups - 1),
                     s_last.eq((sproj == 2) & (sgrp == sgroups - 1))]
        seg_reads = Signal()
        active = Signal()
        # a whole-resident job: its LSB slot from HB too
        whole = ~ent.shared & src.hb & src.lsb_hb & (ent.precision != TokenRole.DRAFT) \
            if n - k <= k else Const(0)
        # the job's record command (first word, words, skip: looked up by the
        # job's record index as the entry is read) and the pass's region bases
        # are registers (loaded with the job entry / the layer): a command's
        # offset is one select and one adder after flip-flops
        rw0, rwn, rskip = Signal(16), Signal(16), Signal(8)
        rbase = Signal(16)
        pbase = Signal(16)
        m.d.comb += self.jobs.addr.eq(Cat(zext(j, jb), ph))
        decided = Array(prog.decided)
        total = Array(prog.total)
        fire = Signal(B)
        # The command payloads are computed from registers that hold still
        # while a command is active and are registered themselves: a command
        # is offered from its second active cycle. A command is done the
        # cycle after its last bank took it (`acc` full, a register): the
        # sequencer's decisions start from flip-flops, not from the banks'
        # `ready` (one cycle per command).
        armed = Signal()
        done_all = Signal()
        m.d.comb += done_all.eq(acc.all())
        m.d.sync += armed.eq(active & ~done_all)
        # The command's fields but ``plane`` (HB copies it into the beats; this
        # reader does not use it): a comb signal with a never-assigned bit
        # becomes an empty ``always @*`` in Verilog (X on Icarus, ALWNEVER).
        cmd_l = data.StructLayout({n: f.shape for n, f in data.Layout.cast(self.HBRead)
                                   if n != "plane"})
        for b in range(B):
            c = Signal(cmd_l, name=f"cmd{b}")
            m.d.sync += [getattr(self.hb_cmd[b].payload, n).eq(getattr(c, n)) for n, _ in cmd_l]
            m.d.sync += self.hb_cmd[b].payload.plane.eq(0)
            w0, words, skip, nrec = const_cmd[b]
            dent = dq[b].i.payload
            rc = rec_cmd(g)(rps[b].cmd.payload)
            need_rc = (kind == 1) | (kind == 2)
            with m.Switch(kind):
                with m.Case(0):
                    m.d.comb += [c.region.eq(HBRegionKind.DENSE), c.offset.eq(rbase),
                                 c.count.eq(g.router_words), dent.count.eq(g.router_words)]
                with m.Case(1):
                    m.d.comb += [c.region.eq(HBRegionKind.DENSE),
                                 c.offset.eq(pbase + w0), c.count.eq(words),
                                 dent.rec.eq(1), dent.count.eq(words),
                                 rc.const.eq(1), rc.skip.eq(skip), rc.nrec.eq(nrec)]
                with m.Case(2):
                    m.d.comb += [c.region.eq(HBRegionKind.DENSE),
                                 c.offset.eq(pbase + rw0),
                                 c.count.eq(rwn), dent.rec.eq(1), dent.count.eq(rwn),
                                 rc.const.eq(0), rc.skip.eq(rskip), rc.nrec.eq(per)]
                with m.Case(3):
                    sbase = shared_base[layer * max(S, 1) + ent.expert] if S else 0
                    with m.If(ent.shared & seg_reads):
                        m.d.comb += [c.region.eq(HBRegionKind.DENSE),
                                     c.offset.eq(sbase + srow * n),
                                     c.count.eq(k * schunks), dent.count.eq(k * schunks)]
                    with m.Elif(ent.shared):
                        m.d.comb += [c.region.eq(HBRegionKind.DENSE), c.offset.eq(sbase),
                                     c.count.eq(n * g.rows), dent.count.eq(n * g.rows)]
                    with m.Elif(whole):
                        m.d.comb += [c.region.eq(HBRegionKind.EXPERT), c.slot.eq(src.slot),
                                     c.offset.eq(srow * k), c.count.eq(k * schunks),
                                     dent.count.eq(k * schunks)]
                    with m.Else():
                        m.d.comb += [c.region.eq(HBRegionKind.EXPERT), c.slot.eq(src.slot),
                                     c.offset.eq(0), c.count.eq(k * g.rows),
                                     dent.count.eq(k * g.rows)]
                with m.Case(4):
                    m.d.comb += [c.region.eq(HBRegionKind.EXPERT), c.slot.eq(src.lsb_slot),
                                 c.offset.eq(srow * (n - k)), c.count.eq((n - k) * schunks),
                                 dent.lsb.eq(1), dent.count.eq((n - k) * schunks)]
            m.d.comb += [dent.par.eq(ph), rc.par.eq(ph), dent.one.eq(dent.count == 1)]
            # room in the bank's queues, registered: a bank takes at most one
            # command every two cycles (a command is offered from its second
            # active cycle), so last cycle's room already counts its last write
            room = Signal(name=f"room{b}")
            m.d.sync += room.eq(dq[b].i.ready & (~need_rc | rps[b].cmd.ready))
            m.d.comb += self.hb_cmd[b].valid.eq(active & armed & ~acc[b] & room)
            hs = self.hb_cmd[b].valid & self.hb_cmd[b].ready
            m.d.comb += [fire[b].eq(hs), dq[b].i.valid.eq(hs), rps[b].cmd.valid.eq(hs & need_rc)]
        with m.If(active):
            m.d.sync += acc.eq(acc | fire)
            with m.If(done_all):
                m.d.sync += [acc.eq(0), active.eq(0)]

        # a pass's start clears its buffer's word count and error flag a cycle
        # later, from a flip-flop (`fresh_pass`): their clock enables then
        # do not wait for the start decision (no word of the pass can arrive
        # that early: its first command is offered a cycle after the start)
        fresh_pass = Signal(2)
        m.d.sync += fresh_pass.eq(0)
        # A refused or malformed word raises its bank's flag (`eset`, one
        # bit per buffer, a register written from the bank's own handshake);
        # the flags are ORed into `error` a cycle later, so no bank's demux
        # decision reaches the shared flag's input through an OR of all
        # banks (timing round 17: the lane's `hold` -> the word's `last` ->
        # the OR -> `error`, 6 LUTs). The flag is read when the pass's last
        # result leaves the vector unit, many cycles after its last word.
        eset = [Signal(2, name=f"eset{b}") for b in range(B)]
        e_any = Signal(2)
        m.d.comb += e_any.eq(Cat(*[Cat(*[eset[b][p] for b in range(B)]).any()
                                   for p in range(2)]))
        with m.If(fresh_pass.any() | e_any.any()):
            m.d.sync += ctr.error.eq((ctr.error & ~fresh_pass) | e_any)
        my_epoch = Signal(2)
        # the scheduler's outputs for buffer `ph`, selected into registers a
        # cycle late (no buffer select before JOB_WAIT's compares): they only
        # grow / rise within a pass, `epoch` and `total_valid` move at the
        # same edge, and `ph` changes many cycles before the next JOB_WAIT
        fresh = Signal()
        dec_ph = Signal.like(prog.decided[0])
        tot_ph = Signal.like(prog.total[0])
        tv_ph = Signal()
        m.d.sync += [fresh.eq(prog.epoch.bit_select(ph, 1) != my_epoch.bit_select(ph, 1)),
                     dec_ph.eq(decided[ph]), tot_ph.eq(total[ph]),
                     tv_ph.eq(prog.total_valid.bit_select(ph, 1))]
        with m.FSM(name="hb_reader"):
            with m.State("IDLE"):
                with m.If(pv.valid.bit_select(ph, 1)
                          & (pv.seq.bit_select(ph, 1) != my_seq.bit_select(ph, 1))
                          & ~const_busy.bit_select(ph, 1)):
                    m.d.sync += [my_seq.bit_select(ph, 1).eq(pv.seq.bit_select(ph, 1)),
                                 layer.eq(Mux(ph, pv.layer[1], pv.layer[0])),
                                 rbase.eq(router_base[Mux(ph, pv.layer[1], pv.layer[0])]),
                                 pbase.eq(params_base[Mux(ph, pv.layer[1], pv.layer[0])]),
                                 kind.eq(0), active.eq(1), j.eq(0),
                                 const_busy.bit_select(ph, 1).eq(1),
                                 fresh_pass.bit_select(ph, 1).eq(1)]
                    m.next = "ROUTER"
            with m.State("ROUTER"):
                with m.If(active & done_all):
                    m.d.sync += [kind.eq(1), active.eq(1)]
                    m.next = "CONST"
            with m.State("CONST"):
                with m.If(active & done_all):
                    m.next = "JOB_WAIT"
            with m.State("JOB_WAIT"):
                with m.If(fresh & (j < dec_ph)):
                    m.next = "JOB_READ"
                with m.Elif(fresh & tv_ph & (j == tot_ph)):
                    m.d.sync += [ph.eq(~ph),
                                 my_epoch.bit_select(ph, 1).eq(prog.epoch.bit_select(ph, 1))]
                    m.next = "IDLE"
            with m.State("JOB_READ"):
                jx = Mux(self.jobs.entry.shared, E + self.jobs.entry.expert, self.jobs.entry.expert)
                m.d.sync += [ent.eq(self.jobs.entry), src.eq(self.jobs.src), kind.eq(2),
                             rw0.eq(rec_w0[jx]), rwn.eq(rec_wn[jx]), rskip.eq(rec_skip[jx]),
                             active.eq(1), sproj.eq(0), sgrp.eq(0), srow.eq(0),
                             seg_reads.eq(self.jobs.entry.precision == TokenRole.DRAFT)]
                m.next = "REC"
            with m.State("REC"):
                with m.If(active & done_all):
                    with m.If(ent.shared | src.hb):
                        m.d.sync += [kind.eq(3), active.eq(1)]
                        m.next = "WEIGHTS"
                    with m.Else():
                        m.d.sync += j.eq(j + 1)
                        m.next = "JOB_WAIT"
            with m.State("WEIGHTS"):
                with m.If(active & done_all):
                    with m.If(ent.shared & seg_reads & ~s_last):
                        m.d.sync += [active.eq(1), srow.eq(srow + schunks), sgrp.eq(sgrp + 1)]
                        with m.If(sg_end):
                            m.d.sync += [sgrp.eq(0), sproj.eq(sproj + 1)]
                    with m.Elif(whole):
                        m.d.sync += [kind.eq(4), active.eq(1)]
                        m.next = "LSB"
                    with m.Else():
                        m.d.sync += j.eq(j + 1)
                        m.next = "JOB_WAIT"
            with m.State("LSB"):
                # a whole-resident job: the segment's LSB planes after its MSB
                # planes, then the next segment's MSB planes (WEIGHTS)
                with m.If(active & done_all):
                    with m.If(~s_last):
                        m.d.sync += [kind.eq(3), active.eq(1), srow.eq(srow + schunks),
                                     sgrp.eq(sgrp + 1)]
                        with m.If(sg_end):
                            m.d.sync += [sgrp.eq(0), sproj.eq(sproj + 1)]
                        m.next = "WEIGHTS"
                    with m.Else():
                        m.d.sync += j.eq(j + 1)
                        m.next = "JOB_WAIT"

        # ---- return-word demux per bank ---------------------------------------------------
        beats = [[], []]
        for b in range(B):
            # The head command and a spare next one are registers beside the
            # queue (`hd`/`hv`, `nx`/`nv`). The queue is read from flip-flops
            # only (`o.ready = o.valid & ~nv`: whenever the spare is free), so the
            # demux's pop - decided from the word in hand, the layer's latest
            # signal - ends at the head's clock enable instead of passing the
            # queue's read logic (round 12's worst path on three seeds of
            # five). On a pop the head takes the spare, or the queue's head
            # if it is read in the same cycle: one-word commands still pop
            # one per cycle.
            pop = Signal(name=f"pop{b}")
            hd = Signal(dest_l, name=f"hd{b}")
            hv = Signal(name=f"hv{b}")
            nx = Signal(dest_l, name=f"nx{b}")
            nv = Signal(name=f"nv{b}")
            refill = dq[b].o.valid & ~nv
            adv = pop | ~hv
            m.d.comb += dq[b].o.ready.eq(refill)
            with m.If(adv):
                m.d.sync += [hd.eq(Mux(nv, nx, dq[b].o.payload.as_value())),
                             hv.eq(nv | dq[b].o.valid), nv.eq(0)]
            with m.Elif(refill):
                m.d.sync += [nx.eq(dq[b].o.payload), nv.eq(1)]
            head = hd
            beat = hb_beat(g.s, g.L)(self.hb_data[b].payload)
            # `nxt1` = words of the command received or padded so far + 2: the
            # word after the one in hand is the command's last iff `nxt1 ==
            # count` (one compare of registers, no adder before it; `at_end_r`
            # below). Padding counts up like received words, so a short
            # command needs no second counter.
            nxt1 = Signal(dest_l.members["count"].width + 1, name=f"nxt1_{b}", init=2)

            def nxt_restart(nxt1=nxt1):
                m.d.sync += nxt1.eq(2)

            def nxt_step(nxt1=nxt1):
                m.d.sync += nxt1.eq(nxt1 + 1)
            pad = Signal(name=f"pad{b}")
            word = Signal(g.sv, name=f"word{b}")
            m.d.comb += word.eq(beat.sv.slices.as_value())
            dst_ok = Mux(head.rec, rps[b].word.ready,
                         Mux(head.lsb, self.lsb[b].ready, self.buf.space[b]))
            m.d.comb += self.hb_data[b].ready.eq(hv & ~pad & dst_ok)
            take = self.hb_data[b].valid & self.hb_data[b].ready
            # Each destination's write is worked out from its own room only
            # (the same function as `(take & ~error | pad & dst_ok)` split by
            # `head.rec`): the record FIFO's write and level never see the
            # weight buffer's `space`, which had been the layer's critical
            # path through `dst_ok` although the two never meet in one word.
            # The LSB stream's `valid` leaves its room out (a stream's valid
            # does not wait for its ready; the transfer is the same write).
            def write_to(room):
                return ((self.hb_data[b].valid & hv & ~pad & room & ~beat.error)
                        | (pad & room))
            m.d.comb += [rps[b].word.valid.eq(head.rec & write_to(rps[b].word.ready)),
                         rps[b].word.payload.eq(Mux(pad, 0, word)),
                         self.buf.we[b].eq(~head.rec & ~head.lsb & write_to(self.buf.space[b])),
                         self.buf.wdata[b].eq(Mux(pad, 0, word)),
                         self.lsb[b].valid.eq(head.lsb & write_to(1)),
                         self.lsb[b].payload.eq(Mux(pad, 0, word))]
            for p in range(2):
                beats[p].append(take & ~beat.error & (head.par == p))
            # "the word in hand is the last" without a compare after the
            # registers: a head that was already the head last cycle (`hold`)
            # has it registered (`at_end_r`, worked out for both outcomes as
            # `nxt1` moves), a new head brings it (`one`, as `nxt1` restarts)
            at_end = Signal(name=f"at_end{b}")
            at_end_r = Signal(name=f"at_end_r{b}")
            hold = Signal(name=f"hold{b}")
            m.d.comb += at_end.eq(Mux(hold, at_end_r, head.one))
            nxt_inc = (take & ~beat.error & ~at_end) | (pad & dst_ok & ~at_end)
            m.d.sync += [hold.eq(hv & ~pop),
                         at_end_r.eq(Mux(nxt_inc, nxt1 == head.count, at_end))]
            m.d.sync += eset[b].eq(0)
            with m.If(take):
                with m.If(beat.error):
                    # the refused word and the rest of the command are padded
                    m.d.sync += [eset[b].bit_select(head.par, 1).eq(1), pad.eq(1)]
                with m.Elif(at_end):
                    m.d.comb += pop.eq(1)
                    nxt_restart()
                    with m.If(~beat.last):
                        m.d.sync += eset[b].bit_select(head.par, 1).eq(1)
                with m.Elif(beat.last):
                    m.d.sync += [eset[b].bit_select(head.par, 1).eq(1), pad.eq(1)]
                    nxt_step()
                with m.Else():
                    nxt_step()
            with m.If(pad & dst_ok):
                nxt_step()
                with m.If(at_end):
                    m.d.comb += pop.eq(1)
                    m.d.sync += pad.eq(0)
                    nxt_restart()
        for p in range(2):
            # counted a cycle after the handshakes (registered, so that the
            # ready logic does not feed the counter's adder): the count is read
            # only when the pass is done, long after its last word
            beats_r = [Signal(name=f"beat_r{p}_{b}") for b in range(B)]
            m.d.sync += [beats_r[b].eq(beats[p][b]) for b in range(B)]
            got = Signal(range(B + 1), name=f"got{p}")
            m.d.comb += got.eq(sum(beats_r))
            with m.If(fresh_pass[p] | (got != 0)):
                m.d.sync += ctr.count[p].eq(Mux(fresh_pass[p], 0, ctr.count[p]) + got)
        return m
