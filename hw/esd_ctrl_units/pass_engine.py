"""Pass engine: the per-expert decisions of one pass.

A pass (``order``: its context and token count) starts with ``PASS``. The
datapath then announces the pass's experts (``announce``: ``ExpertNeed``,
in its announce order, ``last`` on the final one, or one ``none`` beat);
for each the engine runs a short sequence of actions, each a tag-unit
round trip (through the tag client) or an output, with its events:

=========  =====================================================================
LOOKUP     LOOKUP_PIN: a hit is pinned (``LOOKUP``)
hit        ``SOURCE`` HB (DRAFT: the ``k`` HB planes) or SPLIT (AR, VERIFY: the
           other planes from LPDDR); AR and DRAFT ``TOUCH`` the expert by its
           token count; AR and VERIFY read the LPDDR planes (``ext_cmd``)
miss       ALLOCATE a victim (``ALLOCATE``: pinned, PENDING; FREE / EVICT /
           NO_VICTIM), ``FILL_START``, ``SOURCE`` LPDDR, an LPDDR read of every
           plane that writes the HB planes into the victim; without a victim
           the read has no fill. A PENDING lookup (AR, VERIFY) reads all planes
           without a fill
answer     ``source`` (``ExpertSource``: ``hb``, ``slot``; ``lsb_hb`` and
           ``lsb_slot`` 0) and ``entry`` (``PassEntry``: what the pass end
           must end: pin, fill, LPDDR read), together
=========  =====================================================================

With the HB expert cache off (``hb_cache`` low: an AR round the host asked
for without it) an announced expert goes straight to ``SOURCE`` LPDDR: no
lookup, no fill, no touch, every plane read from LPDDR.

The ``ExtCommand`` id of an expert is its position in the pass (the pass
end matches ``ExtResponse`` s by it). After the last expert the engine
takes the next ``order``; the layer step sends it only once the pass end
has retired this pass, so the next pass's lookups never see this pass's
fills pending (the golden rule).

Why an action table and not one state per event: every action is "send
at most one tag command, one LPDDR command, one event, then wait for the
response", each output a register (:class:`~.common.Emit`); a state loads
all of its outputs in one cycle, so an expert costs one cycle per action
plus its tag-unit round trips. A second plane group per expert, a
prefetch or an extra lookup is one more action here, and an extra
``PassEntry`` field for the pass end.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ...config import Config
from ...golden import esd as gesd
from .. import vocab as hv
from .common import Emit, allocate_fields, check_config, clamp, clear_counts
from .counters import counter_fields
from .payloads import counter_port, esd_ports, pass_entry, pass_order, tag_port

__all__ = ["PassEngine", "pass_entries"]

Ph, EK = gesd.Phase, gesd.EventKind


def pass_entries(cfg: Config) -> int:
    """Most experts one pass can announce: ``min(E, T * top_k)``."""
    return min(cfg.experts, cfg.batch_tokens * cfg.top_k)


class PassEngine(wiring.Component):
    """One pass's lookups, allocations, touches, LPDDR reads and answers.

    Parameters
    ----------
    cfg : Config

    Members
    -------
    order : ``In(stream.Signature(PassOrder))``
    announce : ``In(stream.Signature(ExpertNeed))``
    source : ``Out(stream.Signature(ExpertSource))``
    ext_cmd : ``Out(stream.Signature(ExtCommand))``
    entry : ``Out(stream.Signature(PassEntry))``
    tag : ``Out(tag_port(cfg))``
    events : ``Out(stream.Signature(TraceEvent))``
    counts : ``Out(counter_port(...))`` (:attr:`COUNTS`)
    hb_cache : ``In(1)``
        Low: the HB expert cache is off for this round (stable while a pass
        runs; :class:`~.round.Round`).

    Raises
    ------
    ValueError
        When a pass can name more experts than ``ExtCommand.id`` counts.

    Latency and throughput: ``PASS`` one cycle after the order; per
    expert: the announcement is taken with its LOOKUP_PIN, then one cycle
    per action after each tag response (a hit: 2 cycles and a round trip,
    the TOUCH's round trip overlapping the SOURCE event, in AR and DRAFT;
    2 cycles and a round trip in VERIFY; a miss with a victim: 4 cycles and
    2 round trips), the answer with the last action (a cycle later for the
    pass's last expert); the next announcement is taken in the cycle after
    the answer.
    """

    COUNTS = ("hb_hits", "hb_misses", "hb_pending", "hb_bytes", "lpddr_bytes", "allocations",
              "evictions", "no_victim", "touches")

    def __init__(self, cfg: Config):
        check_config("PassEngine", cfg)
        if pass_entries(cfg) > (1 << hv.CMD_ID_BITS):
            raise ValueError(f"A pass can name {pass_entries(cfg)} experts, more than the "
                             f"{1 << hv.CMD_ID_BITS} ExtCommand ids")
        self.cfg = cfg
        t = esd_ports(cfg)
        S = stream.Signature
        super().__init__({
            "order": In(S(pass_order(cfg.layer_bits, cfg.draft_len_max, cfg.batch_tokens))),
            "announce": In(S(t["ExpertNeed"])), "source": Out(S(t["ExpertSource"])),
            "ext_cmd": Out(S(t["ExtCommand"])),
            "entry": Out(S(pass_entry(cfg.layer_bits, cfg.draft_len_max, cfg.expert_bits,
                                      cfg.tag_slots))),
            "tag": Out(tag_port(cfg)),
            "events": Out(S(t["TraceEvent"])),
            "counts": Out(counter_port(counter_fields(cfg, self.COUNTS))),
            "hb_cache": In(1, init=1)})

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        # the answer's LSB fields are 0: no LSB plane group is HB-resident for
        # this controller (the datapath then reads the LSB planes with the rest)
        n, khb = cfg.planes, cfg.hb_planes_eff
        hb_mask, all_mask = (1 << khb) - 1, (1 << n) - 1
        plane_bytes = cfg.expert_bytes // n
        ev = Emit(m, self.events, "ev")
        tag = Emit(m, self.tag.cmd, "tag")
        ext = Emit(m, self.ext_cmd, "ext")
        src = Emit(m, self.source, "src")
        ent = Emit(m, self.entry, "ent")
        inc = self.counts.inc
        clear_counts(m, inc, self.COUNTS)

        ctx = Signal.like(self.order.payload.ctx)
        nent = Signal(range(pass_entries(cfg) + 1))   # entries of the pass so far
        # the expert in hand
        cur = Signal(hv.CMD_ID_BITS)                  # its position in the pass
        expert = Signal(cfg.expert_bits)
        amount = Signal(cfg.hot_bits)                 # its token count, for the tag unit
        tokens = Signal.like(self.announce.payload.tokens)
        last = Signal()
        addr = Signal.like(self.ext_cmd.payload.addr)
        slot, pin, fill, read = Signal(hv.bits(cfg.tag_slots)), Signal(), Signal(), Signal()
        draft = ctx.phase == Ph.DRAFT
        tag_of = Cat(expert, ctx.layer)
        rsp = self.tag.rsp.payload
        ok = rsp.error == hv.TagErrorCode.OK

        def event(kind, **fields):
            ev.put(m, kind=kind, phase=ctx.phase, step=ctx.step, layer=ctx.layer,
                   pass_no=ctx.pass_no, expert=expert, **fields)

        def lpddr(mask, with_fill):
            ext.put(m, kind=hv.ExtKindCode.EXPERT, addr=addr, plane_mask=mask,
                    fill=with_fill, slot=slot, id=cur)
            m.d.sync += read.eq(1)

        def answer(read_now):
            """After the expert's last action: answer now, unless it is the
            pass's last (that one waits for the events to leave: it ends the
            pass) or an output is still full."""
            with m.If(~last & src.empty & ent.empty):
                src.put(m, hb=pin & ~fill, slot=slot, lsb_hb=0, lsb_slot=0)
                ent.put(m, ctx=ctx, expert=expert, slot=slot, pin=pin, fill=fill, read=read_now)
                m.next = "ANNOUNCE"
            with m.Else():
                m.next = "ANSWER"

        with m.FSM(init="START"):
            with m.State("START"):          # a cycle out of reset (Icarus: see common.py)
                m.next = "IDLE"
            with m.State("IDLE"):
                m.d.comb += self.order.ready.eq(ev.empty)
                with m.If(self.order.valid & self.order.ready):
                    o = self.order.payload
                    m.d.sync += [ctx.eq(o.ctx), nent.eq(0)]
                    ev.put(m, kind=EK.PASS, phase=o.ctx.phase, step=o.ctx.step,
                           layer=o.ctx.layer, pass_no=o.ctx.pass_no, value=o.tokens)
                    m.next = "ANNOUNCE"
            with m.State("ANNOUNCE"):
                a = self.announce.payload
                m.d.comb += self.announce.ready.eq(tag.empty)
                with m.If(self.announce.valid & self.announce.ready):
                    with m.If(a.none):        # a pass without experts: straight to its end
                        m.next = "NONE"
                    with m.Else():
                        m.d.sync += [cur.eq(nent), nent.eq(nent + 1), expert.eq(a.expert),
                                     tokens.eq(a.tokens), amount.eq(clamp(a.tokens, (1 << cfg.hot_bits) - 1)),
                                     last.eq(a.last), slot.eq(0), pin.eq(0), fill.eq(0),
                                     read.eq(0), addr.eq(cfg.lpddr_base + (ctx.layer * cfg.experts
                                                         + a.expert) * cfg.expert_bytes)]
                        with m.If(self.hb_cache):
                            tag.put(m, op=hv.TagOpcode.LOOKUP_PIN, tag=Cat(a.expert, ctx.layer))
                            m.next = "LOOKUP"
                        with m.Else():                # the HB cache off: all planes from LPDDR
                            m.next = "SOURCE_LPDDR"
            with m.State("NONE"):
                with m.If(ent.empty & ev.free):
                    ent.put(m, ctx=ctx, none=1, last=1)
                    m.next = "IDLE"
            with m.State("LOOKUP"):
                m.d.comb += self.tag.rsp.ready.eq(ev.empty & tag.empty)
                with m.If(self.tag.rsp.valid & self.tag.rsp.ready):
                    hit, pending = rsp.hit & ok, rsp.pending
                    event(EK.LOOKUP, code=Mux(hit, gesd.LookupResult.HIT,
                                              Mux(pending, gesd.LookupResult.PENDING,
                                                  gesd.LookupResult.MISS)),
                          slot=Mux(hit | pending, rsp.slot, 0), value=tokens)
                    with m.If(hit):
                        m.d.sync += [slot.eq(rsp.slot), pin.eq(1), inc.hb_hits.eq(~draft)]
                        with m.If(ctx.phase != Ph.VERIFY):   # AR, DRAFT: touch it meanwhile
                            tag.put(m, op=hv.TagOpcode.TOUCH, tag=tag_of, amount=amount)
                        m.next = "HIT"
                    with m.Elif(pending & ~draft):
                        m.d.sync += inc.hb_pending.eq(1)
                        m.next = "SOURCE_LPDDR"
                    with m.Else():
                        m.d.sync += inc.hb_misses.eq(1)
                        tag.put(m, op=hv.TagOpcode.ALLOCATE, tag=tag_of, planes=khb,
                                amount=amount)
                        m.next = "ALLOCATE"

            # a hit: HB (DRAFT) or split (AR / VERIFY); AR and DRAFT touch
            with m.State("HIT"):
                with m.If(ev.free & ext.empty):
                    event(EK.SOURCE, slot=slot, code=Mux(draft, gesd.Source.HB, gesd.Source.SPLIT),
                          value=Mux(draft, hb_mask, hb_mask | (all_mask & ~hb_mask) << n))
                    m.d.sync += [inc.hb_bytes.eq(khb * plane_bytes),
                                 inc.lpddr_bytes.eq(Mux(draft, 0, (n - khb) * plane_bytes))]
                    with m.If(ctx.phase != Ph.VERIFY):
                        m.next = "TOUCH"
                    with m.Else():
                        lpddr(all_mask & ~hb_mask, 0)
                        answer(1)
            with m.State("TOUCH"):
                m.d.comb += self.tag.rsp.ready.eq(ev.empty & ext.empty)
                with m.If(self.tag.rsp.valid & self.tag.rsp.ready):
                    event(EK.TOUCH, slot=slot, value=amount)
                    m.d.sync += inc.touches.eq(1)
                    with m.If(~draft):
                        lpddr(all_mask & ~hb_mask, 0)
                    answer(~draft)

            # a miss: a victim, its fill
            with m.State("ALLOCATE"):
                m.d.comb += self.tag.rsp.ready.eq(ev.empty)
                with m.If(self.tag.rsp.valid & self.tag.rsp.ready):
                    event(EK.ALLOCATE, **allocate_fields(rsp, ok, amount))
                    with m.If(ok):
                        m.d.sync += [slot.eq(rsp.slot), pin.eq(1), fill.eq(1),
                                     inc.allocations.eq(1), inc.evictions.eq(rsp.evicted)]
                        m.next = "FILL_START"
                    with m.Else():
                        m.d.sync += inc.no_victim.eq(1)
                        m.next = "SOURCE_LPDDR"
            with m.State("FILL_START"):
                with m.If(ev.free):
                    event(EK.FILL_START, slot=slot, value=hb_mask)
                    m.next = "SOURCE_LPDDR"
            with m.State("SOURCE_LPDDR"):
                with m.If(ev.free & ext.empty):
                    event(EK.SOURCE, slot=slot, code=gesd.Source.LPDDR, value=all_mask << n)
                    m.d.sync += inc.lpddr_bytes.eq(n * plane_bytes)
                    lpddr(all_mask, fill)
                    answer(1)

            # the answer to the datapath and the entry for the pass end; the
            # last entry waits for the pass's events to leave (it ends the pass)
            with m.State("ANSWER"):
                with m.If(src.empty & ent.empty & (~last | ev.free)):
                    src.put(m, hb=pin & ~fill, slot=slot, lsb_hb=0, lsb_slot=0)
                    ent.put(m, ctx=ctx, expert=expert, slot=slot, pin=pin, fill=fill, read=read,
                            last=last)
                    with m.If(last):
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "ANNOUNCE"
        return m
