"""Round: the decode round's state and the host commands that change it
(ROUND, STEP, ACCEPT).

ROUND(batch, force) decides the mode (SD iff ``batch >= sd_threshold`` or
the host forces SD, and at least ``min_free_slots`` slots are ``usable``;
the host may force AR, or AR with the HB expert cache off: ``hb_cache``
low for the round, which the pass engine reads) and opens the round
(``MODE``). STEP is admitted
when it is the step the round expects next (else BAD_PHASE / BAD_ORDER),
handed to the layer step (``step``) and, once it ended without an LPDDR
error (``step_done``), the expected step advances; the last layer of an AR
or DRAFT step ends a decode step (``decode_steps``, and every
``decay_period`` of them a DECAY through the tag unit and its event).
ACCEPT(n) closes an SD round after its VERIFY (``ACCEPT``, ``ROLLBACK`` of
the rest, the draft length ``K`` adapted: ``+1`` when at least three
quarters of the drafts were accepted (``4n >= 3 * batch * K``), ``-1``
when fewer than half, ``DRAFT_LEN`` when it changed).
The rules are :class:`elmoe3d.golden.esd.EsdController`'s; a refused
command changes nothing.

Why the draft length lives here: ``K`` changes only at ACCEPT and applies
from the next ROUND, so the rule that adapts it (:meth:`_adapt`) is the
one place to change for another policy.

The DECAY event carries the ``decode_steps`` counter (``watch``): the step
that ends a decode step bumps it in the cycle it loads the DECAY command,
and the counter shows the bump two cycles later, before any tag-unit
response can return.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ...config import Config
from ...golden import esd as gesd
from .. import vocab as hv
from ..vocab import ForceCode, HostOp, RoundValue
from .common import Emit, check_config, clear_counts
from .counters import counter_fields
from .payloads import (command_port, counter_port, counter_watch, done, esd_ports, kv_status,
                       round_status, step_order, tag_port)

__all__ = ["Round"]

Ph, EK = gesd.Phase, gesd.EventKind


class Round(wiring.Component):
    """Mode decision, step sequence, DECAY and draft length.

    Parameters
    ----------
    cfg : Config

    Members
    -------
    cmd : ``In(command_port(...))``
        ROUND, STEP, ACCEPT and their results.
    status : ``Out(round_status(...))``
        ``mode``, ``k`` of the open round (changed only while a ROUND
        executes, before its result).
    hb_cache : ``Out(1)``
        Low in an AR round with the HB expert cache off (ROUND's force
        ``ForceCode.AR_NO_HB_CACHE``); a register that changes only while
        a ROUND executes, when no pass of the previous round is left (its
        last STEP has ended).
    kv : ``In(kv_status(S))``; watch : ``In(counter_watch(...))``
    step : ``Out(stream.Signature(StepOrder))``; step_done : ``In(stream.Signature(Done))``
    tag : ``Out(tag_port(cfg))`` (DECAY)
    events : ``Out(stream.Signature(TraceEvent))``
    counts : ``Out(counter_port(...))`` (:attr:`COUNTS`)

    Latency: a ROUND or an ACCEPT is decided in the cycle after it is taken
    (its tests are registered as it is taken), the result follows its last
    event by a cycle (a ROUND: 3 cycles after it is taken, an ACCEPT 3 to 5;
    2 when refused); an admitted STEP is
    handed on in the cycle it is taken, its result follows the layer step's
    end by 2 cycles (a DECAY adds a tag-unit round trip and a cycle).
    """

    COUNTS = ("rounds_ar", "rounds_sd", "accepted_tokens", "drafted_tokens", "tokens_out",
              "decode_steps", "decays")

    def __init__(self, cfg: Config):
        check_config("Round", cfg)
        self.cfg = cfg
        t = esd_ports(cfg)
        super().__init__({
            "cmd": In(command_port(cfg.layer_bits, cfg.draft_len_max, cfg.stat_bits)),
            "status": Out(round_status(cfg.draft_len_max)),
            "kv": In(kv_status(cfg.tag_slots)), "watch": In(counter_watch(cfg.stat_bits)),
            "step": Out(stream.Signature(step_order(cfg.layer_bits, cfg.draft_len_max,
                                                    hv.verify_tokens_max(cfg)))),
            "step_done": In(stream.Signature(done())),
            "tag": Out(tag_port(cfg)),
            "events": Out(stream.Signature(t["TraceEvent"])),
            "counts": Out(counter_port(counter_fields(cfg, self.COUNTS))),
            "hb_cache": Out(1, init=1)})

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        ev = Emit(m, self.events, "ev")
        result = Emit(m, self.cmd.result, "result")
        step_o = Emit(m, self.step, "step")
        tag = Emit(m, self.tag.cmd, "tag")
        inc = self.counts.inc
        clear_counts(m, inc, self.COUNTS)

        # the round
        K = Signal(range(cfg.draft_len_max + 1), init=cfg.draft_len_init)
        mode, batch = Signal(), Signal(range(gesd.MAX_BATCH + 1))
        round_k = Signal(range(cfg.draft_len_max + 1))
        round_open, expect_accept = Signal(), Signal()
        ex_phase, ex_step = Signal(2), Signal(range(cfg.draft_len_max + 1))
        ex_layer = Signal(range(max(2, cfg.layers)))
        since_decay = Signal(range(cfg.decay_period + 1))
        m.d.comb += [self.status.mode.eq(mode), self.status.k.eq(round_k)]
        # products of the round (registered: they change only with ROUND)
        drafted = Signal(range(gesd.MAX_BATCH * cfg.draft_len_max + 1))
        verify_tok = Signal(range(hv.verify_tokens_max(cfg) + 1))
        m.d.sync += [drafted.eq(batch * round_k), verify_tok.eq(batch * (round_k + 1))]

        # the command in hand, and ACCEPT's tests made as it is taken
        cmd = Signal.like(self.cmd.order.payload)
        # tests of the command made as it is taken (registers: the decisions
        # in the next state start at flip-flops)
        take = Signal(data.StructLayout({
            "bad_batch": 1, "want_sd": 1, "host_ar": 1, "hb_off": 1,   # ROUND
            "over": 1, "every": 1, "most": 1, "half": 1, "back": len(drafted)}))   # ACCEPT
        acc = Signal(data.StructLayout({"grow": 1, "shrink": 1}))

        order = self.cmd.order
        with m.FSM(init="START"):
            with m.State("START"):          # a cycle out of reset (Icarus: see common.py)
                m.next = "IDLE"
            with m.State("IDLE"):
                m.d.comb += order.ready.eq(ev.empty & result.free & step_o.empty)
                with m.If(order.valid & order.ready):
                    c = order.payload
                    rv, n = RoundValue(c.value), c.value    # ROUND's value; ACCEPT's n
                    b, force = rv.batch, rv.force
                    m.d.sync += [cmd.eq(c),
                                 take.bad_batch.eq((b < 1) | (b > gesd.MAX_BATCH) |
                                                   (force > ForceCode.AR_NO_HB_CACHE) |
                                                   (rv.zero != 0)),
                                 take.want_sd.eq(Mux(force == ForceCode.AUTO,
                                                     b >= cfg.sd_threshold,
                                                     force == ForceCode.SD)),
                                 take.host_ar.eq(force == ForceCode.AR),
                                 take.hb_off.eq(force == ForceCode.AR_NO_HB_CACHE),
                                 take.over.eq(n > drafted), take.every.eq(n == drafted),
                                 take.most.eq(n * 4 >= drafted * 3),
                                 take.half.eq(n * 2 < drafted), take.back.eq(drafted - n)]
                    with m.Switch(c.op):
                        with m.Case(HostOp.ROUND):
                            m.next = "ROUND"
                        with m.Case(HostOp.STEP):
                            with m.If(~round_open | expect_accept | (c.phase != ex_phase)):
                                result.put(m, error=gesd.HostError.BAD_PHASE)
                            with m.Elif((c.step != ex_step) | (c.layer != ex_layer)):
                                result.put(m, error=gesd.HostError.BAD_ORDER)
                            with m.Else():
                                step_o.put(m, phase=c.phase, step=c.step, layer=c.layer,
                                           tokens=Mux(c.phase == Ph.VERIFY, verify_tok, batch))
                                m.next = "STEP"
                        with m.Case(HostOp.ACCEPT):
                            m.next = "ACCEPT"
                        with m.Default():
                            result.put(m, error=gesd.HostError.BAD_PHASE)

            # ---- ROUND: refuse it, or decide the mode and open the round -------
            with m.State("ROUND"):
                with m.If(ev.empty & result.empty):
                    self._round(m, take, K, ev, result, mode, batch, round_k, round_open,
                                ex_phase, ex_step, ex_layer, inc, RoundValue(cmd.value).batch)

            # ---- STEP: wait for the layer step, advance the expected step ----
            with m.State("STEP"):
                m.d.comb += self.step_done.ready.eq(tag.empty & result.empty)
                with m.If(self.step_done.valid & self.step_done.ready):
                    err = self.step_done.payload.error
                    last_layer = cmd.layer == cfg.layers - 1
                    with m.If(err | ~last_layer):
                        with m.If(~err):
                            m.d.sync += ex_layer.eq(cmd.layer + 1)
                        result.put(m, value=err)
                        m.next = "IDLE"
                    with m.Elif(cmd.phase == Ph.VERIFY):
                        m.d.sync += [ex_layer.eq(0), expect_accept.eq(1)]
                        result.put(m)
                        m.next = "IDLE"
                    with m.Else():                # an AR or DRAFT decode step ends
                        m.d.sync += [ex_layer.eq(0), inc.decode_steps.eq(1),
                                     since_decay.eq(since_decay + 1)]
                        with m.If(cmd.phase == Ph.AR):
                            m.d.sync += [round_open.eq(0), inc.tokens_out.eq(batch)]
                        with m.Elif(cmd.step + 1 < round_k):
                            m.d.sync += ex_step.eq(cmd.step + 1)
                        with m.Else():
                            m.d.sync += [ex_phase.eq(Ph.VERIFY), ex_step.eq(0)]
                        with m.If(since_decay + 1 >= cfg.decay_period):
                            tag.put(m, op=hv.TagOpcode.DECAY)
                            m.next = "DECAY"
                        with m.Else():
                            result.put(m)
                            m.next = "IDLE"
            with m.State("DECAY"):
                m.d.comb += self.tag.rsp.ready.eq(ev.empty)
                with m.If(self.tag.rsp.valid & self.tag.rsp.ready):
                    ev.put(m, kind=EK.DECAY, value=self.watch.decode_steps)
                    m.d.sync += [since_decay.eq(0), inc.decays.eq(1)]
                    m.next = "DONE"

            # ---- ACCEPT n: refuse it, or ACCEPT, ROLLBACK, DRAFT_LEN -----------
            with m.State("ACCEPT"):
                with m.If(ev.empty & result.empty):
                    self._accept(m, take, K, ev, result, batch, drafted, round_open,
                                 expect_accept, acc, inc, cmd.value)
            with m.State("ROLLBACK"):
                with m.If(ev.free):
                    ev.put(m, kind=EK.ROLLBACK, value=take.back)
                    m.next = "DONE"
                    with m.If(acc.grow | acc.shrink):
                        m.next = "ADAPT"
            with m.State("ADAPT"):
                with m.If(ev.free):
                    newk = self._adapt(K, acc)
                    ev.put(m, kind=EK.DRAFT_LEN, value=newk)
                    m.d.sync += K.eq(newk)
                    m.next = "DONE"

            # a result once the events before it have left
            with m.State("DONE"):
                with m.If(ev.free & result.empty):
                    result.put(m)
                    m.next = "IDLE"
        return m

    def _round(self, m, take, K, ev, result, mode, batch, round_k, round_open, ex_phase,
               ex_step, ex_layer, inc, b):
        """ROUND: refuse it, or decide the mode and open the round."""
        cfg = self.cfg
        with m.If(take.bad_batch | round_open):
            result.put(m, error=gesd.HostError.BAD_BATCH)
            m.next = "IDLE"
        with m.Else():
            want = take.want_sd
            sd = want & (self.kv.usable >= cfg.min_free_slots)
            reason = Mux(take.hb_off, gesd.ModeReason.LPDDR,
                         Mux(take.host_ar, gesd.ModeReason.HOST,
                             Mux(~want, gesd.ModeReason.BATCH,
                                 Mux(sd, gesd.ModeReason.SD, gesd.ModeReason.BACKOFF))))
            ev.put(m, kind=EK.MODE, code=sd, value=Mux(sd, K, 0), tag=reason)
            m.d.sync += [mode.eq(sd), batch.eq(b), round_k.eq(Mux(sd, K, 0)), round_open.eq(1),
                         ex_phase.eq(Mux(sd, Ph.DRAFT, Ph.AR)), ex_step.eq(0), ex_layer.eq(0),
                         inc.rounds_sd.eq(sd), inc.rounds_ar.eq(~sd),
                         self.hb_cache.eq(~take.hb_off)]
            m.next = "DONE"

    def _accept(self, m, take, K, ev, result, batch, drafted, round_open, expect_accept, acc,
                inc, n):
        """ACCEPT: refuse it, or emit ACCEPT, count, close the round and note
        what follows (ROLLBACK, the draft length)."""
        cfg = self.cfg
        with m.If(~round_open | ~expect_accept | take.over):
            result.put(m, error=gesd.HostError.BAD_ACCEPT)
            m.next = "IDLE"
        with m.Else():
            ev.put(m, kind=EK.ACCEPT, value=n)
            m.d.sync += [inc.accepted_tokens.eq(n), inc.drafted_tokens.eq(drafted),
                         inc.tokens_out.eq(n + batch), round_open.eq(0), expect_accept.eq(0)]
            grow = take.most & (K < cfg.draft_len_max)
            shrink = take.half & (K > cfg.draft_len_min)
            m.d.sync += [acc.grow.eq(grow), acc.shrink.eq(shrink)]
            with m.If(~take.every):
                m.next = "ROLLBACK"
            with m.Elif(grow | shrink):
                m.next = "ADAPT"
            with m.Else():
                m.next = "DONE"

    def _adapt(self, K, acc):
        """The new draft length after an ACCEPT that changes it."""
        return Mux(acc.grow, K + 1, K - 1)
