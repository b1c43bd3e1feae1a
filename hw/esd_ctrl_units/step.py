"""Layer step: one admitted STEP, from the DRAFT eligibility probe to
``LAYER_DONE``.

A DRAFT step first probes the layer's ``E`` experts (a LOOKUP each through
the tag unit): eligible = resident, and ``ELIGIBLE`` carries the mask; AR
and VERIFY steps route over every expert (mask all ones). The step's
``StepInfo`` (phase, layer, mask, tokens) goes to the token feed
(``dp_step``); then its ``tokens`` are cut into passes of up to ``T``
consecutive tokens, each handed to the pass engine (``pass_order``) and
waited for (``pass_done``: the pass end retired it). ``LAYER_DONE`` carries
whether an LPDDR error spoilt any pass; ``done`` follows it.

With a prefetcher (``prefetch`` > 0) the step also orders its jobs
(``prefetch``): after each DRAFT pass has ended, the prefetches of that
pass (before the next pass or ``LAYER_DONE``); before a VERIFY step's
first pass, the retirement of its layer's outstanding prefetches. The
probe leaves the outstanding prefetches' slots (``pf_slots``) out of the
eligible mask: they are PENDING until retired, even once HB committed them.

The step counts the cycles of each phase (``ar_cycles``, ``draft_cycles``,
``verify_cycles``: from the order to ``LAYER_DONE``) and the probe's
lookups (``draft_lookups``).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ...config import Config
from ...golden import esd as gesd
from .. import vocab as hv
from .common import Emit, check_config
from .counters import counter_fields
from .payloads import (counter_port, done, esd_ports, pass_order, prefetch_port, step_order,
                       tag_port)

__all__ = ["LayerStep"]

Ph, EK = gesd.Phase, gesd.EventKind


class LayerStep(wiring.Component):
    """Eligibility probe, ``StepInfo``, passes, ``LAYER_DONE``.

    Parameters
    ----------
    cfg : Config
    prefetch : int, optional
        The controller's prefetch depth; > 0 adds the ``prefetch`` port.

    Members
    -------
    order : ``In(stream.Signature(StepOrder))``; done : ``Out(stream.Signature(Done))``
    tag : ``Out(tag_port(cfg))`` (the probe's LOOKUPs)
    dp_step : ``Out(stream.Signature(StepInfo))``
    pass_order : ``Out(stream.Signature(PassOrder))``
    pass_done : ``In(stream.Signature(Done))``
    events : ``Out(stream.Signature(TraceEvent))``
    counts : ``Out(counter_port(...))`` (:attr:`COUNTS`)
    prefetch : ``Out(prefetch_port(...))``; pf_slots : ``In(tag_slots)`` (with a prefetcher)

    Latency: ``StepInfo`` and the first pass with the order (AR, VERIFY); a DRAFT probe adds one tag-unit round trip per expert (the next
    LOOKUP leaves in the cycle after a response) and a cycle; the next pass
    leaves in the cycle after a pass's end; ``done`` two cycles after the
    last pass's end.
    """

    COUNTS = ("ar_cycles", "draft_cycles", "verify_cycles", "draft_lookups")

    def __init__(self, cfg: Config, prefetch: int = 0):
        check_config("LayerStep", cfg)
        self.cfg, self.prefetch_depth = cfg, prefetch
        t = esd_ports(cfg)
        extra = ({"prefetch": Out(prefetch_port(cfg.layer_bits, cfg.draft_len_max)),
                  "pf_slots": In(cfg.tag_slots)} if prefetch else {})
        super().__init__({**extra,
            "order": In(stream.Signature(step_order(cfg.layer_bits, cfg.draft_len_max,
                                                    hv.verify_tokens_max(cfg)))),
            "done": Out(stream.Signature(done())),
            "tag": Out(tag_port(cfg)),
            "dp_step": Out(stream.Signature(t["StepInfo"])),
            "pass_order": Out(stream.Signature(pass_order(cfg.layer_bits, cfg.draft_len_max,
                                                          cfg.batch_tokens))),
            "pass_done": In(stream.Signature(done())),
            "events": Out(stream.Signature(t["TraceEvent"])),
            "counts": Out(counter_port(counter_fields(cfg, self.COUNTS)))})

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        E, T = cfg.experts, cfg.batch_tokens
        ev = Emit(m, self.events, "ev")
        tag = Emit(m, self.tag.cmd, "tag")
        info = Emit(m, self.dp_step, "info")
        po = Emit(m, self.pass_order, "pass")
        fin = Emit(m, self.done, "done")
        inc = self.counts.inc

        step = Signal.like(self.order.payload)
        tok_left = Signal.like(step.tokens)
        pass_no = Signal(hv.TRACE_PASS_BITS)
        mask = Signal(E)
        probe = Signal(range(E))
        err = Signal()
        busy = Signal()                     # from the order to LAYER_DONE
        m.d.sync += [inc.ar_cycles.eq(busy & (step.phase == Ph.AR)),
                     inc.draft_cycles.eq(busy & (step.phase == Ph.DRAFT)),
                     inc.verify_cycles.eq(busy & (step.phase == Ph.VERIFY)),
                     inc.draft_lookups.eq(0)]

        def next_pass(left, number):
            po.put(m, ctx=Cat(step.phase, step.step, step.layer, number[:hv.TRACE_PASS_BITS]),
                   tokens=Mux(left > T, T, left))

        def first_pass(o):
            """AR, VERIFY: every expert, the first pass."""
            m.d.sync += mask.eq((1 << E) - 1)
            info.put(m, phase=o.phase, layer=o.layer, mask=(1 << E) - 1, tokens=o.tokens)
            po.put(m, ctx=Cat(o.phase, o.step, o.layer, Const(0, hv.TRACE_PASS_BITS)),
                   tokens=Mux(o.tokens > T, T, o.tokens))
            m.next = "PASS_WAIT"

        def after_pass(spoilt, back=False):
            """The next pass (``back`` to PASS_WAIT), or LAYER_DONE after the last."""
            with m.If(tok_left > T):
                m.d.sync += [tok_left.eq(tok_left - T), pass_no.eq(pass_no + 1)]
                next_pass(tok_left - T, pass_no + 1)
                if back:
                    m.next = "PASS_WAIT"
            with m.Else():
                ev.put(m, kind=EK.LAYER_DONE, phase=step.phase, step=step.step,
                       layer=step.layer, code=spoilt)
                m.d.sync += busy.eq(0)
                m.next = "DONE"

        pf = Emit(m, self.prefetch.order, "pf") if self.prefetch_depth else None

        with m.FSM(init="START"):
            with m.State("START"):          # a cycle out of reset (Icarus: see common.py)
                m.next = "IDLE"
            with m.State("IDLE"):
                o = self.order.payload
                free = tag.empty & info.empty & po.empty
                m.d.comb += self.order.ready.eq(free & pf.empty if pf else free)
                with m.If(self.order.valid & self.order.ready):
                    m.d.sync += [step.eq(o), tok_left.eq(o.tokens), pass_no.eq(0), err.eq(0),
                                 busy.eq(1), probe.eq(0), mask.eq(0)]
                    with m.If(o.phase == Ph.DRAFT):
                        tag.put(m, op=hv.TagOpcode.LOOKUP,
                                tag=Cat(Const(0, cfg.expert_bits), o.layer))
                        m.next = "PROBE"
                    if pf:
                        with m.Elif(o.phase == Ph.VERIFY):
                            # the layer's prefetches retire before its verification
                            pf.put(m, ctx=Cat(o.phase, o.step, o.layer,
                                              Const(0, hv.TRACE_PASS_BITS)), retire=1)
                            m.next = "RETIRE"
                    with m.Else():
                        first_pass(o)

            # DRAFT eligibility: LOOKUP every expert of the layer, one at a time
            with m.State("PROBE"):
                rsp = self.tag.rsp
                m.d.comb += rsp.ready.eq(tag.empty)
                with m.If(rsp.valid & rsp.ready):
                    hit = rsp.payload.hit & (rsp.payload.error == hv.TagErrorCode.OK)
                    if pf:                  # an outstanding prefetch is not eligible yet
                        hit = hit & ~self.pf_slots.bit_select(rsp.payload.slot, 1)
                    m.d.sync += [mask.eq(mask | (hit << probe)), probe.eq(probe + 1),
                                 inc.draft_lookups.eq(1)]
                    with m.If(probe == E - 1):
                        m.next = "ELIGIBLE"
                    with m.Else():
                        nxt = Signal(cfg.expert_bits)
                        m.d.comb += nxt.eq(probe + 1)
                        tag.put(m, op=hv.TagOpcode.LOOKUP, tag=Cat(nxt, step.layer))
            with m.State("ELIGIBLE"):
                with m.If(ev.empty & info.empty):
                    ev.put(m, kind=EK.ELIGIBLE, phase=step.phase, step=step.step,
                           layer=step.layer, value=mask)
                    info.put(m, phase=step.phase, layer=step.layer, mask=mask,
                             tokens=step.tokens)
                    m.next = "PASS"

            # the passes: hand one over once the step's events have left
            with m.State("PASS"):
                with m.If(ev.free & po.empty):
                    next_pass(tok_left, pass_no)
                    m.next = "PASS_WAIT"
            with m.State("PASS_WAIT"):
                m.d.comb += self.pass_done.ready.eq(po.empty & ev.empty)
                with m.If(self.pass_done.valid & self.pass_done.ready):
                    spoilt = err | self.pass_done.payload.error
                    m.d.sync += err.eq(spoilt)
                    if pf:
                        with m.If(step.phase == Ph.DRAFT):   # the pass's prefetches first
                            pf.put(m, ctx=Cat(step.phase, step.step, step.layer,
                                              pass_no[:hv.TRACE_PASS_BITS]))
                            m.next = "PREFETCH"
                        with m.Else():
                            after_pass(spoilt)
                    else:
                        after_pass(spoilt)
            if pf:
                with m.State("RETIRE"):
                    m.d.comb += self.prefetch.done.ready.eq(info.empty & po.empty)
                    with m.If(self.prefetch.done.valid & self.prefetch.done.ready):
                        first_pass(step)
                with m.State("PREFETCH"):
                    m.d.comb += self.prefetch.done.ready.eq(po.empty & ev.empty)
                    with m.If(self.prefetch.done.valid & self.prefetch.done.ready):
                        after_pass(err, back=True)
            with m.State("DONE"):
                with m.If(ev.free & fin.empty):
                    fin.put(m, error=err)
                    m.next = "IDLE"
        return m
