"""Pass end: the ledger of the pass in flight and its retirement.

The pass engine's ``PassEntry`` s (one per announced expert, in announce
order) wait in a queue. Meanwhile the pass end collects the pass's
asynchronous reports: the stream engine's ``ExtResponse`` per LPDDR read
(by ``id`` = the entry's position), HB's ``FillDone`` per fill (by slot)
and the datapath's ``PassStats`` (the pass's weights are all consumed).
The pass is *over* when its last entry is in, its ``PassStats`` came, every
LPDDR read answered and every fill ended. Then each entry retires, in
order, as the golden does at the end of a pass:

* an LPDDR read that failed: ``EXT_ERROR`` (the step is spoilt);
* a fill: ``FILL_END`` COMMIT, or ABORT (the read failed, or HB did not
  commit) followed by the tag unit's ABORT and ``INVALIDATE`` ABORT: the
  slot never stays resident with wrong data;
* a pinned slot that was not aborted: UNPIN and ``UNPIN``.

``done`` (``Done``: whether an LPDDR error spoilt the pass) follows the
last entry's events. The reports are always taken (``ready`` = 1): they
are strobes of blocks that cannot wait.
"""

from __future__ import annotations

from amaranth.hdl import Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ...config import Config
from ...golden import esd as gesd
from .. import vocab as hv
from ..moe.queue import Queue
from .common import Emit, check_config, clear_counts
from .counters import counter_fields
from .pass_engine import pass_entries
from .payloads import counter_port, done, esd_ports, pass_entry, tag_port

__all__ = ["PassEnd"]

EK = gesd.EventKind


