"""Trace emitter: the controller's ``trace`` stream, fed by every unit that
produces events.

Each producer (the round, the layer step, the pass engine, the pass end,
the KV boundary) has its own ``TraceEvent`` output register
(:class:`~.common.Emit`). The emitter takes one event per cycle from them
(lowest port number first), through a
:class:`~elmoe3d.hw.streams.RegisterSlice` into a
:class:`~elmoe3d.hw.moe.queue.Queue` whose output is ``trace``.

Why the order of the trace is right without a sequence number
-------------------------------------------------------------
The trace is compared with the golden sequence in canonical order
(:func:`elmoe3d.golden.esd.canonical`): the events of one pass may come in
any order, but every *barrier* (MODE, PASS, ELIGIBLE, LAYER_DONE, DECAY,
ACCEPT, ROLLBACK, DRAFT_LEN, KV_MOVE) must keep its place. A transfer into
the emitter is the event's place in the trace. The producers hand work to
each other (an order, a result) only once their own events have been
transferred (:attr:`.common.Emit.free` of their event output), and a unit
that has not been handed work emits nothing; so events of different
producers never race, and the port order only matters for events of one
pass (pass engine and pass end), which the canonical order sorts anyway.
"""

from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ...config import Config
from .. import vocab as hv
from ..common import check_int
from ..moe.queue import Queue
from ..streams import RegisterSlice, StreamArbiter
from .common import check_config

__all__ = ["TraceEmitter"]


class TraceEmitter(wiring.Component):
    """``ports`` event producers into one ``trace`` stream.

    Parameters
    ----------
    cfg : Config
    ports : int
        Producers (>= 1).
    depth : int
        Entries of the output queue (default 8): events wait there while
        ``trace`` is stalled, before the producers stall.

    Members
    -------
    events : ``In(stream.Signature(TraceEvent)).array(ports)``
    trace : ``Out(stream.Signature(TraceEvent))``

    Latency and throughput: an event taken in cycle ``t`` is valid on
    ``trace`` in ``t + 3`` (slice, queue write, queue output register); one
    event per cycle. ``events[k].ready`` is the slice's registered
    ``ready`` and no lower-numbered producer valid: it does not depend on
    ``trace.ready``; port 0's is the slice's ``ready`` alone.
    """

    def __init__(self, cfg: Config, ports: int, depth: int = 8):
        check_config("TraceEmitter", cfg)
        check_int("Trace ports", ports, 1)
        check_int("Trace queue depth", depth, 1)
        self.cfg, self.ports, self.depth = cfg, ports, depth
        ev = stream.Signature(hv.vocab(cfg).TraceEvent)
        super().__init__({"events": In(ev).array(ports), "trace": Out(ev)})

    def elaborate(self, platform):
        m = Module()
        shape = hv.vocab(self.cfg).TraceEvent
        # no held choice: the slice takes an event only when it has room and
        # each producer keeps its own until then (hw/streams.StreamArbiter)
        m.submodules.arbiter = arb = StreamArbiter(shape, self.ports, hold=False)
        m.submodules.slice = sl = RegisterSlice(shape)
        m.submodules.queue = q = Queue(shape, self.depth)
        for k in range(self.ports):
            wiring.connect(m, wiring.flipped(self.events[k]), arb.i[k])
        wiring.connect(m, arb.o, sl.i)
        wiring.connect(m, sl.o, q.i)
        wiring.connect(m, q.o, wiring.flipped(self.trace))
        return m
