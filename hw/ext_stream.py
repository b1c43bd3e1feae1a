"""External-memory stream engine: an AXI4 read master that reads expert
slices (and the dense image) from LPDDR in INCR bursts and routes every beat,
as it arrives, to the PE stream, the HB fill stream, or both.

*What* one command delivers — which bytes, in which order, to which stream,
and what a failed command delivers instead — is the contract of
:mod:`elmoe3d.golden.ext_stream`, on the layouts of :mod:`elmoe3d.golden.layout`.
This module chooses *how*: the burst cut, the pipelining, the cycle a beat is
accepted.

How it works
------------
An expert image is a sequence of *runs*, one per ``(segment, plane)``
(``lpddr_plane_runs``); a command reads the runs of the planes in its read
mask. Two identical :class:`RunWalker` s walk them, one per side:

* **Address side.** ``cmd`` → register slice → :class:`CommandCheck` (range
  check against the LPDDR window, DENSE row offset) → :class:`RunWalker` →
  :class:`BurstCutter` → register slice → the AR register. The cutter merges
  contiguous runs and cuts them at every ``blk``-beat aligned boundary, where
  ``blk`` is the largest power of two not above ``axi_max_burst`` nor 4 KiB:
  so a burst never crosses 4 KiB and the planner needs no 4 KiB arithmetic.
  It computes the next burst while the AR register holds the current one. A
  burst is issued only while fewer than ``axi_outstanding`` are in flight
  (counted from the cycle it enters the AR register until its last R beat);
  each queues a descriptor (length, last of its command) for the data side.
* **Data side** (:class:`BeatRouter`). ``m_axi_r*`` → register slice. Bursts
  are framed by their ``ARLEN`` (a descriptor per burst and a registered
  last-beat flag), never by ``RLAST``, which is only *checked*: a wrong
  ``RLAST`` fails one command and cannot shift later data. The second walker
  gives every beat its plane, row, banks and HB offset from registers set a
  beat ahead. A beat is accepted when every stream it may write has room, so
  one R beat feeds the PE and the fill stream in the same cycle.

One AXI ID (0): R data returns in issue order, which is read order.

Errors. A beat with ``RRESP`` SLVERR/DECERR, with EXOKAY, with an ``RID``
other than 0 or with ``RLAST`` not on exactly the ``ARLEN``-th beat fails
its command: its PE stream (if still open) gets one beat with ``last`` and
``error``; that beat and the rest of the command are read and dropped; the
address side issues no further burst of the command (at most the bursts
already in flight, fewer than ``axi_outstanding``, plus the one the AR
register holds); the fill ends with ABORT; the response carries the code. A
command outside the LPDDR window (RANGE) issues nothing. The next command
is unaffected; nothing needs a reset.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from ..config import Config, require_config
from ..geometry import floor_log2, lpddr_layout, row_bytes, segments
from ..golden.ext_stream import AXI_ID
from ..golden.vocab import AXI_4K, AxiResp
from . import vocab as hv
from .streams import RegisterSlice
from .vocab import ExtErrorCode, ExtKindCode, FillBeatKind, HBRegionKind, bits

__all__ = ["ExtStream", "CommandCheck", "RunWalker", "BurstCutter", "BeatRouter",
           "ExtGeometry", "ext_params"]


#: Width of the command tag that the run walkers, the router's drop and the
#: address side's abort flush use to tell one command's runs from the next.
#: A flush (a refused, empty or failed command ending) drops the runs of its
#: tag in the data-side walker and the register slice in front of the
#: router; up to 4 later commands can sit there (2 in the slice, the
#: walker's output register, the walker's command), so the tag must not
#: repeat within 5 commands: 3 bits. (It was 2 bits: a refused or empty
#: command whose end step came while the walker held the command 4 after it
#: dropped that command's run -- its beats went to the next command's run,
#: responses were lost and the engine hung; found by the short-command mix
#: of the random test, regression ``test_ext_tag_alias_regression``.)
#: :attr:`ExtStream.tag_bits` defaults to it.
TAG_BITS = 3


class ExtGeometry:
    """Everything the engine's components derive from a :class:`Config`
    (sizes, constants and the internal payload layouts)."""

    def __init__(self, cfg: Config, tag_bits: int = TAG_BITS):
        require_config("ExtStream", cfg)
        self.cfg = cfg
        self.tag_bits = tag_bits                               # command tag width
        v = hv.vocab(cfg)
        self.vocab = v
        self.n, self.k, self.B, self.fw = cfg.planes, cfg.hb_planes_eff, cfg.pes, cfg.fill_words
        self.sv = cfg.slice_vector_bits
        self.bb = cfg.axi_beat_bits // 8                       # bytes per beat
        self.lbb = floor_log2(self.bb)
        self.addr_bits = cfg.axi_addr_bits
        self.aw = self.addr_bits - self.lbb                    # beat-address width
        self.id_bits = cfg.axi_id_bits
        self.cmd_id_bits = hv.CMD_ID_BITS
        H, I, L = cfg.hidden, cfg.ffn, cfg.lanes
        segs = segments(cfg)
        self.nseg = len(segs)
        self.n_gu = 2 * I // self.B                             # GATE + UP segments
        self.ch_g, self.ch_d = H // L, I // L                   # chunks per segment
        for i, s in enumerate(segs):                            # the walker's assumption
            assert s.chunks == (self.ch_g if i < self.n_gu else self.ch_d)
        bpr = self.B // self.fw                                 # beats per expert row
        self.bpr = bpr
        self.rb_g, self.rb_d = self.ch_g * bpr, self.ch_d * bpr  # beats per run
        self.rows = cfg.expert_rows
        self.S, self.SW, self.D = cfg.tag_slots, cfg.slot_words, cfg.dense_words
        self.ob = max(bits(max(self.SW, self.D, 2)), 1)        # FillBeat.offset width
        self.dense_beats = self.D * bpr
        self.run_bits = max(self.rb_g, self.rb_d, self.dense_beats).bit_length() + 1
        self.max_burst = cfg.axi_max_burst
        lim = min(self.max_burst, AXI_4K // self.bb)
        self.blk = 1 << floor_log2(lim)                        # burst block (power of two)
        self.outstanding = cfg.axi_outstanding
        self.seq_bits = (self.outstanding + 4).bit_length() + 1
        lay = lpddr_layout(cfg)
        self.lpddr_base, self.lpddr_bytes = lay.base, lay.total_bytes
        self.dense_base = lay.dense_base
        self.row_bytes = row_bytes(cfg)
        self.slot_bits = bits(self.S)
        self.plane_bits = bits(self.n)
        self.row_bits = bits(self.rows)
        # -- payloads between the stages (named; one class per geometry) -----------
        #: ``ExtWalk``: CommandCheck -> RunWalker, one checked command
        self.walk_t = hv.struct("ExtWalk", {
            "kind": ExtKindCode, "null": 1, "base": unsigned(self.aw),
            "mask": unsigned(self.n), "pe_mask": unsigned(self.n), "fill": 1,
            "o0": unsigned(self.ob), "dbeats": unsigned(self.run_bits),
            "pe_stream": 1, "fill_end": 1, "range_err": 1,
            "id": unsigned(self.cmd_id_bits), "slot": unsigned(self.slot_bits),
            "tag": unsigned(self.tag_bits)})
        #: ``ExtRun``: RunWalker -> BurstCutter / BeatRouter, one run of a command
        self.run_t = hv.struct("ExtRun", {
            "addr": unsigned(self.aw), "beats": unsigned(self.run_bits),
            "room": range(self.blk + 1), "last": 1, "contig": 1, "single": 1, "plane": unsigned(self.plane_bits),
            "row0": unsigned(self.row_bits), "hb_off0": unsigned(self.ob), "to_pe": 1,
            "to_fill": 1, "last_pe": 1, "region": HBRegionKind, "pe_stream": 1,
            "fill_end": 1, "range_err": 1, "id": unsigned(self.cmd_id_bits),
            "slot": unsigned(self.slot_bits), "tag": unsigned(self.tag_bits)})
        #: ``AxiBurst``: BurstCutter -> the AR channel, one burst
        self.burst_t = hv.struct("AxiBurst", {
            "addr": unsigned(self.aw), "len": unsigned(8), "last": 1, "end": 1})
        #: ``BurstDesc``: the address side -> BeatRouter, the framing of one burst
        self.desc_t = hv.struct("BurstDesc", {"len": unsigned(8), "single": 1, "last": 1,
                                              "end": 1})
        #: ``AxiRBeat``: an R beat, with RID/RRESP already decoded at the
        #: register slice's input (-> BeatRouter)
        self.r_t = hv.struct("AxiRBeat", {
            "data": unsigned(cfg.axi_beat_bits), "last": 1, "bad_id": 1, "exokay": 1,
            "slverr": 1, "decerr": 1})
        #: output FIFO depth (pe, fill). The router's writes are registered
        #: and so is its view of the room (``level < out_depth - 3`` a cycle
        #: ago): two writes may be in flight when it decides the next.
        self.out_depth = 8


def _ge(value, const: int):
    """``value >= const`` for an unsigned value (constant 1 when ``const`` is 0)."""
    return value >= const if const > 0 else Const(1, 1)


class CommandCheck(wiring.Component):
    """Command stage: range check and the walk descriptor of one command.

    ``i`` takes ``ExtCommand``; ``o`` gives the walk descriptor (registered).
    A command is checked in two registered steps (three plus
    ``bits(dense_words)`` when a dense row is not a power of two of bytes and
    the row offset needs a division): about one command per 3 cycles.
    """

    def __init__(self, geo: ExtGeometry):
        self.geo = geo
        super().__init__({"i": In(stream.Signature(geo.vocab.ExtCommand)),
                          "o": Out(stream.Signature(geo.walk_t))})

    def elaborate(self, platform):
        m = Module()
        g = self.geo
        c = Signal(g.vocab.ExtCommand)
        pow2 = g.row_bytes & (g.row_bytes - 1) == 0
        lrb = floor_log2(g.row_bytes)
        hi_lim = g.lpddr_base + g.lpddr_bytes - g.cfg.expert_bytes
        dense_span = g.D * g.row_bytes
        # step A results
        e_ok = Signal()
        d_in = Signal()                       # addr within the dense image
        d_off = Signal(range(max(dense_span, 2)))
        # the dense length check ``o0 + length <= D`` as ``o0 <= D - length``,
        # with ``D - length`` taken a step early (it needs only the command):
        # JUDGE is then one comparison of two registers (was an adder chain
        # into the comparison, the block's critical path)
        len_ok = Signal()                     # 1 <= length <= D
        d_lim = Signal(range(max(g.D, 2)))    # D - length
        # step B / divider
        o0 = Signal(range(max(g.D, 2)))
        rem = Signal(range(max(dense_span, 2)))
        dv = Signal(range(max(dense_span, 2) * 2))
        steps = max(g.D, 2).bit_length()
        cnt = Signal(range(steps + 1))
        tag = Signal(g.tag_bits)
        hbm = Const((1 << g.k) - 1, g.n)
        o = self.o.payload
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.FSM(name="check") as fsm:
            with m.State("IDLE"):
                with m.If(self.i.valid):
                    p = self.i.payload
                    m.d.sync += c.eq(p)
                    m.d.sync += [
                        # (comparisons with a zero base are left out: always true, and
                        # Verilator's lint flags them)
                        e_ok.eq((p.addr[:g.lbb] == 0 if g.lbb else 1) & _ge(p.addr, g.lpddr_base)
                                & (p.addr <= hi_lim) if hi_lim >= g.lpddr_base else 0),
                        d_in.eq(_ge(p.addr, g.dense_base) & (p.addr < g.dense_base + dense_span)),
                        d_off.eq(p.addr - g.dense_base),
                        len_ok.eq((p.length != 0) & (p.length <= g.D)),
                        d_lim.eq(g.D - p.length),
                    ]
                    m.next = "OFFSET"
            with m.State("OFFSET"):
                if pow2:
                    m.d.sync += [o0.eq(d_off >> lrb), rem.eq(d_off[:lrb] if lrb else 0)]
                    m.next = "JUDGE"
                else:
                    # restoring division by the (constant) row size
                    m.d.sync += [rem.eq(d_off), o0.eq(0), dv.eq(g.row_bytes << (steps - 1)),
                                 cnt.eq(steps)]
                    m.next = "DIVIDE"
            if not pow2:
                with m.State("DIVIDE"):
                    with m.If(cnt == 0):
                        m.next = "JUDGE"
                    with m.Else():
                        ge = rem >= dv
                        m.d.sync += [rem.eq(Mux(ge, rem - dv, rem)), o0.eq(Cat(ge, o0)),
                                     dv.eq(dv >> 1), cnt.eq(cnt - 1)]
            is_exp = c.kind == ExtKindCode.EXPERT
            rng = Signal()
            mask = Signal(g.n)
            dbeats = Signal(g.run_bits)
            with m.State("JUDGE"):
                d_ok = d_in & (rem == 0) & len_ok & (o0 <= d_lim)
                m.d.sync += [rng.eq(Mux(is_exp, ~e_ok, ~d_ok)),
                             mask.eq(Mux(is_exp, c.plane_mask | Mux(c.fill, hbm, 0), 0)),
                             dbeats.eq(c.length * g.bpr)]
                m.next = "EMIT"
            with m.State("EMIT"):
                with m.If(~self.o.valid | self.o.ready):
                    m.d.sync += [
                        o.kind.eq(c.kind), o.null.eq(rng | (is_exp & (mask == 0))),
                        o.base.eq(c.addr[g.lbb:]), o.mask.eq(mask),
                        o.pe_mask.eq(Mux(is_exp, c.plane_mask, 0)), o.fill.eq(c.fill & is_exp),
                        o.o0.eq(o0), o.dbeats.eq(dbeats),
                        o.pe_stream.eq(is_exp & (c.plane_mask != 0)),
                        o.fill_end.eq(~is_exp | c.fill), o.range_err.eq(rng),
                        o.id.eq(c.id), o.slot.eq(c.slot), o.tag.eq(tag),
                        self.o.valid.eq(1), tag.eq(tag + 1)]
                    m.next = "IDLE"
        # outside the FSM's case statement (Icarus: see TOOLCHAIN.md)
        m.d.comb += self.i.ready.eq(fsm.ongoing("IDLE"))
        return m


class RunWalker(wiring.Component):
    """Walks the runs of one command at a time: for an EXPERT every
    ``(segment, plane)`` of its read mask in address order (segment by
    segment, planes increasing), for a DENSE one run, for a refused or empty
    command one *null* run (``beats = 0``). Each run carries its LPDDR beat
    address, length, the routing of its beats (plane, first row, HB offset,
    PE/fill) and the command's identity. One run per cycle; the output is a
    register. ``flush`` (with ``flush_tag``) drops every run of the command
    with that tag, in the output register or still to come, in one cycle.
    """

    def __init__(self, geo: ExtGeometry):
        self.geo = geo
        super().__init__({"i": In(stream.Signature(geo.walk_t)),
                          "o": Out(stream.Signature(geo.run_t)),
                          "flush": In(1), "flush_tag": In(geo.tag_bits)})

    def elaborate(self, platform):
        m = Module()
        g = self.geo
        n, k = g.n, g.k
        c = Signal(g.walk_t)
        busy = Signal()
        seg = Signal(range(max(g.nseg, 2)))
        down = Signal()                       # a DOWN segment (I/L chunks)
        last_seg = Signal()
        row0 = Signal(range(max(g.rows, 2)))
        seg_addr = Signal(g.aw)
        hb_seg = Signal(g.ob)
        q = Signal(g.plane_bits)
        first_q = Signal(g.plane_bits)
        top_q = Signal(g.plane_bits)
        top_pe = Signal(g.plane_bits)
        contig = Signal()

        def lowest(mask):
            out = Const(0, g.plane_bits)
            for p in reversed(range(n)):
                out = Mux(mask[p], p, out)
            return out

        def highest(mask):
            out = Const(0, g.plane_bits)
            for p in range(n):
                out = Mux(mask[p], p, out)
            return out

        m.d.comb += self.i.ready.eq(~busy)
        with m.If(self.i.valid & ~busy):
            p = self.i.payload
            m.d.sync += [busy.eq(1), c.eq(p), seg.eq(0), down.eq(0),
                         last_seg.eq(g.nseg == 1), row0.eq(0), seg_addr.eq(p.base),
                         hb_seg.eq(0), q.eq(lowest(p.mask)), first_q.eq(lowest(p.mask)),
                         top_q.eq(highest(p.mask)), top_pe.eq(highest(p.pe_mask)),
                         contig.eq(0)]

        o = self.o.payload
        flushing = self.flush & busy & (c.tag == self.flush_tag)
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(self.flush & self.o.valid & (o.tag == self.flush_tag)):
            m.d.sync += self.o.valid.eq(0)

        nq = Signal(g.plane_bits)
        nq_v = Const(0, g.plane_bits)
        for p in reversed(range(1, n)):          # plane 0 is never after q
            nq_v = Mux(c.mask[p] & (q < p), p, nq_v)
        m.d.comb += nq.eq(nq_v)
        rb = Mux(down, g.rb_d, g.rb_g)
        ch = Mux(down, g.ch_d, g.ch_g)
        def table(step, width):
            # `q * step` as a Mux chain, not an Array: an Array becomes a
            # `case` in an `always @*` that Icarus never evaluates while `q`
            # keeps its reset value (see TOOLCHAIN.md)
            out = Const(0, width)
            for p in range(1, n):
                out = Mux(q == p, p * step, out)
            return out
        off = Mux(down, table(g.rb_d, g.aw), table(g.rb_g, g.aw))
        hb_q = Mux(down, table(g.ch_d, g.ob), table(g.ch_g, g.ob))
        single_g, single_d = int(g.rb_g == 1), int(g.rb_d == 1)
        lb = floor_log2(g.blk)

        def room(addr_lo):
            # beats from an address to the next burst-block boundary (for the cutter)
            return g.blk - addr_lo[:lb] if lb else 1

        with m.If(busy & (~self.o.valid | self.o.ready) & ~flushing):
            info = [o.id.eq(c.id), o.slot.eq(c.slot), o.tag.eq(c.tag),
                    o.pe_stream.eq(c.pe_stream), o.fill_end.eq(c.fill_end),
                    o.range_err.eq(c.range_err), self.o.valid.eq(1)]
            m.d.sync += info
            with m.If(c.null):
                m.d.sync += [o.addr.eq(c.base), o.beats.eq(0), o.room.eq(0), o.last.eq(1),
                             o.contig.eq(0),
                             o.single.eq(0), o.plane.eq(0), o.row0.eq(0), o.hb_off0.eq(0),
                             o.to_pe.eq(0), o.to_fill.eq(0), o.last_pe.eq(0),
                             o.region.eq(Mux(c.kind == ExtKindCode.DENSE, HBRegionKind.DENSE,
                                             HBRegionKind.EXPERT)),
                             busy.eq(0)]
            with m.Elif(c.kind == ExtKindCode.DENSE):
                m.d.sync += [o.addr.eq(c.base), o.beats.eq(c.dbeats), o.room.eq(room(c.base)),
                             o.last.eq(1),
                             o.contig.eq(0), o.single.eq(c.dbeats == 1), o.plane.eq(0),
                             o.row0.eq(0), o.hb_off0.eq(c.o0), o.to_pe.eq(0), o.to_fill.eq(1),
                             o.last_pe.eq(0), o.region.eq(HBRegionKind.DENSE), busy.eq(0)]
            with m.Else():
                last_q = q == top_q
                m.d.sync += [
                    o.addr.eq(seg_addr + off), o.beats.eq(rb),
                    o.room.eq(room((seg_addr[:lb] + off[:lb])[:lb]) if lb else 1),
                    o.last.eq(last_seg & last_q), o.contig.eq(contig),
                    o.single.eq(Mux(down, single_d, single_g)), o.plane.eq(q), o.row0.eq(row0),
                    o.hb_off0.eq(hb_seg + hb_q),
                    o.to_pe.eq(c.pe_mask.bit_select(q, 1)), o.to_fill.eq(c.fill & (q < k)),
                    o.last_pe.eq(last_seg & (q == top_pe)), o.region.eq(HBRegionKind.EXPERT)]
                with m.If(last_q):
                    m.d.sync += [seg.eq(seg + 1), down.eq(down | (seg + 1 == g.n_gu)),
                                 last_seg.eq(seg + 2 == g.nseg), row0.eq(row0 + ch),
                                 seg_addr.eq(seg_addr + n * rb), hb_seg.eq(hb_seg + k * ch),
                                 q.eq(first_q),
                                 contig.eq((top_q == n - 1) & (first_q == 0))]
                    with m.If(last_seg):
                        m.d.sync += busy.eq(0)
                with m.Else():
                    m.d.sync += [q.eq(nq), contig.eq(nq == q + 1)]
        with m.If(flushing):
            m.d.sync += busy.eq(0)
        return m


class BurstCutter(wiring.Component):
    """Runs in, AXI bursts out (registered). Contiguous runs are merged and
    cut at every ``blk``-beat aligned boundary; a null run becomes an *end*
    item (the command issues nothing more). The last burst of a command has
    ``last``. One burst per cycle at most; a run piece per cycle."""

    def __init__(self, geo: ExtGeometry):
        self.geo = geo
        super().__init__({"i": In(stream.Signature(geo.run_t)),
                          "o": Out(stream.Signature(geo.burst_t)),
                          "flush": In(1)})

    def elaborate(self, platform):
        m = Module()
        g = self.geo
        blk, lb = g.blk, floor_log2(g.blk)
        cur_valid = Signal()
        cur_addr = Signal(g.aw)
        cur_left = Signal(g.run_bits)
        cur_last = Signal()
        cur_null = Signal()
        cur_contig = Signal()
        b_open = Signal()
        b_addr = Signal(g.aw)
        b_len = Signal(range(blk + 1))
        b_full = Signal()
        b_last = Signal()

        # Registers a piece ahead: beats from cur_addr to the next block
        # boundary (`to_blk`), whether the rest of the run fits in them
        # (`fits`) and the next piece's length (`piece`).
        to_blk = Signal(range(blk + 1))
        reach = Signal(range(2 * blk + 1))    # to_blk + blk: what two pieces reach
        fits = Signal()
        piece = Signal(range(blk + 1))
        run_done = fits

        o = self.o.payload
        can_out = Signal()
        emit = Signal()          # the open burst is complete: send it
        null_go = Signal()       # a null run: send an end item
        piece_go = Signal()      # take the next piece of the current run
        open_new = Signal()
        consumed = Signal()
        m.d.comb += [
            can_out.eq(~self.o.valid | self.o.ready),
            emit.eq(b_open & (b_full | (cur_valid & ~cur_null & ~cur_contig))),
            null_go.eq(~emit & cur_valid & cur_null & can_out),
            piece_go.eq(cur_valid & ~cur_null & (~emit | can_out)),
            open_new.eq(emit | ~b_open),
            consumed.eq((piece_go & run_done) | null_go),
            self.i.ready.eq(~cur_valid | consumed),
        ]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(emit & can_out):
            m.d.sync += [o.addr.eq(b_addr), o.len.eq(b_len - 1), o.last.eq(b_last),
                         o.end.eq(0), self.o.valid.eq(1), b_open.eq(0)]
        with m.If(null_go):
            m.d.sync += [o.addr.eq(cur_addr), o.len.eq(0), o.last.eq(1), o.end.eq(1),
                         self.o.valid.eq(1)]
        with m.If(piece_go):
            m.d.sync += [b_open.eq(1), b_full.eq((piece == to_blk) | (cur_last & run_done)),
                         b_last.eq(cur_last & run_done),
                         b_addr.eq(Mux(open_new, cur_addr, b_addr)),
                         b_len.eq(Mux(open_new, piece, b_len + piece)),
                         cur_contig.eq(1)]
            # A piece either ends the run (then the next run is loaded and these
            # do not matter) or reaches the block boundary: so the next piece
            # starts at the next block, whatever `piece` was -- no adder on it.
            rest = cur_left - to_blk
            nfits = cur_left <= reach          # = rest <= blk, without the subtraction
            m.d.sync += [cur_left.eq(rest), to_blk.eq(blk), reach.eq(2 * blk), fits.eq(nfits),
                         piece.eq(Mux(nfits, rest, blk))]
            if lb:
                m.d.sync += cur_addr.eq(Cat(Const(0, lb), cur_addr[lb:] + 1))
            else:
                m.d.sync += cur_addr.eq(cur_addr + 1)
        with m.If(consumed):
            m.d.sync += cur_valid.eq(0)
        with m.If(self.i.valid & self.i.ready):
            r = self.i.payload
            m.d.sync += [cur_valid.eq(1), cur_addr.eq(r.addr), cur_left.eq(r.beats),
                         cur_last.eq(r.last), cur_null.eq(r.beats == 0),
                         cur_contig.eq(r.contig)]
            m.d.sync += [to_blk.eq(r.room), reach.eq(r.room + blk), fits.eq(r.beats <= r.room),
                         piece.eq(Mux(r.beats <= r.room, r.beats, r.room))]
        with m.If(self.flush):
            m.d.sync += [cur_valid.eq(0), b_open.eq(0), self.o.valid.eq(0)]
        return m


class BeatRouter(wiring.Component):
    """Data side: frames R beats into bursts (descriptor + registered
    last-beat flag), checks ``RID``/``RRESP``/``RLAST``, routes each beat by
    its run (``runs``, from the data side's walker) to the PE and fill FIFOs,
    ends each command (COMMIT/ABORT and the response, written a cycle later
    from a holding register) and reports failures to the address side.

    Ports ``pe_*``, ``fill_*``, ``rsp_*`` are FIFO write ports (``*_en``,
    ``*_data``, ``*_rdy``)."""

    def __init__(self, geo: ExtGeometry):
        self.geo = geo
        v = geo.vocab
        super().__init__({
            "r": In(stream.Signature(geo.r_t)),
            "desc": In(stream.Signature(geo.desc_t)),
            "runs": In(stream.Signature(geo.run_t)),
            "pe_data": Out(v.ExtBeat), "pe_en": Out(1), "pe_room": In(1),
            "fill_data": Out(v.FillBeat), "fill_en": Out(1), "fill_room": In(1),
            "rsp_data": Out(v.ExtResponse), "rsp_en": Out(1), "rsp_rdy": In(1),
            "failed": Out(1), "seq": Out(geo.seq_bits), "burst_done": Out(1),
            "drop": Out(1), "drop_tag": Out(geo.tag_bits)})

    def elaborate(self, platform):
        m = Module()
        g = self.geo
        B, fw = g.B, g.fw
        r, d = self.r.payload, self.desc.payload
        # -- the current run, a beat ahead -----------------------------------------
        cur = Signal(g.run_t)
        cur_valid = Signal()
        rleft = Signal(g.run_bits)
        run_end = Signal()
        b0 = Signal(range(max(B, 2)))
        bank_end = Signal()
        row = Signal(g.row_bits)
        hb_off = Signal(g.ob)
        # -- burst framing ------------------------------------------------------------
        bfirst = Signal(init=1)
        bleft = Signal(8)
        bzero = Signal()
        beat_last = Signal()
        m.d.comb += beat_last.eq(Mux(bfirst, d.single, bzero))
        # -- command state ------------------------------------------------------------
        failed = Signal()
        fcode = Signal(ExtErrorCode)
        pe_done = Signal()
        seq = Signal(g.seq_bits)
        pend = Signal()
        pend_fill = Signal()
        pend_region = Signal(HBRegionKind)
        pend_slot = Signal(g.slot_bits)
        pend_rsp = Signal(g.vocab.ExtResponse)
        m.d.comb += [self.failed.eq(failed), self.seq.eq(seq)]

        pe_open = cur.pe_stream & ~pe_done & ~failed
        prot = r.bad_id | r.exokay | (r.last != beat_last)
        code = Signal(ExtErrorCode)
        m.d.comb += code.eq(Mux(prot, ExtErrorCode.PROTOCOL,
                                Mux(r.slverr, ExtErrorCode.SLVERR,
                                    Mux(r.decerr, ExtErrorCode.DECERR, ExtErrorCode.OK))))
        bad = Signal()
        m.d.comb += bad.eq((code != ExtErrorCode.OK) & ~failed)
        ends_cmd = d.last & beat_last
        need_fill = cur.to_fill & ~failed
        take = Signal()
        m.d.comb += take.eq(self.r.valid & self.desc.valid & ~d.end & cur_valid
                            & (~pe_open | self.pe_room)
                            & (~need_fill | (self.fill_room & ~(pend & pend_fill)))
                            & (~d.last | ~pend))
        end_step = Signal()
        m.d.comb += end_step.eq(self.desc.valid & d.end & cur_valid & ~pend
                                & (~pe_open | self.pe_room))
        m.d.comb += [self.r.ready.eq(take), self.burst_done.eq(take & beat_last),
                     self.desc.ready.eq((take & beat_last) | end_step)]

        # The FIFO writes leave from registers (pe_en/pe_data, fill_en/fill_data):
        # `*_room` already leaves space for the write in flight.
        words = [r.data[i * g.sv:(i + 1) * g.sv] for i in range(fw)]
        # A marker beat (error / end) carries zero words, plane, row and bank.
        # The zeroing is applied after the PE data register, from a registered
        # copy of `marker`: as a mux in front of the register it became the
        # synchronous reset of every data flop, driven by the framing check
        # (bzero -> RLAST compare -> bad -> marker -> LSR), the critical path.
        pe_w = Signal(g.vocab.ExtBeat)
        pe_q = Signal(g.vocab.ExtBeat)
        pe_mk = Signal()
        marker = bad | end_step
        m.d.comb += [pe_w.plane.eq(cur.plane), pe_w.row.eq(row), pe_w.bank.eq(b0),
                     pe_w.id.eq(cur.id),
                     pe_w.last.eq(marker | (cur.last_pe & run_end)), pe_w.error.eq(marker)]
        for i in range(fw):
            m.d.comb += pe_w.words[i].eq(words[i])
        pe_en = Signal()
        m.d.comb += pe_en.eq((take & ((cur.to_pe & ~failed & ~bad) | (bad & pe_open)))
                             | (end_step & pe_open))
        m.d.sync += [self.pe_en.eq(pe_en), pe_q.eq(pe_w), pe_mk.eq(marker)]
        m.d.comb += [self.pe_data.id.eq(pe_q.id), self.pe_data.last.eq(pe_q.last),
                     self.pe_data.error.eq(pe_q.error),
                     self.pe_data.plane.eq(Mux(pe_mk, 0, pe_q.plane)),
                     self.pe_data.row.eq(Mux(pe_mk, 0, pe_q.row)),
                     self.pe_data.bank.eq(Mux(pe_mk, 0, pe_q.bank))]
        for i in range(fw):
            m.d.comb += self.pe_data.words[i].eq(Mux(pe_mk, 0, pe_q.words[i]))
        with m.If(pe_en & pe_w.last):
            m.d.sync += pe_done.eq(1)

        fl = Signal(g.vocab.FillBeat)
        pend_out = Signal()
        m.d.comb += pend_out.eq(pend & self.rsp_rdy & (~pend_fill | self.fill_room))
        data_fill = take & cur.to_fill & ~failed & ~bad
        end_fill = Signal()                   # the fill FIFO's write port: the end beat
        m.d.comb += end_fill.eq(pend_out & pend_fill)
        m.d.comb += [
            fl.kind.eq(Mux(end_fill, Mux(pend_rsp.error == ExtErrorCode.OK, FillBeatKind.COMMIT,
                                         FillBeatKind.ABORT), FillBeatKind.DATA)),
            fl.region.eq(Mux(end_fill, pend_region, cur.region)),
            fl.slot.eq(Mux(end_fill, pend_slot,
                           Mux(cur.region == HBRegionKind.EXPERT, cur.slot, 0))),
            fl.offset.eq(Mux(end_fill, 0, hb_off)), fl.bank.eq(Mux(end_fill, 0, b0)),
            self.rsp_data.eq(pend_rsp), self.rsp_en.eq(pend_out)]
        for i in range(fw):
            m.d.comb += fl.words[i].eq(Mux(end_fill, 0, words[i]))
        m.d.sync += [self.fill_en.eq(data_fill | end_fill), self.fill_data.eq(fl)]
        with m.If(pend_out):
            m.d.sync += pend.eq(0)

        # -- per beat -----------------------------------------------------------------
        with m.If(take):
            with m.If(bad):
                m.d.sync += [failed.eq(1), fcode.eq(code)]
            # framing
            blen = Mux(bfirst, d.len, bleft)
            with m.If(beat_last):
                m.d.sync += bfirst.eq(1)
            with m.Else():
                m.d.sync += [bfirst.eq(0), bleft.eq(blen - 1), bzero.eq(blen == 1)]
            # position within the run
            with m.If(bank_end):
                m.d.sync += [b0.eq(0), bank_end.eq(B == fw), row.eq(row + 1),
                             hb_off.eq(hb_off + 1)]
            with m.Else():
                m.d.sync += [b0.eq(b0 + fw), bank_end.eq(b0 == B - 2 * fw)]
            m.d.sync += [rleft.eq(rleft - 1), run_end.eq(rleft == 1)]
            with m.If(run_end):
                m.d.sync += cur_valid.eq(0)
        # After a command that ended early (abort, refused), its remaining runs
        # in the register slice in front of `runs` are popped and dropped; the
        # walker itself is flushed in the same cycle as the end (`drop`).
        dropping = Signal()
        dtag = Signal(g.tag_bits)
        stale = self.runs.valid & (self.runs.payload.tag == dtag)
        with m.If(dropping & ~stale):
            m.d.sync += dropping.eq(0)
        load = self.runs.valid & ~dropping & (~cur_valid | (take & run_end))
        m.d.comb += self.runs.ready.eq(load | (dropping & stale))
        with m.If(load):
            rn = self.runs.payload
            m.d.sync += [cur.eq(rn), cur_valid.eq(1), rleft.eq(rn.beats - 1),
                         run_end.eq(rn.single), b0.eq(0), bank_end.eq(B == fw),
                         row.eq(rn.row0), hb_off.eq(rn.hb_off0)]

        # -- command end ----------------------------------------------------------------
        def finish(code_v):
            m.d.sync += [pend.eq(1), pend_fill.eq(cur.fill_end), pend_region.eq(cur.region),
                         pend_slot.eq(Mux(cur.region == HBRegionKind.EXPERT, cur.slot, 0)),
                         pend_rsp.id.eq(cur.id), pend_rsp.error.eq(code_v),
                         pend_rsp.resident.eq((cur.region == HBRegionKind.EXPERT) & cur.fill_end
                                              & (code_v == ExtErrorCode.OK)),
                         pend_rsp.slot.eq(cur.slot),
                         failed.eq(0), pe_done.eq(0), seq.eq(seq + 1)]

        with m.If(take & ends_cmd):
            finish(Mux(failed, fcode, code))
        with m.If(end_step):
            finish(Mux(failed, fcode, Mux(cur.range_err, ExtErrorCode.RANGE, ExtErrorCode.OK)))
            m.d.sync += [cur_valid.eq(0), dropping.eq(1), dtag.eq(cur.tag)]
        m.d.comb += [self.drop.eq(end_step), self.drop_tag.eq(cur.tag)]
        return m


class ExtStream(wiring.Component):
    """AXI4 read master with the PE / HB fill split (see the module docstring).

    Parameters
    ----------
    cfg : Config
        Geometry, LPDDR window, AXI widths, ``axi_max_burst`` and
        ``axi_outstanding`` all come from it.

    Members
    -------
    cmd : ``In(stream.Signature(ExtCommand))``
    rsp : ``Out(stream.Signature(ExtResponse))``
        One per command, in command order.
    pe : ``Out(stream.Signature(ExtBeat))``
        Beats of the planes in ``plane_mask``, in consumption order.
    fill : ``Out(stream.Signature(FillBeat))``
        HB fill beats: DATA..., then COMMIT or ABORT.
    m_axi_ar{id,addr,len,size,burst,valid,ready}, m_axi_r{id,data,resp,last,valid,ready}
        AXI4 read channels (plain top-level ports: ``AxiReadBus.from_prefix(dut, "m_axi")``).

    Every boundary is registered: ``cmd.ready`` and ``m_axi_rready`` are
    register-slice flags, ``m_axi_ar*`` come from the AR register, ``pe``,
    ``fill`` and ``rsp`` from FIFO output registers.

    Latency and throughput (measured, ``tests/test_ext_stream.py -k bandwidth``):
    the first AR handshake comes 15 cycles after the ``cmd`` handshake at
    ``default`` (18 at ``tiny``; range check, two walkers' register slices, the cutter's
    look-ahead and the AR register); a beat reaches
    ``pe``/``fill`` 4 cycles after its R handshake; one R beat per cycle while
    the outputs have room, back to back across commands, as long as
    ``axi_outstanding`` bursts cover the memory's latency. A command with a
    fill costs the next command one R cycle (its COMMIT shares the fill FIFO's
    write port).

    Raises
    ------
    TypeError
        When ``cfg`` is not a Config.
    """

    #: Width of the command tag (:data:`TAG_BITS`).
    tag_bits = TAG_BITS

    def __init__(self, cfg: Config):
        self.geo = g = ExtGeometry(cfg, self.tag_bits)
        self.cfg = cfg
        v = g.vocab
        super().__init__({
            "cmd": In(stream.Signature(v.ExtCommand)),
            "rsp": Out(stream.Signature(v.ExtResponse)),
            "pe": Out(stream.Signature(v.ExtBeat)),
            "fill": Out(stream.Signature(v.FillBeat)),
            "m_axi_arid": Out(g.id_bits),
            "m_axi_araddr": Out(g.addr_bits),
            "m_axi_arlen": Out(8),
            "m_axi_arsize": Out(3),
            "m_axi_arburst": Out(2),
            "m_axi_arvalid": Out(1),
            "m_axi_arready": In(1),
            "m_axi_rid": In(g.id_bits),
            "m_axi_rdata": In(cfg.axi_beat_bits),
            "m_axi_rresp": In(2),
            "m_axi_rlast": In(1),
            "m_axi_rvalid": In(1),
            "m_axi_rready": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        g = self.geo
        v = g.vocab
        # -- command side ------------------------------------------------------------
        m.submodules.cmd_slice = cmd_slice = RegisterSlice(v.ExtCommand)
        m.submodules.check = check = CommandCheck(g)
        wiring.connect(m, wiring.flipped(self.cmd), cmd_slice.i)
        wiring.connect(m, cmd_slice.o, check.i)
        wl = data.Layout.cast(g.walk_t).size
        m.submodules.ar_cmds = ar_cmds = fifo.SyncFIFOBuffered(width=wl, depth=2)
        m.submodules.r_cmds = r_cmds = fifo.SyncFIFOBuffered(width=wl, depth=4)
        both = ar_cmds.w_rdy & r_cmds.w_rdy
        m.d.comb += [check.o.ready.eq(both),
                     ar_cmds.w_data.eq(check.o.payload), r_cmds.w_data.eq(check.o.payload),
                     ar_cmds.w_en.eq(check.o.valid & both), r_cmds.w_en.eq(check.o.valid & both)]

        # -- address side -------------------------------------------------------------
        m.submodules.ar_walk = ar_walk = RunWalker(g)
        m.submodules.cutter = cutter = BurstCutter(g)
        m.submodules.burst_slice = bq = RegisterSlice(g.burst_t)
        m.submodules.ar_run_slice = ar_run_slice = RegisterSlice(g.run_t)
        wiring.connect(m, ar_walk.o, ar_run_slice.i)
        wiring.connect(m, ar_run_slice.o, cutter.i)
        wiring.connect(m, cutter.o, bq.i)
        ar_active = Signal()                  # the address side is on a command
        ar_seq = Signal(g.seq_bits)
        ar_tag = Signal(g.tag_bits)
        m.d.comb += [ar_walk.i.payload.eq(ar_cmds.r_data),
                     ar_walk.i.valid.eq(ar_cmds.r_rdy & ~ar_active),
                     ar_cmds.r_en.eq(ar_walk.i.ready & ~ar_active)]
        with m.If(ar_walk.i.valid & ar_walk.i.ready):
            m.d.sync += [ar_active.eq(1), ar_tag.eq(ar_walk.i.payload.tag)]

        m.submodules.desc = desc = fifo.SyncFIFOBuffered(width=data.Layout.cast(g.desc_t).size,
                                                         depth=g.outstanding + 2)
        m.submodules.router = router = BeatRouter(g)
        inflight = Signal(range(g.outstanding + 2))
        ar_valid = Signal()
        ar_addr = Signal(g.aw)
        ar_len = Signal(8)
        ar_fire = ar_valid & self.m_axi_arready
        m.d.comb += [self.m_axi_arid.eq(AXI_ID), self.m_axi_araddr.eq(Cat(Const(0, g.lbb), ar_addr)),
                     self.m_axi_arlen.eq(ar_len), self.m_axi_arsize.eq(g.lbb),
                     self.m_axi_arburst.eq(1), self.m_axi_arvalid.eq(ar_valid)]
        with m.If(ar_fire):
            m.d.sync += ar_valid.eq(0)

        can_issue = Signal()
        m.d.comb += can_issue.eq(inflight < g.outstanding)
        # While the data side's current command has failed, nothing is issued
        # (a cheap condition on the issue path); a cycle later `aborting` says
        # whether that command is the one the address side is on.
        stall = Signal()
        m.d.comb += stall.eq(ar_active & router.failed)
        aborting = Signal()
        # The issue stage. In abort mode everything in the address pipeline
        # belongs to the failed command: it is flushed, and the command is
        # closed with an end item (plain expressions, no FSM case statement:
        # Icarus, see TOOLCHAIN.md).
        abort_mode = Signal()
        b = bq.o.payload
        normal = ~abort_mode & ~aborting & ~stall
        issued = Signal()
        end_go = Signal()
        abort_end = Signal()
        m.d.comb += [
            issued.eq(normal & bq.o.valid & ~b.end & (~ar_valid | ar_fire) & can_issue
                      & desc.w_rdy),
            end_go.eq(normal & bq.o.valid & b.end & desc.w_rdy),
            abort_end.eq(abort_mode & ~bq.o.valid & ~cutter.o.valid & ~ar_run_slice.o.valid
                         & ~ar_walk.o.valid & desc.w_rdy),
            bq.o.ready.eq(issued | end_go | abort_mode),
            ar_walk.flush.eq(abort_mode), ar_walk.flush_tag.eq(ar_tag),
            cutter.flush.eq(abort_mode),
        ]
        dw = Signal(g.desc_t)
        m.d.comb += [dw.len.eq(b.len), dw.single.eq(b.len == 0),
                     dw.last.eq(Mux(issued, b.last, 1)), dw.end.eq(~issued),
                     desc.w_data.eq(dw), desc.w_en.eq(issued | end_go | abort_end)]
        m.d.sync += aborting.eq(stall & (router.seq == ar_seq) & ~abort_mode)
        with m.If(aborting & ~abort_mode):
            m.d.sync += abort_mode.eq(1)
        with m.If(issued):
            m.d.sync += [ar_valid.eq(1), ar_addr.eq(b.addr), ar_len.eq(b.len)]
        with m.If((issued & b.last) | end_go | abort_end):
            m.d.sync += [ar_active.eq(0), ar_seq.eq(ar_seq + 1)]
        with m.If(abort_end):
            m.d.sync += abort_mode.eq(0)
        m.d.sync += inflight.eq(inflight + issued - router.burst_done)

        # -- data side ------------------------------------------------------------------
        m.submodules.r_slice = r_slice = RegisterSlice(g.r_t)
        rp = r_slice.i.payload
        rresp = self.m_axi_rresp
        m.d.comb += [rp.data.eq(self.m_axi_rdata), rp.last.eq(self.m_axi_rlast),
                     rp.bad_id.eq(self.m_axi_rid != AXI_ID), rp.exokay.eq(rresp == AxiResp.EXOKAY),
                     rp.slverr.eq(rresp == AxiResp.SLVERR), rp.decerr.eq(rresp == AxiResp.DECERR),
                     r_slice.i.valid.eq(self.m_axi_rvalid), self.m_axi_rready.eq(r_slice.i.ready)]
        wiring.connect(m, r_slice.o, router.r)
        m.d.comb += [router.desc.payload.eq(desc.r_data), router.desc.valid.eq(desc.r_rdy),
                     desc.r_en.eq(router.desc.ready)]
        m.submodules.r_walk = r_walk = RunWalker(g)
        m.d.comb += [r_walk.i.payload.eq(r_cmds.r_data), r_walk.i.valid.eq(r_cmds.r_rdy),
                     r_cmds.r_en.eq(r_walk.i.ready)]
        m.submodules.run_slice = run_slice = RegisterSlice(g.run_t)
        wiring.connect(m, r_walk.o, run_slice.i)
        wiring.connect(m, run_slice.o, router.runs)
        m.d.comb += [r_walk.flush.eq(router.drop), r_walk.flush_tag.eq(router.drop_tag)]

        # -- outputs ----------------------------------------------------------------------
        for name, width, depth in (("pe", v.ExtBeat.as_shape().size, g.out_depth),
                                   ("fill", v.FillBeat.as_shape().size, g.out_depth),
                                   ("rsp", v.ExtResponse.as_shape().size, 2)):
            q = fifo.SyncFIFOBuffered(width=width, depth=depth)
            m.submodules[f"{name}_fifo"] = q
            port = getattr(self, name)
            m.d.comb += [q.w_data.eq(getattr(router, f"{name}_data")),
                         q.w_en.eq(getattr(router, f"{name}_en")),
                         port.payload.eq(q.r_data), port.valid.eq(q.r_rdy), q.r_en.eq(port.ready)]
            if name == "rsp":
                m.d.comb += router.rsp_rdy.eq(q.w_rdy)
            else:
                room = Signal(name=f"{name}_room")
                m.d.sync += room.eq(q.level < depth - 3)
                m.d.comb += getattr(router, f"{name}_room").eq(room)
        return m


def ext_params(cfg) -> dict:
    """Elaboration parameters of :class:`ExtStream`: the whole Config (as a
    dict; :func:`ext_factory` rebuilds it)."""
    return {"config": cfg.to_dict()}


def ext_factory(config: dict) -> ExtStream:
    return ExtStream(Config(**config))


def _register():
    from ..blocks import Block
    return [Block("ext_stream", "elmoe3d_ext_stream",
                  "AXI4 stream engine: expert reads split to the PE stream and the HB fill",
                  ext_params, ext_factory, order=50,
                  timing="1 AXI beat/cycle steady; first AR 15 cycles after a command, PE beat 4 "
                         "cycles after R",
                  sweep=(dict(axi_data_bits=64), dict(axi_data_bits=128, pes=8)))]


BLOCK_SPECS = _register()