class PassEnd(wiring.Component):
    """Collects a pass's entries and reports, then ends the pass.

    Parameters
    ----------
    cfg : Config

    Members
    -------
    entry : ``In(stream.Signature(PassEntry))``
    ext_rsp : ``In(stream.Signature(ExtResponse))``
    fill_done : ``In(stream.Signature(FillDone))``
    dp_done : ``In(stream.Signature(PassStats))``
    done : ``Out(stream.Signature(Done))``
    tag : ``Out(tag_port(cfg))`` (UNPIN, ABORT)
    events : ``Out(stream.Signature(TraceEvent))``
    counts : ``Out(counter_port(...))`` (:attr:`COUNTS`)

    Latency: the pass is seen over two cycles after its last report (a
    registered test) and its first entry taken then; per entry two cycles
    and, for a pinned slot, a tag-unit round trip (an LPDDR error adds a
    cycle); ``done`` in the cycle after the last entry's last event.
    """

    COUNTS = ("fills", "aborts", "ext_errors")

    def __init__(self, cfg: Config):
        check_config("PassEnd", cfg)
        self.cfg = cfg
        t = esd_ports(cfg)
        S = stream.Signature
        self.entry_t = pass_entry(cfg.layer_bits, cfg.draft_len_max, cfg.expert_bits,
                                  cfg.tag_slots)
        super().__init__({
            "entry": In(S(self.entry_t)),
            "ext_rsp": In(S(t["ExtResponse"])), "fill_done": In(S(t["FillDone"])),
            "dp_done": In(S(t["PassStats"])), "done": Out(S(done())),
            "tag": Out(tag_port(cfg)),
            "events": Out(S(t["TraceEvent"])),
            "counts": Out(counter_port(counter_fields(cfg, self.COUNTS)))})

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        P, Sl = pass_entries(cfg), cfg.tag_slots
        ev = Emit(m, self.events, "ev")
        tag = Emit(m, self.tag.cmd, "tag")
        fin = Emit(m, self.done, "done")
        inc = self.counts.inc
        clear_counts(m, inc, self.COUNTS)
        m.submodules.ledger = q = Queue(self.entry_t, max(2, P))
        wiring.connect(m, wiring.flipped(self.entry), q.i)

        # what the pass waits for (bit per entry position, or per slot)
        wr = Signal(range(P + 1))           # entries in so far
        closed = Signal()                   # the last entry is in
        reads = Signal(P)                   # entry issued an LPDDR read
        answered = Signal(P)                # ... and its response came
        failed = Signal(P)                  # ... with an error
        err = Signal(3 * P)                 # ... which one
        fills = Signal(Sl)                  # a fill of the pass into the slot
        ended, committed = Signal(Sl), Signal(Sl)   # HB ended it / committed it
        stats = Signal()                    # the datapath's PassStats came
        over = Signal()
        one = Const(1, max(P, Sl))

        e = self.entry.payload
        with m.If(self.entry.valid & self.entry.ready):
            m.d.sync += [wr.eq(wr + 1), closed.eq(e.last),
                         reads.eq(reads | Mux(e.read, one << wr, 0)[:P]),
                         fills.eq(fills | Mux(e.fill, one << e.slot, 0)[:Sl])]
        r = self.ext_rsp.payload
        m.d.comb += [self.ext_rsp.ready.eq(1), self.fill_done.ready.eq(1)]
        with m.If(self.ext_rsp.valid):
            m.d.sync += [answered.bit_select(r.id, 1).eq(1),
                         failed.bit_select(r.id, 1).eq(r.error != hv.ExtErrorCode.OK),
                         err.word_select(r.id, 3).eq(r.error.as_value())]
        f = self.fill_done.payload
        clear = Signal(Sl)                  # the slot's fill is retired (FILL_END)
        m.d.sync += [ended.eq((ended & ~clear) | Mux(self.fill_done.valid, one << f.slot, 0)[:Sl]),
                     committed.eq((committed & ~clear) |
                                  Mux(self.fill_done.valid & f.ok, one << f.slot, 0)[:Sl])]
        m.d.comb += self.dp_done.ready.eq(~stats)
        with m.If(self.dp_done.valid & ~stats):
            m.d.sync += stats.eq(1)
        # sticky: retiring the pass clears `ended` bits again
        with m.If(closed & stats & ~(reads & ~answered).any() & ~(fills & ~ended).any()):
            m.d.sync += over.eq(1)

        # the entry being retired
        x = Signal(self.entry_t)
        rd = Signal(range(P))
        x_err, x_failed, x_ok = Signal(3), Signal(), Signal()
        spoilt = Signal()

        def event(kind, **fields):
            ev.put(m, kind=kind, phase=x.ctx.phase, step=x.ctx.step, layer=x.ctx.layer,
                   pass_no=x.ctx.pass_no, expert=x.expert, slot=x.slot, **fields)

        def after(unpin):
            """The next state once this entry's error / fill part is done."""
            with m.If(unpin):
                m.next = "UNPIN"
            with m.Elif(x.last):
                m.next = "FINISH"
            with m.Else():
                m.next = "POP"

        with m.FSM(init="START") as fsm:
            with m.State("START"):          # a cycle out of reset (Icarus: see common.py)
                m.next = "POP"
            # take the next entry once the pass is over
            with m.State("POP"):
                m.d.comb += q.o.ready.eq(over)
                with m.If(q.o.valid & over):
                    p = q.o.payload
                    bad = p.read & failed.bit_select(rd, 1)
                    m.d.sync += [x.eq(p), rd.eq(rd + 1), x_err.eq(err.word_select(rd, 3)),
                                 x_failed.eq(bad),
                                 x_ok.eq(committed.bit_select(p.slot, 1) & ~bad)]
                    with m.If(p.none):
                        m.next = "FINISH"
                    with m.Else():
                        m.next = "RETIRE"
            with m.State("RETIRE"):
                with m.If(x_failed):
                    m.next = "EXT_ERROR"
                with m.Elif(x.fill):
                    m.next = "FILL_END"
                with m.Elif(x.pin):
                    with m.If(tag.empty):
                        tag.put(m, op=hv.TagOpcode.UNPIN, slot=x.slot)
                        m.next = "UNPIN_WAIT"
                with m.Else():
                    after(0)
            with m.State("EXT_ERROR"):
                with m.If(ev.free):
                    event(EK.EXT_ERROR, value=x_err)
                    m.d.sync += [inc.ext_errors.eq(1), spoilt.eq(1)]
                    with m.If(x.fill):
                        m.next = "FILL_END"
                    with m.Else():
                        after(x.pin)
            with m.State("FILL_END"):
                with m.If(ev.free & tag.empty):
                    event(EK.FILL_END, code=Mux(x_ok, gesd.FillEnd.COMMIT, gesd.FillEnd.ABORT))
                    with m.If(x_ok):
                        m.d.sync += inc.fills.eq(1)
                        tag.put(m, op=hv.TagOpcode.UNPIN, slot=x.slot)
                        m.next = "UNPIN_WAIT"
                    with m.Else():
                        m.d.sync += [inc.aborts.eq(1), spoilt.eq(1)]
                        tag.put(m, op=hv.TagOpcode.ABORT, slot=x.slot)
                        m.next = "ABORT_WAIT"
            with m.State("UNPIN"):
                with m.If(tag.empty):
                    tag.put(m, op=hv.TagOpcode.UNPIN, slot=x.slot)
                    m.next = "UNPIN_WAIT"
            with m.State("UNPIN_WAIT"):
                m.d.comb += self.tag.rsp.ready.eq(ev.empty)
                with m.If(self.tag.rsp.valid & self.tag.rsp.ready):
                    event(EK.UNPIN)
                    after(Const(0))
            with m.State("ABORT_WAIT"):
                m.d.comb += self.tag.rsp.ready.eq(ev.empty)
                with m.If(self.tag.rsp.valid & self.tag.rsp.ready):
                    event(EK.INVALIDATE, code=gesd.InvalidateReason.ABORT)
                    after(Const(0))

            # the pass is retired: report it once its events have left, reset the ledger
            with m.State("FINISH"):
                with m.If(ev.free & fin.empty):
                    fin.put(m, error=spoilt)
                    m.d.sync += [wr.eq(0), rd.eq(0), closed.eq(0), reads.eq(0), answered.eq(0),
                                 failed.eq(0), fills.eq(0), stats.eq(0), spoilt.eq(0), over.eq(0)]
                    m.next = "POP"
        # a Mux, not an assignment in the state: Icarus (see common.py)
        m.d.comb += clear.eq(Mux(fsm.ongoing("FILL_END") & ev.free & tag.empty,
                                 (one << x.slot)[:Sl], 0))
        return m
