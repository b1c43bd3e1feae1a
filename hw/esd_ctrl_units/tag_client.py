"""Tag-unit client: the controller's one door to the tag unit.

Several units issue tag-unit commands (the layer step's eligibility probe,
the pass engine's lookups, touches and allocations, the pass end's unpins
and aborts, the round's DECAY). Each owns a :func:`~.payloads.tag_port`
(``cmd`` out, ``rsp`` in) and sees its own round trips only: the client
takes one command at a time (lowest port number first), sends it on
``tag_cmd``, and returns the tag unit's response on the ``rsp`` stream of
the port that sent it. One command is in flight: the controller's
decisions depend on each response (an ALLOCATE's victim, a lookup's hit)
and the tag unit answers in order, so nothing is lost by waiting, and a
response is always the answer to the command of the port that holds the
client.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ...config import Config
from .. import vocab as hv
from ..common import check_int
from ..streams import StreamArbiter
from .common import check_config
from .payloads import tag_port

__all__ = ["TagClient"]


class TagClient(wiring.Component):
    """``ports`` tag-unit users on one tag unit, one command in flight.

    Parameters
    ----------
    cfg : Config
    ports : int
        Users (>= 1); port 0 wins when several wait.

    Members
    -------
    users : ``In(tag_port(cfg)).array(ports)``
        ``users[k].cmd`` (in) / ``users[k].rsp`` (out).
    tag_cmd : ``Out(stream.Signature(TagCommand))``
    tag_rsp : ``In(stream.Signature(TagResponse))``

    Latency and throughput: combinational both ways (``tag_cmd`` is the
    chosen user's command, a response goes straight to its user); one round
    trip at a time, the next command leaves in the cycle after the previous
    response is taken. ``tag_rsp.ready`` is the owner's ``rsp.ready``: the
    controller puts a register slice in front of it.
    """

    def __init__(self, cfg: Config, ports: int):
        check_config("TagClient", cfg)
        check_int("Tag client ports", ports, 1)
        self.cfg, self.ports = cfg, ports
        v = hv.vocab(cfg)
        super().__init__({"users": In(tag_port(cfg)).array(ports),
                          "tag_cmd": Out(stream.Signature(v.TagCommand)),
                          "tag_rsp": In(stream.Signature(v.TagResponse))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.arbiter = arb = StreamArbiter(hv.vocab(self.cfg).TagCommand, self.ports)
        for k in range(self.ports):
            wiring.connect(m, wiring.flipped(self.users[k].cmd), arb.i[k])
        busy = Signal()                   # a command is out, its response not yet taken
        owner = Signal(range(self.ports)) # whose it is (an index: exactly one owner)
        m.d.comb += [self.tag_cmd.valid.eq(arb.o.valid & ~busy),
                     self.tag_cmd.payload.eq(arb.o.payload),
                     arb.o.ready.eq(self.tag_cmd.ready & ~busy)]
        with m.If(self.tag_cmd.valid & self.tag_cmd.ready):
            m.d.sync += busy.eq(1)
            for k in range(self.ports):
                with m.If(arb.grant[k]):
                    m.d.sync += owner.eq(k)
        mine = Signal(self.ports)
        m.d.comb += mine.eq(Cat(busy & (owner == k) for k in range(self.ports)))
        for k in range(self.ports):
            rsp = self.users[k].rsp
            m.d.comb += [rsp.valid.eq(self.tag_rsp.valid & mine[k]),
                         rsp.payload.eq(self.tag_rsp.payload)]
        ready = Cat(u.rsp.ready for u in self.users)
        m.d.comb += self.tag_rsp.ready.eq((mine & ready).any())
        with m.If(self.tag_rsp.valid & self.tag_rsp.ready):
            m.d.sync += busy.eq(0)
        return m
