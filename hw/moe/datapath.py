"""The token-batched MoE layer datapath: its components joined by streams.

See ``docs/blocks/moe_layer.md`` for the whole picture and
``docs/architecture.md`` "Batched datapath" for the contract with the
Elastic-SD controller, HB and the external-memory stream engine.

::

    tok ──> TokenStore ──x──> Issue ──ArrayBeat──> PEArray ──ArrayResult──> VectorUnit ──y──> OutputStage ──> o, stats
                 │              ^  ^                                          │   │ ^
                 │      HB buffer  LPDDR buffer                      logits   │   │ gates
                 │              ^  ^                                          v   │
                 │      HBReader  ExtWriter <── ext                         TopK ──> Softmax
                 │       ^  │ records,constants ──> VectorUnit                │
    hb_cmd/hb_data <─────┘  │                                                 v
                 └────────> ExpertScheduler (job table) <── source, ──> need
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from ...config import Config
from ..vocab import vocab
from .buffers import ReplayBuffer
from .common import geom
from .ext_port import ExtWriter
from .hb_reader import HBReader
from .issue import Issue
from .output import OutputStage
from .pe_array import PEArray
from .payloads import array_beat, pass_summary, seg_params
from ..streams import RegisterSlice
from .scheduler import ExpertScheduler
from .softmax import Softmax
from .tokens import TokenStore
from .topk import TopK
from .vector_unit import VectorUnit

__all__ = ["MoEDatapath"]


class MoEDatapath(wiring.Component):
    """Token-batched MoE layer: router, top-k, softmax, SwiGLU experts on
    ``B`` bit-slice PEs, gated combine; one weight load per expert per pass
    of up to ``T`` tokens; split verification over two weight ports.

    Parameters
    ----------
    cfg : Config
        Geometry (``hidden``, ``ffn``, ``experts``, ``top_k``,
        ``shared_experts``, ``pes``, ``lanes``, ``slice_bits``,
        ``hb_planes``, ``batch_tokens``, the HB map and the AXI beat).
    hb_depth, ext_depth : int, optional
        Weight-buffer words per bank (powers of two; defaults in
        :func:`elmoe3d.hw.moe.common.geom`).

    Members
    -------
    tok : ``In(stream.Signature(MoEToken))``
    need : ``Out(stream.Signature(ExpertNeed))``
    source : ``In(stream.Signature(ExpertSource))``
    hb_cmd : ``Out(stream.Signature(HBRead)).array(B)``
    hb_data : ``In(stream.Signature(HBBeat)).array(B)``
    ext : ``In(stream.Signature(ExtBeat))``
    o : ``Out(stream.Signature(MoEOutput))``
    stats : ``Out(stream.Signature(PassStats))``

    Every input ``ready`` and output ``valid`` comes from registers.

    Raises
    ------
    TypeError, ValueError
        For a Config of the wrong kind or a buffer depth that is not a power
        of two large enough, naming it.
    """

    def __init__(self, cfg: Config, *, hb_depth: int | None = None,
                 ext_depth: int | None = None):
        if not isinstance(cfg, Config):
            raise TypeError(f"cfg must be a Config, not {cfg!r}")
        self.cfg = cfg
        self.g = g = geom(cfg, hb_depth=hb_depth, ext_depth=ext_depth)
        v = vocab(cfg)
        super().__init__({
            "tok": In(stream.Signature(v.MoEToken)),
            "need": Out(stream.Signature(v.ExpertNeed)),
            "source": In(stream.Signature(v.ExpertSource)),
            "hb_cmd": Out(stream.Signature(v.HBRead)).array(g.B),
            "hb_data": In(stream.Signature(v.HBBeat)).array(g.B),
            "ext": In(stream.Signature(v.ExtBeat)),
            "o": Out(stream.Signature(v.MoEOutput)),
            "stats": Out(stream.Signature(v.PassStats)),
        })

    def elaborate(self, platform):
        m = Module()
        g = self.g
        B = g.B
        P, Tl = g.P, g.Tl
        gl_ = g.lane()
        ts = m.submodules.tokens = TokenStore(g)
        # one top-k and one softmax unit per token lane (its tokens by
        # lane-local index)
        topks = [TopK(gl_) for _ in range(P)]
        sms = [Softmax(gl_) for _ in range(P)]
        for p in range(P):
            m.submodules["topk" if P == 1 else f"topk{p}"] = topks[p]
            m.submodules["softmax" if P == 1 else f"softmax{p}"] = sms[p]
        sch = m.submodules.scheduler = ExpertScheduler(g)
        hbr = m.submodules.hb_reader = HBReader(g)
        extw = m.submodules.ext_writer = ExtWriter(g)
        hbb = m.submodules.hb_buffer = ReplayBuffer(banks=B, width=g.sv, depth=g.hb_depth)
        extb = m.submodules.ext_buffer = ReplayBuffer(banks=B, width=g.sv, depth=g.ext_depth)
        iss = m.submodules.issue = Issue(g, hbb.pbits, extb.pbits)
        pea = m.submodules.pe_array = PEArray(g)
        vu = m.submodules.vector_unit = VectorUnit(g)
        out = m.submodules.output = OutputStage(g)
        cycle = Signal(g.cfg.stat_bits)
        m.d.sync += cycle.eq(cycle + 1)
        c = m.d.comb

        # boundary streams
        wiring.connect(m, wiring.flipped(self.tok), ts.tok)
        wiring.connect(m, sch.need, wiring.flipped(self.need))
        wiring.connect(m, wiring.flipped(self.source), sch.source)
        for b in range(B):
            wiring.connect(m, hbr.hb_cmd[b], wiring.flipped(self.hb_cmd[b]))
            wiring.connect(m, wiring.flipped(self.hb_data[b]), hbr.hb_data[b])
        wiring.connect(m, wiring.flipped(self.ext), extw.ext)
        wiring.connect(m, out.o, wiring.flipped(self.o))
        wiring.connect(m, out.stats, wiring.flipped(self.stats))

        # token store -> consumers
        for par in range(2):
            c += [sch.count[par].eq(ts.count[par]), sch.layer[par].eq(ts.layer[par]),
                  sch.roles[par].eq(ts.roles[par]), hbr.layer[par].eq(ts.layer[par]),
                  iss.count[par].eq(ts.count[par]), iss.roles[par].eq(ts.roles[par])]
            for p in range(P):               # lane p's tokens: positions i P + p
                for i in range(Tl):
                    if i * P + p < g.T:
                        c += [topks[p].roles[par][i].eq(ts.roles[par][i * P + p]),
                              topks[p].masks[par][i].eq(ts.masks[par][i * P + p])]
        c += [sch.pass_valid.eq(ts.valid), sch.pass_seq.eq(ts.seq),
              hbr.pass_valid.eq(ts.valid), hbr.pass_seq.eq(ts.seq),
              iss.pass_valid.eq(ts.valid), iss.step_last.eq(ts.step_last),
              ts.release.eq(iss.release), ts.release_par.eq(iss.release_par)]
        for p in range(P):
            c += [ts.x_addr[p].eq(iss.x_addr[p]), iss.x_data[p].eq(ts.x_data[p]),
                  vu.h_addr[p].eq(iss.h_addr[p]), iss.h_data[p].eq(vu.h_data[p]),
                  out.y_data[p].eq(vu.y_data[p])]

        # routing: vector unit -> each lane's top-k -> its softmax (and the
        # scheduler's snoop of every lane)
        for p in range(P):
            topk, sm = topks[p], sms[p]
            c += [topk.i_valid.eq(vu.logit_valid[p]), topk.i.eq(vu.logit[p]),
                  vu.topk_last_ok[p].eq(topk.last_ok), vu.topk_idle[p].eq(topk.idle)]
            wiring.connect(m, topk.o, sm.i)
            c += [sch.sel_valid[p].eq(topk.o.valid & topk.o.ready), sch.sel[p].eq(topk.o.payload)]
            c += [sm.sm_we.eq(hbr.sm_we), sm.sm_par.eq(hbr.sm_par), sm.sm_mult.eq(hbr.sm_mult),
                  sm.sm_shift.eq(hbr.sm_shift), sm.sm_clear.eq(vu.done),
                  sm.sm_clear_par.eq(vu.done_par), sm.g_addr.eq(vu.g_addr[p]),
                  vu.g_data[p].eq(sm.g_data), vu.gates_keep[p].eq(sm.ready_keep),
                  vu.softmax_idle[p].eq(sm.idle)]

        # job table readers: HB reader, LPDDR writer, issue
        for r, cons in enumerate((hbr, extw, iss)):
            c += [sch.rd_addr[r].eq(cons.rd_addr), cons.rd_entry.eq(sch.rd_entry[r]),
                  cons.rd_src.eq(sch.rd_src[r])]
            for p in range(2):
                c += [cons.decided[p].eq(sch.decided[p]), cons.total[p].eq(sch.total[p])]
            c += [cons.total_valid.eq(sch.total_valid), cons.epoch.eq(sch.epoch)]
        for p in range(2):
            c += [iss.no_routed[p].eq(sch.no_routed[p]), iss.experts[p].eq(sch.experts[p]),
                  iss.expert_tokens[p].eq(sch.expert_tokens[p]),
                  out.hb_words[p].eq(hbr.words[p]), iss.ext_beats[p].eq(extw.beats[p])]
        c += [iss.sel_done.eq(sch.sel_done), out.hb_error.eq(hbr.error),
              iss.ext_error.eq(extw.error), iss.cycle.eq(cycle), out.cycle.eq(cycle)]

        # the LSB port: a whole-resident job's LSB slot words, HB reader ->
        # LPDDR writer, through a small FIFO per bank (the writer takes them
        # in the job's turn; the reader reads the slot after the job's MSB
        # slot, so the issue stage never waits for a later job's words)
        for b in range(B):
            lq = m.submodules[f"lsb_q{b}"] = fifo.SyncFIFOBuffered(width=g.sv, depth=8)
            c += [lq.w_en.eq(hbr.lsb_we[b]), lq.w_data.eq(hbr.lsb_wdata[b]),
                  hbr.lsb_space[b].eq(lq.w_rdy),
                  extw.lsb_valid[b].eq(lq.r_rdy), extw.lsb_data[b].eq(lq.r_data),
                  lq.r_en.eq(extw.lsb_ready[b])]

        # weight buffers
        for b in range(B):
            c += [hbr.buf_space[b].eq(hbb.space[b]), hbb.we[b].eq(hbr.buf_we[b]),
                  hbb.wdata[b].eq(hbr.buf_wdata[b]), iss.hb_data[b].eq(hbb.rd_data[b]),
                  extb.we[b].eq(extw.buf_we[b]),
                  extb.wdata[b].eq(extw.buf_wdata[b]), iss.ext_data[b].eq(extb.rd_data[b])]
        c += [iss.hb_wp.eq(hbb.wp_all), iss.ext_wp.eq(extb.wp_all), extw.buf_room.eq(extb.room),
              hbb.rd_pos.eq(iss.hb_pos), hbb.free.eq(iss.hb_free),
              extb.rd_pos.eq(iss.ext_pos), extb.free.eq(iss.ext_free)]

        # constants and parameters: HB reader -> vector unit. Each bank's
        # parameter stream crosses a register slice: the vector unit's pop
        # (`params[b].ready`, from its entry's `adv`) had reached the HB
        # reader's parameter queue and its level counter in the same cycle
        # (a 2.6 ns route between the two components, then the queue's
        # logic: 10.4 ns, timing round 17)
        for b in range(B):
            ps_ = m.submodules[f"params_slice{b}"] = RegisterSlice(seg_params())
            wiring.connect(m, hbr.params[b], ps_.i)
            wiring.connect(m, ps_.o, vu.params[b])
            c += [vu.out_we[b].eq(hbr.out_we[b]), vu.out_addr[b].eq(hbr.out_addr[b]),
                  vu.out_data[b].eq(hbr.out_data[b])]
        c += [vu.lut_we.eq(hbr.lut_we), vu.lut_addr.eq(hbr.lut_addr), vu.lut_data.eq(hbr.lut_data),
              vu.lut_loaded.eq(hbr.lut_loaded), vu.out_loaded.eq(hbr.out_loaded),
              hbr.pass_done.eq(vu.done), hbr.pass_done_par.eq(vu.done_par)]

        # compute chain
        # the beats cross a register slice on their way to the PE array: the
        # issue stage's FIFO and the PE array's input sit far apart, and the
        # FIFO's read then answers a flip-flop beside it (`i.ready`), not the
        # PE array's readiness
        m.submodules.beat_slice = beat_slice = RegisterSlice(array_beat(g))
        wiring.connect(m, iss.o, beat_slice.i)
        wiring.connect(m, beat_slice.o, pea.i)
        wiring.connect(m, pea.o, vu.i)
        c += iss.up_done.eq(vu.up_done)
        # (the pass summary crosses a register slice: the output stage's
        # summary queue and the issue stage's END decision sit far apart, and
        # its write had been two LUTs and 5 ns of routing after the issue
        # stage's `credit`, timing round 17)
        m.submodules.summary_slice = sum_slice = RegisterSlice(pass_summary(g))
        wiring.connect(m, iss.summary, sum_slice.i)
        wiring.connect(m, sum_slice.o, out.summary)
        c += [out.done.eq(vu.done), out.done_par.eq(vu.done_par),
              out.done_error.eq(vu.done_error), vu.y_addr.eq(out.y_addr),
              vu.out_done.eq(out.out_done)]
        return m
