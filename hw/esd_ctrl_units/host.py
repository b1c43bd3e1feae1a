"""Host front end: routes the host's commands to the units that execute
them and their results back as responses.

ROUND, STEP and ACCEPT go to the round (:mod:`.round`), CONTEXT to the KV
boundary (:mod:`.kv`), COUNTER to the counters (:mod:`.counters`), each
through a :func:`~.payloads.command_port`; a command with another opcode
is refused here (BAD_PHASE). The response carries the executing unit's
``error`` and ``value``, the command's ``op`` and the open round's ``mode``
and ``k`` (:func:`~.payloads.round_status`; a ROUND answers with the round
it opened: the round changes them before its result). One command at a
time: the next is taken in the cycle its predecessor's response leaves.

The front end adds no cycle: a command passes to its unit in the cycle the
unit takes it, and a result (a register of the unit) is the response
while it waits. That keeps a host command's cost the executing unit's own
(a ROUND: three cycles from command to command, a COUNTER two).
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ...config import Config
from ...golden import esd as gesd
from ..vocab import HostOp, host_command, host_response
from .common import check_config
from .payloads import command_port, round_status

__all__ = ["HostFrontEnd"]


class HostFrontEnd(wiring.Component):
    """Host commands in, responses out.

    Parameters
    ----------
    cfg : Config

    Members
    -------
    cmd : ``In(stream.Signature(HostCommand))``
    rsp : ``Out(stream.Signature(HostResponse))``
    round, kv, counters : ``Out(command_port(...))``
        The executing units.
    status : ``In(round_status(...))``

    The response's ``mode`` and ``k`` are ``status`` as it is while the
    round's result waits (the round changes them only while it executes a
    command, before its result: the contract of :func:`round_status`), and
    as it was when the command was taken for the other units' results.

    Latency and throughput: combinational both ways (``cmd.ready`` is the
    target unit's ``order.ready`` while no command is open; ``rsp`` is the
    target's ``result`` with ``op``, ``mode`` and ``k``); a refused opcode
    is answered in the cycle after it is taken. The next command may be
    taken in the cycle the response leaves.
    """

    #: the executing unit of each opcode (an opcode not named is refused)
    TARGETS = {HostOp.ROUND: "round", HostOp.STEP: "round", HostOp.ACCEPT: "round",
               HostOp.CONTEXT: "kv", HostOp.COUNTER: "counters"}
    UNITS = ("round", "kv", "counters")

    def __init__(self, cfg: Config):
        check_config("HostFrontEnd", cfg)
        self.cfg = cfg
        port = command_port(cfg.layer_bits, cfg.draft_len_max, cfg.stat_bits)
        super().__init__({
            "cmd": In(stream.Signature(host_command(cfg.layer_bits, cfg.draft_len_max))),
            "rsp": Out(stream.Signature(host_response(cfg.draft_len_max, cfg.stat_bits))),
            "round": Out(port), "kv": Out(port), "counters": Out(port),
            "status": In(round_status(cfg.draft_len_max))})

    def elaborate(self, platform):
        m = Module()
        c = self.cmd.payload
        # the unit the command on `cmd` is for (none: refused)
        want = {u: Signal(name=f"want_{u}") for u in self.UNITS}
        for u in self.UNITS:
            hit = 0
            for code, t in self.TARGETS.items():
                if t == u:
                    hit = hit | (c.op == code)
            m.d.comb += want[u].eq(hit)
        refuse = Signal()
        m.d.comb += refuse.eq(~(want["round"] | want["kv"] | want["counters"]))

        open_ = Signal()                 # a command is taken, its response not yet gone
        op = Signal.like(c.op)
        # whose result answers it: UNITS index, len(UNITS) = refused here (an
        # index, not one-hot bits: exactly one answer, even from a corrupt state)
        REFUSED = len(self.UNITS)
        target = Signal(range(REFUSED + 1))
        # no command open, or its response leaves now: the next may go
        free = Signal()
        ready, pick = refuse, REFUSED
        for i, u in enumerate(self.UNITS):
            order = getattr(self, u).order
            m.d.comb += [order.valid.eq(self.cmd.valid & free & want[u]),
                         order.payload.eq(c)]
            ready = Mux(want[u], order.ready, ready)
            pick = Mux(want[u], i, pick)
        m.d.comb += self.cmd.ready.eq(free & ready)
        # the round's mode and k as the command was taken: the answer of a
        # command the round does not execute (the round changes them only
        # while it executes one of its own)
        mode, k = Signal.like(self.status.mode), Signal.like(self.status.k)
        with m.If(self.cmd.valid & self.cmd.ready):
            m.d.sync += [open_.eq(1), op.eq(c.op), target.eq(pick),
                         mode.eq(self.status.mode), k.eq(self.status.k)]
        with m.Elif(self.rsp.valid & self.rsp.ready):
            m.d.sync += open_.eq(0)

        # the response: the open command's result (a register of its unit)
        refused = target == REFUSED
        valid, error, value = refused, Mux(refused, gesd.HostError.BAD_PHASE, 0), 0
        for i, u in enumerate(self.UNITS):
            res = getattr(self, u).result
            mine = target == i
            m.d.comb += res.ready.eq(open_ & mine & self.rsp.ready)
            valid = valid | (mine & res.valid)
            error = error | Mux(mine, res.payload.error, 0)
            value = value | Mux(mine, res.payload.value, 0)
        by_round = target == self.UNITS.index("round")
        p = self.rsp.payload
        m.d.comb += [self.rsp.valid.eq(open_ & valid),
                     p.op.eq(op), p.error.eq(error), p.value.eq(value),
                     p.mode.eq(Mux(by_round, self.status.mode, mode)),
                     p.k.eq(Mux(by_round, self.status.k, k))]
        m.d.comb += free.eq(~open_ | (self.rsp.valid & self.rsp.ready))
        return m
