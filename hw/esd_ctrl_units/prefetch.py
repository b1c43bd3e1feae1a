"""Prefetcher: fills the HB slots that the verification is predicted to
need while the drafts run (``golden/esd.py``, "Prefetch during drafts").

Built only when the controller has a prefetch depth ``N`` > 0
(``EsdCtrl(cfg, prefetch=N)``). It does two jobs, each ordered on a
:func:`~.payloads.prefetch_port` and answered with ``done`` once its events
have left:

*Issue* (``PrefetchOrder.retire`` = 0, from the layer step after each
DRAFT pass has ended). The datapath's ``PrefetchCandidate`` s of that pass
(``cand``: announce order, or one ``none`` beat) come in. Unless there are
none: ``PREFETCH`` (value = the pass's distinct candidates), then per
candidate while fewer than ``N`` prefetches are outstanding: LOOKUP
(``LOOKUP``; PENDING: already being prefetched, nothing more), ALLOCATE of
a victim for the ``k`` HB planes (``ALLOCATE``; NO_VICTIM: nothing more),
``FILL_START``, ``SOURCE`` PREFETCH and an LPDDR read of the HB planes into
the victim only (``ExtCommand`` EXPERT, ``plane_mask`` 0, ``fill`` 1: no
PE stream). The prefetch joins the table of outstanding ones. Candidates
past the depth are taken and dropped.

*Retire* (``retire`` = 1, from the layer step before a VERIFY step: the
prefetches of ``ctx.layer``; from the KV boundary before a move: all, with
``all``). If any: ``PREFETCH_END`` (value = how many), then each, in issue
order, once its LPDDR response and its fill's end have come: ``EXT_ERROR``
(a failed read), ``FILL_END`` COMMIT and UNPIN (``UNPIN``) or ``FILL_END``
ABORT and the tag unit's ABORT (``INVALIDATE`` ABORT): no slot stays
resident with wrong data.

The table holds up to ``N`` prefetches in issue order (a retired one in the
middle closes its gap: entries behind it move up one). The stream engine
answers in command order, so a prefetch ``ExtResponse`` belongs to the
oldest entry without one; the controller routes it here (it knows the
order of its commands). HB's ``FillDone`` belongs to the entry whose slot
it names: ``claim`` tells the controller, combinationally from
``fill_done.payload``, that an outstanding prefetch owns that slot. Both
inputs are always ready (strobes of blocks that cannot wait).

Until it retires, a prefetch is PENDING to the controller, as in the
golden model, although HB may already have committed its fill (the tag
unit then holds the slot RESIDENT, still pinned: never a victim). So a
candidate's lookup is a plain LOOKUP (a candidate is not eligible, so a
hit can only be an outstanding prefetch: reported PENDING, no pin taken),
and ``slots`` (the outstanding prefetches' slots) keeps them out of the
layer step's eligibility probe.

The ``PREFETCH`` / ``PREFETCH_END`` kinds leave as their golden values
(18, 19): ``TraceEventKind`` does not name them, so a controller without
prefetch keeps its Verilog.
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ...config import Config
from ...golden import esd as gesd
from .. import vocab as hv
from ..common import adder_tree, check_int
from ..moe.common import lowest_set
from .common import Emit, allocate_fields, check_config, clamp, clear_counts
from .counters import counter_fields
from .payloads import counter_port, esd_ports, prefetch_port, tag_port

__all__ = ["Prefetcher"]


def _or(values):
    out = values[0]
    for v in values[1:]:
        out = out | v
    return out

Ph, EK = gesd.Phase, gesd.EventKind


class Prefetcher(wiring.Component):
    """Issues and retires prefetches during drafts (see the module doc).

    Parameters
    ----------
    cfg : Config
    depth : int
        Most prefetches outstanding (1 .. ``tag_slots``).

    Members
    -------
    step, kv : ``In(prefetch_port(...))``
        Jobs from the layer step (issue, retire a layer) and from the KV
        boundary (retire all); one at a time, ``step`` first.
    cand : ``In(stream.Signature(PrefetchCandidate))``
    tag : ``Out(tag_port(cfg))``
    ext_cmd : ``Out(stream.Signature(ExtCommand))``
    ext_rsp : ``In(stream.Signature(ExtResponse))`` (prefetch responses only)
    fill_done : ``In(stream.Signature(FillDone))`` (prefetch fills only)
    claim : ``Out(1)``
        ``fill_done.payload.slot`` is the slot of an outstanding prefetch.
    slots : ``Out(tag_slots)``
        The slots of the outstanding prefetches (a bit each).
    events : ``Out(stream.Signature(TraceEvent))``
    counts : ``Out(counter_port(...))`` (:attr:`COUNTS`)

    Raises
    ------
    ValueError
        For a depth outside 1 .. ``tag_slots``.

    Latency: per candidate one cycle to take it, a tag-unit round trip and
    a cycle per event (a prefetch: two round trips and four events); per
    retired prefetch, once its response and fill end are in, a cycle per
    event and one round trip; ``done`` in the cycle after the job's last
    event left.
    """

    COUNTS = ("lpddr_bytes", "allocations", "evictions", "no_victim", "fills", "aborts",
              "ext_errors")

    def __init__(self, cfg: Config, depth: int):
        check_config("Prefetcher", cfg)
        check_int("Prefetch depth", depth, 1, cfg.tag_slots)
        self.cfg, self.depth = cfg, depth
        t = esd_ports(cfg)
        S = stream.Signature
        port = prefetch_port(cfg.layer_bits, cfg.draft_len_max)
        super().__init__({
            "step": In(port), "kv": In(port),
            "cand": In(S(t["PrefetchCandidate"])),
            "tag": Out(tag_port(cfg)),
            "ext_cmd": Out(S(t["ExtCommand"])), "ext_rsp": In(S(t["ExtResponse"])),
            "fill_done": In(S(t["FillDone"])), "claim": Out(1), "slots": Out(cfg.tag_slots),
            "events": Out(S(t["TraceEvent"])),
            "counts": Out(counter_port(counter_fields(cfg, self.COUNTS)))})

    def elaborate(self, platform):
        m = Module()
        cfg, N = self.cfg, self.depth
        n, khb = cfg.planes, cfg.hb_planes_eff
        hb_mask = (1 << khb) - 1
        plane_bytes = cfg.expert_bytes // n
        ev = Emit(m, self.events, "ev")
        tag = Emit(m, self.tag.cmd, "tag")
        ext = Emit(m, self.ext_cmd, "ext")
        done_step = Emit(m, self.step.done, "done_step")
        done_kv = Emit(m, self.kv.done, "done_kv")
        inc = self.counts.inc
        clear_counts(m, inc, self.COUNTS)

        # -- the table of outstanding prefetches, in issue order ----------------------
        ctx_t = self.step.order.payload.ctx.shape()
        entry_t = data.StructLayout({
            "valid": 1, "ctx": ctx_t, "expert": cfg.expert_bits,
            "slot": hv.bits(cfg.tag_slots), "rsp": 1, "err": 3, "fill": 1, "ok": 1})
        tab = Array(Signal(entry_t, name=f"pf{i}") for i in range(N))
        m.d.comb += self.slots.eq(
            _or([Mux(tab[i].valid, 1 << tab[i].slot, 0)[:cfg.tag_slots] for i in range(N)]))
        nvalid = Signal(range(N + 1))
        m.d.comb += nvalid.eq(adder_tree([tab[i].valid for i in range(N)]))

        # responses and fill ends, recorded on their entries (always taken)
        m.d.comb += [self.ext_rsp.ready.eq(1), self.fill_done.ready.eq(1)]
        f = self.fill_done.payload
        r = self.ext_rsp.payload
        waiting_rsp = Signal(N)
        m.d.comb += waiting_rsp.eq(Cat(tab[i].valid & ~tab[i].rsp for i in range(N)))
        _, rsp_i = lowest_set(m, waiting_rsp, "rsp")
        owner = Signal(N)
        m.d.comb += [owner.eq(Cat(tab[i].valid & ~tab[i].fill & (tab[i].slot == f.slot)
                                  for i in range(N))),
                     self.claim.eq(owner.any())]
        upd = [Signal(entry_t, name=f"pf_upd{i}") for i in range(N)]
        for i in range(N):
            m.d.comb += upd[i].eq(tab[i])
            with m.If(self.ext_rsp.valid & (rsp_i == i)):
                m.d.comb += [upd[i].rsp.eq(1), upd[i].err.eq(r.error.as_value())]
            with m.If(self.fill_done.valid & owner[i]):
                m.d.comb += [upd[i].fill.eq(1), upd[i].ok.eq(f.ok)]
        # what the FSM does to the table this cycle (never both)
        add = Signal()                              # append `new` behind the last entry
        new = Signal(entry_t)                       # the prefetch being issued
        drop = Signal()                             # remove entry `x_i`, close the gap
        x_i = Signal(range(N))
        for i in range(N):
            nxt = upd[i + 1] if i + 1 < N else Const(0, entry_t.size)
            always = (1 << len(x_i)) - 1 <= i      # x_i <= i whatever x_i is
            with m.If(drop if always else drop & (x_i <= i)):
                m.d.sync += tab[i].eq(nxt)
            with m.Elif(add & (nvalid == i)):
                m.d.sync += tab[i].eq(new)
            with m.Else():
                m.d.sync += tab[i].eq(upd[i])

        # -- the job in hand --------------------------------------------------------------
        ctx = Signal(ctx_t)
        from_kv = Signal()
        every = Signal()                            # retire: every layer's
        expert = Signal(cfg.expert_bits)
        tokens = Signal.like(self.cand.payload.tokens)
        last = Signal()
        slot = Signal(hv.bits(cfg.tag_slots))
        rsp = self.tag.rsp.payload
        ok = rsp.error == hv.TagErrorCode.OK
        match = Signal(N)
        m.d.comb += match.eq(Cat(tab[i].valid & (every | (tab[i].ctx.layer == ctx.layer))
                                 for i in range(N)))
        m_any, m_i = lowest_set(m, match, "match")
        nmatch = Signal(range(N + 1))
        m.d.comb += new.eq(Cat(Const(1, 1), ctx, expert, slot))   # no response, no fill yet
        x = Signal(entry_t)                         # the entry being retired
        cur = Signal(entry_t)                       # ... as it is now
        for i in range(N):
            with m.If(x_i == i):
                m.d.comb += cur.eq(upd[i])

        def issue_event(kind, **fields):
            ev.put(m, kind=kind, phase=Ph.DRAFT, step=ctx.step, layer=ctx.layer,
                   pass_no=ctx.pass_no, expert=expert, **fields)

        def retire_event(kind, **fields):
            ev.put(m, kind=kind, phase=x.ctx.phase, step=x.ctx.step, layer=x.ctx.layer,
                   pass_no=x.ctx.pass_no, expert=x.expert, slot=x.slot, **fields)

        def next_candidate():
            with m.If(last):
                m.next = "FINISH"
            with m.Else():
                m.next = "NEXT"

        with m.FSM(init="START"):
            with m.State("START"):          # a cycle out of reset (Icarus: see common.py)
                m.next = "IDLE"
            with m.State("IDLE"):
                s, k = self.step.order, self.kv.order
                m.d.comb += [s.ready.eq(done_step.empty & done_kv.empty),
                             k.ready.eq(~s.valid & done_step.empty & done_kv.empty)]
                with m.If(s.valid & s.ready):
                    m.d.sync += [ctx.eq(s.payload.ctx), every.eq(s.payload.all), from_kv.eq(0)]
                    with m.If(s.payload.retire):
                        m.next = "COUNT"
                    with m.Else():
                        m.next = "HEAD"
                with m.Elif(k.valid & k.ready):
                    m.d.sync += [ctx.eq(k.payload.ctx), every.eq(k.payload.all), from_kv.eq(1)]
                    m.next = "COUNT"

            # issue: PREFETCH, then each candidate
            with m.State("HEAD"):
                c = self.cand.payload
                with m.If(self.cand.valid & c.none):
                    m.d.comb += self.cand.ready.eq(1)
                    m.next = "FINISH"
                with m.Elif(self.cand.valid & ev.free):
                    ev.put(m, kind=EK.PREFETCH, phase=Ph.DRAFT, step=ctx.step, layer=ctx.layer,
                           pass_no=ctx.pass_no, value=c.count)
                    m.next = "NEXT"
            with m.State("NEXT"):
                c = self.cand.payload
                m.d.comb += self.cand.ready.eq(tag.empty)
                with m.If(self.cand.valid & self.cand.ready):
                    m.d.sync += [expert.eq(c.expert), tokens.eq(c.tokens), last.eq(c.last)]
                    with m.If(nvalid < N):
                        tag.put(m, op=hv.TagOpcode.LOOKUP, tag=Cat(c.expert, ctx.layer))
                        m.next = "LOOKUP"
                    with m.Elif(c.last):               # past the depth: taken, dropped
                        m.next = "FINISH"
            with m.State("LOOKUP"):
                m.d.comb += self.tag.rsp.ready.eq(ev.empty & tag.empty)
                with m.If(self.tag.rsp.valid & self.tag.rsp.ready):
                    busy = (rsp.hit & ok) | rsp.pending     # an outstanding prefetch
                    issue_event(EK.LOOKUP, code=Mux(busy, gesd.LookupResult.PENDING,
                                                    gesd.LookupResult.MISS),
                                slot=Mux(busy, rsp.slot, 0), value=tokens)
                    with m.If(busy):                       # being prefetched already
                        next_candidate()
                    with m.Else():
                        tag.put(m, op=hv.TagOpcode.ALLOCATE, tag=Cat(expert, ctx.layer),
                                planes=khb, amount=clamp(tokens, (1 << cfg.hot_bits) - 1))
                        m.next = "ALLOCATE"
            with m.State("ALLOCATE"):
                m.d.comb += self.tag.rsp.ready.eq(ev.empty)
                with m.If(self.tag.rsp.valid & self.tag.rsp.ready):
                    issue_event(EK.ALLOCATE, **allocate_fields(
                        rsp, ok, clamp(tokens, (1 << cfg.hot_bits) - 1)))
                    with m.If(ok):
                        m.d.sync += [slot.eq(rsp.slot), inc.allocations.eq(1),
                                     inc.evictions.eq(rsp.evicted)]
                        m.next = "FILL_START"
                    with m.Else():
                        m.d.sync += inc.no_victim.eq(1)
                        next_candidate()
            with m.State("FILL_START"):
                with m.If(ev.free):
                    issue_event(EK.FILL_START, slot=slot, value=hb_mask)
                    m.next = "SOURCE"
            with m.State("SOURCE"):
                with m.If(ev.free & ext.empty):
                    issue_event(EK.SOURCE, slot=slot, code=gesd.Source.PREFETCH, value=0)
                    ext.put(m, kind=hv.ExtKindCode.EXPERT,
                            addr=cfg.lpddr_base + (ctx.layer * cfg.experts + expert)
                            * cfg.expert_bytes,
                            plane_mask=0, fill=1, slot=slot, id=0)
                    m.d.sync += inc.lpddr_bytes.eq(khb * plane_bytes)
                    m.d.comb += add.eq(1)
                    next_candidate()

            # retire: PREFETCH_END, then each matching entry in issue order
            with m.State("COUNT"):                  # `match` follows the job's layer
                m.d.sync += nmatch.eq(adder_tree([match[i] for i in range(N)]))
                m.next = "END"
            with m.State("END"):
                with m.If(nmatch == 0):
                    m.next = "FINISH"
                with m.Elif(ev.free):
                    ev.put(m, kind=EK.PREFETCH_END, value=nmatch)
                    m.next = "PICK"
            with m.State("PICK"):
                with m.If(~m_any):
                    m.next = "FINISH"
                with m.Else():
                    m.d.sync += [x_i.eq(m_i), x.eq(tab[m_i])]
                    m.next = "WAIT"
            with m.State("WAIT"):                   # its response and its fill's end
                with m.If(cur.rsp & cur.fill):
                    m.d.sync += x.eq(cur)
                    with m.If(cur.err != 0):
                        m.next = "EXT_ERROR"
                    with m.Else():
                        m.next = "FILL_END"
            with m.State("EXT_ERROR"):
                with m.If(ev.free):
                    retire_event(EK.EXT_ERROR, value=x.err)
                    m.d.sync += inc.ext_errors.eq(1)
                    m.next = "FILL_END"
            with m.State("FILL_END"):
                commit = x.ok & (x.err == 0)
                with m.If(ev.free & tag.empty):
                    retire_event(EK.FILL_END, code=Mux(commit, gesd.FillEnd.COMMIT,
                                                       gesd.FillEnd.ABORT))
                    with m.If(commit):
                        m.d.sync += inc.fills.eq(1)
                        tag.put(m, op=hv.TagOpcode.UNPIN, slot=x.slot)
                    with m.Else():
                        m.d.sync += inc.aborts.eq(1)
                        tag.put(m, op=hv.TagOpcode.ABORT, slot=x.slot)
                    m.next = "RELEASE"
            with m.State("RELEASE"):
                commit = x.ok & (x.err == 0)
                m.d.comb += self.tag.rsp.ready.eq(ev.empty)
                with m.If(self.tag.rsp.valid & self.tag.rsp.ready):
                    with m.If(commit):
                        retire_event(EK.UNPIN)
                    with m.Else():
                        retire_event(EK.INVALIDATE, code=gesd.InvalidateReason.ABORT)
                    m.d.comb += drop.eq(1)
                    m.next = "SETTLE"
            with m.State("SETTLE"):                 # `match` follows the closed gap
                m.next = "PICK"

            # the job is done once its events have left
            with m.State("FINISH"):
                with m.If(ev.free & done_step.empty & done_kv.empty):
                    with m.If(from_kv):
                        done_kv.put(m)
                    with m.Else():
                        done_step.put(m)
                    m.next = "IDLE"
        return m
