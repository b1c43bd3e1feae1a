"""KV boundary: the CONTEXT command (the KV region's size) and the expert
slots it covers.

CONTEXT(tokens) asks for a KV region of ``tokens * kv_words_per_token``
words per bank. A size beyond :func:`elmoe3d.golden.layout.kv_limit` is
refused (KV_RANGE); the current size changes nothing; any other size goes
to HB (``kv_req``), and HB's report (``kv_move``: the newly covered slots,
which of them held an expert) becomes a ``KV_MOVE`` event (new size, usable
slots) and one ``INVALIDATE`` (reason KV) per slot that held an expert, in
slot order. ``status.usable`` (slots outside the KV region) feeds the
round's SD back-off.

The round only sends CONTEXT between layer steps (the host front end takes
one command at a time), so no pass has a slot pinned when the boundary
moves (the tag unit's rule). With a prefetcher (``prefetch`` > 0) a move
first has every outstanding prefetch retired (``prefetch``: retire all),
so none is pinned either.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ...config import Config
from ...geometry import kv_limit
from ...golden import esd as gesd
from .. import vocab as hv
from ..common import adder_tree
from ..moe.common import lowest_set
from .common import Emit, check_config
from .counters import counter_fields
from .payloads import command_port, counter_port, esd_ports, kv_status, prefetch_port

__all__ = ["KvBoundary"]


class KvBoundary(wiring.Component):
    """CONTEXT in, KV boundary moves out, their events.

    Parameters
    ----------
    cfg : Config
    prefetch : int, optional
        The controller's prefetch depth; > 0 adds the ``prefetch`` port.

    Members
    -------
    cmd : ``In(command_port(...))``
        CONTEXT commands (``value`` = context tokens) and their results.
    kv_req : ``Out(stream.Signature(KVRequest))`` (registered)
    kv_move : ``In(stream.Signature(KVMove))``
    events : ``Out(stream.Signature(TraceEvent))`` (registered)
    counts : ``Out(counter_port(...))`` (:attr:`COUNTS`)
    status : ``Out(kv_status(S))``
    prefetch : ``Out(prefetch_port(...))`` (with a prefetcher)

    Latency: 3 cycles for a refused or unchanged size; a move takes 3
    cycles after HB's report plus one per invalidated slot, and its result
    follows its last event.
    """

    COUNTS = ("kv_moves", "kv_invalidations")

    def __init__(self, cfg: Config, prefetch: int = 0):
        check_config("KvBoundary", cfg)
        self.cfg, self.prefetch_depth = cfg, prefetch
        t = esd_ports(cfg)
        extra = ({"prefetch": Out(prefetch_port(cfg.layer_bits, cfg.draft_len_max))}
                 if prefetch else {})
        super().__init__({**extra,
            "cmd": In(command_port(cfg.layer_bits, cfg.draft_len_max, cfg.stat_bits)),
            "kv_req": Out(stream.Signature(t["KVRequest"])),
            "kv_move": In(stream.Signature(t["KVMove"])),
            "events": Out(stream.Signature(t["TraceEvent"])),
            "counts": Out(counter_port(counter_fields(cfg, self.COUNTS))),
            "status": Out(kv_status(cfg.tag_slots))})

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        S = cfg.tag_slots
        EK = gesd.EventKind
        ev = Emit(m, self.events, "ev")
        req = Emit(m, self.kv_req, "req")
        result = Emit(m, self.cmd.result, "result")
        pf = Emit(m, self.prefetch.order, "pf") if self.prefetch_depth else None
        inc = self.counts.inc
        m.d.sync += [inc.kv_moves.eq(0), inc.kv_invalidations.eq(0)]

        kv_words = Signal(cfg.hb_words.bit_length())       # the region as it is
        covered = Signal(S)
        usable = Signal(range(S + 1))
        m.d.sync += usable.eq(adder_tree([~covered[j] for j in range(S)]))
        m.d.comb += self.status.usable.eq(usable)
        words = Signal(hv.VALUE_BITS + max(1, cfg.kv_words_per_token.bit_length()))
        want = Signal(S)                                  # what `words` covers
        for j in range(S):
            lim = cfg.hb_words - cfg.expert_base - (j + 1) * cfg.slot_words
            m.d.sync += want[j].eq(words > lim if lim >= 0 else 1)
        over, same = Signal(), Signal()                   # `words` beyond the limit / as it is
        inv = Signal(S)                                   # slots still to report
        inv_any, inv_j = lowest_set(m, inv, "inv")

        order = self.cmd.order
        with m.FSM(init="START"):
            with m.State("START"):
                m.next = "IDLE"
            with m.State("IDLE"):
                m.d.comb += order.ready.eq(1)
                with m.If(order.valid):
                    m.d.sync += words.eq(order.payload.value * cfg.kv_words_per_token)
                    m.next = "SIZE"
            with m.State("SIZE"):                         # the tests of `words`, registered
                m.d.sync += [over.eq(words > kv_limit(cfg)), same.eq(words == kv_words)]
                m.next = "CHECK"
            with m.State("CHECK"):                        # `want` follows `words` here
                with m.If(over | same):
                    with m.If(result.empty):
                        result.put(m, error=Mux(over, gesd.HostError.KV_RANGE, 0))
                        m.next = "IDLE"
                if pf:                              # every prefetch retires first
                    with m.Elif(pf.empty):
                        pf.put(m, retire=1, all=1)
                        m.next = "RETIRE"
                else:
                    with m.Elif(req.empty):
                        req.put(m, kv_words=words)
                        m.next = "WAIT"
            if pf:
                with m.State("RETIRE"):
                    m.d.comb += self.prefetch.done.ready.eq(req.empty)
                    with m.If(self.prefetch.done.valid & self.prefetch.done.ready):
                        req.put(m, kv_words=words)
                        m.next = "WAIT"
            with m.State("WAIT"):
                m.d.comb += self.kv_move.ready.eq(1)
                with m.If(self.kv_move.valid):
                    m.d.sync += [kv_words.eq(words), covered.eq(want),
                                 inv.eq(self.kv_move.payload.invalidated), inc.kv_moves.eq(1)]
                    m.next = "SETTLE"
            with m.State("SETTLE"):                       # `usable` follows `covered`
                m.next = "MOVE"
            with m.State("MOVE"):
                with m.If(ev.free):
                    ev.put(m, kind=EK.KV_MOVE, value=kv_words, tag=usable)
                    m.next = "INVALIDATE"
            with m.State("INVALIDATE"):
                with m.If(inv_any & ev.free):
                    ev.put(m, kind=EK.INVALIDATE, slot=inv_j, code=gesd.InvalidateReason.KV)
                    m.d.sync += [inv.bit_select(inv_j, 1).eq(0), inc.kv_invalidations.eq(1)]
                with m.Elif(~inv_any & ev.free & result.empty):
                    result.put(m)
                    m.next = "IDLE"
        return m
