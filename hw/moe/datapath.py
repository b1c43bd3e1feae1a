"""The token-batched MoE layer datapath: its components joined by streams
and by the side-channel signatures of :mod:`.ports` (a list of
``wiring.connect`` calls; ``docs/blocks/moe_layer.md`` "Joins" lists them).

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

from amaranth.hdl import Module
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from ...config import Config, require_config
from ..vocab import vocab
from .buffers import ReplayBuffer
from .common import CycleCounter, geom
from .ext_port import ExtWriter
from .hb_reader import HBReader
from .issue import Issue
from .output import OutputStage
from .pe_array import PEArray
from .payloads import array_beat, pass_summary, seg_params
from .prefetch_cands import CandidateTracker
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
    prefetch : bool, optional
        Also compute each DRAFT pass's prefetch candidates (the ``cand``
        port; :mod:`.prefetch_cands`) for a controller that prefetches.

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
    cand : ``Out(stream.Signature(PrefetchCandidate))`` (with ``prefetch``)

    Every input ``ready`` and output ``valid`` comes from registers.

    Raises
    ------
    TypeError, ValueError
        For a Config of the wrong kind or a buffer depth that is not a power
        of two large enough, naming it.
    """

    def __init__(self, cfg: Config, *, hb_depth: int | None = None,
                 ext_depth: int | None = None, prefetch: bool = False):
        require_config("MoEDatapath", cfg)
        self.cfg, self.prefetch = cfg, bool(prefetch)
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
            **({"cand": Out(stream.Signature(v.PrefetchCandidate))} if prefetch else {}),
        })

    def elaborate(self, platform):
        m = Module()
        g = self.g
        B, P = g.B, g.P
        gl_ = g.lane()
        ts = m.submodules.tokens = TokenStore(g)
        # one top-k and one softmax unit per token lane (its tokens by
        # lane-local index)
        topks = [TopK(gl_, snoop=True) if self.prefetch else TopK(gl_) for _ in range(P)]
        sms = [Softmax(gl_) for _ in range(P)]
        for p in range(P):
            m.submodules["topk" if P == 1 else f"topk{p}"] = topks[p]
            m.submodules["softmax" if P == 1 else f"softmax{p}"] = sms[p]
        sch = m.submodules.scheduler = (ExpertScheduler(g, prefetch=True) if self.prefetch
                                        else ExpertScheduler(g))
        hbr = m.submodules.hb_reader = HBReader(g)
        extw = m.submodules.ext_writer = ExtWriter(g)
        hbb = m.submodules.hb_buffer = ReplayBuffer(banks=B, width=g.sv, depth=g.hb_depth)
        extb = m.submodules.ext_buffer = ReplayBuffer(banks=B, width=g.sv, depth=g.ext_depth)
        iss = m.submodules.issue = Issue(g)
        pea = m.submodules.pe_array = PEArray(g)
        vu = m.submodules.vector_unit = VectorUnit(g)
        out = m.submodules.output = OutputStage(g)
        time = m.submodules.cycle = CycleCounter(g)

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

        # the token store's passes -> the scheduler, the HB reader and the
        # issue stage; each lane's roles and masks -> its top-k; the issue
        # stage reads `x` (one port per lane) and releases the pass
        wiring.connect(m, ts.passes, sch.passes, hbr.passes, iss.passes)
        wiring.connect(m, iss.release, ts.release)
        for p in range(P):
            wiring.connect(m, ts.lanes[p], topks[p].tokens)
            wiring.connect(m, iss.x[p], ts.x[p])

        # routing: vector unit -> each lane's top-k -> its softmax (and the
        # scheduler's copy of each routing); the vector unit reads the gates
        for p in range(P):
            wiring.connect(m, vu.logits[p], topks[p].i)
            wiring.connect(m, topks[p].o, sms[p].i)
            wiring.connect(m, topks[p].sel, sch.sel[p])
            wiring.connect(m, vu.gates[p], sms[p].gates)

        # the job table's readers (HB reader, LPDDR writer, issue) and the
        # scheduler's progress
        for r, reader in enumerate((hbr, extw, iss)):
            wiring.connect(m, reader.jobs, sch.jobs[r])
        wiring.connect(m, sch.progress, hbr.progress, extw.progress, iss.progress)

        # the LSB port: a whole-resident job's LSB slot words, HB reader ->
        # LPDDR writer, through a small FIFO per bank (the writer takes them
        # in the job's turn; the reader reads the slot after the job's MSB
        # slot, so the issue stage never waits for a later job's words)
        for b in range(B):
            lq = m.submodules[f"lsb_q{b}"] = fifo.SyncFIFOBuffered(width=g.sv, depth=8)
            wiring.connect(m, hbr.lsb[b], lq.w_stream)
            wiring.connect(m, lq.r_stream, extw.lsb[b])

        # weight buffers: written by the ports, read by the issue stage
        wiring.connect(m, hbr.buf, hbb.wr)
        wiring.connect(m, extw.buf, extb.wr)
        wiring.connect(m, iss.hb_buf, hbb.rd)
        wiring.connect(m, iss.ext_buf, extb.rd)

        # constants and parameters: HB reader -> vector unit (and the
        # softmax record -> the softmax units). Each bank's parameter
        # stream crosses a register slice: the vector unit's pop
        # (`params[b].ready`, from its entry's `adv`) had reached the HB
        # reader's parameter queue and its level counter in the same cycle
        # (a 2.6 ns route between the two components, then the queue's
        # logic: 10.4 ns, timing round 17)
        for b in range(B):
            ps_ = m.submodules[f"params_slice{b}"] = RegisterSlice(seg_params())
            wiring.connect(m, hbr.params[b], ps_.i)
            wiring.connect(m, ps_.o, vu.params[b])
        wiring.connect(m, hbr.consts, vu.consts)
        wiring.connect(m, hbr.sm, *[sm.sm for sm in sms])
        # a pass done: the HB reader frees its constants, the output stage
        # takes its counters, the softmax units drop its record
        wiring.connect(m, vu.pass_done, hbr.pass_done, out.pass_done, *[sm.clear for sm in sms])

        # counters: the LPDDR writer's go into the pass summary (issue), the
        # HB reader's to the output stage; both stamp with the cycle counter
        wiring.connect(m, extw.counters, iss.ext_counters)
        wiring.connect(m, hbr.counters, out.hb_counters)
        wiring.connect(m, time, iss.time, out.time)

        # compute chain
        # the beats cross a register slice on their way to the PE array: the
        # issue stage's FIFO and the PE array's input sit far apart, and the
        # FIFO's read then answers a flip-flop beside it (`i.ready`), not the
        # PE array's readiness
        m.submodules.beat_slice = beat_slice = RegisterSlice(array_beat(g))
        wiring.connect(m, iss.o, beat_slice.i)
        wiring.connect(m, beat_slice.o, pea.i)
        wiring.connect(m, pea.o, vu.i)
        wiring.connect(m, iss.h, vu.h)
        # (the pass summary crosses a register slice: the output stage's
        # summary queue and the issue stage's END decision sit far apart, and
        # its write had been two LUTs and 5 ns of routing after the issue
        # stage's `credit`, timing round 17)
        m.submodules.summary_slice = sum_slice = RegisterSlice(pass_summary(g))
        wiring.connect(m, iss.summary, sum_slice.i)
        wiring.connect(m, sum_slice.o, out.summary)
        wiring.connect(m, out.y, vu.y)

        if self.prefetch:                   # each lane's candidates -> the scheduler -> `cand`
            for p in range(P):
                ct = m.submodules[f"cands{p}"] = CandidateTracker(gl_)
                wiring.connect(m, topks[p].seen, ct.seen)
                m.d.comb += [ct.sel.valid.eq(topks[p].sel.valid),
                             ct.sel.payload.eq(topks[p].sel.payload)]
                wiring.connect(m, ct.cand, sch.cands[p])
            wiring.connect(m, sch.pf, wiring.flipped(self.cand))
        return m
