"""Elastic-SD controller: the phase sequencer of the tile.

It produces the control sequence of :mod:`elmoe3d.golden.esd` (the
specification; read its module doc for the rules) by driving the tag unit,
the HB bank controller (KV boundary moves, fill reports), the external-memory
stream engine and the batched MoE datapath, and exports every event on its
``trace`` stream (``TraceEvent``). The testbench compares that stream with
the golden sequence in canonical order (:func:`elmoe3d.golden.esd.canonical`).

:class:`EsdCtrl` is the composition of small units joined by streams
(:mod:`elmoe3d.hw.esd_ctrl_units`, one module each; ``docs/blocks/esd_ctrl.md``
draws how they join)::

    host_cmd -> HostFrontEnd -> Round ------> LayerStep -----> PassEngine --> PassEnd
                  |   ^  |        (ROUND,       (probe,          (lookups,      (ledger,
                  |   |  |         STEP,         StepInfo,        sources,       retire)
                  |   |  |         ACCEPT,       passes)          LPDDR reads)
                  |   |  +-> KvBoundary (CONTEXT)
                  |   +----- Counters (COUNTER; every unit's increments)
                  +-> host_rsp
    every unit's events -> TraceEmitter -> trace
    Round, LayerStep, PassEngine, PassEnd -> TagClient -> tag_cmd / tag_rsp

Ports
-----
``host_cmd`` / ``host_rsp``
    Host commands (``HostCommand``: ROUND, STEP, ACCEPT, CONTEXT, COUNTER) and
    one response each (``HostResponse``: error code, mode, draft length, a
    value).
``trace``
    ``TraceEvent`` s, in execution order (canonical after sorting).
``tag_cmd`` / ``tag_rsp``
    The tag unit's command and response streams (one command in flight).
``ext_cmd`` / ``ext_rsp``
    ``ExtCommand`` (EXPERT reads with ``plane_mask``, ``fill`` and ``slot``;
    ``id`` = the expert's position in the pass) and ``ExtResponse``.
``fill_done``
    HB's report that the fill of a slot ended (``ok`` = committed).
``kv_req`` / ``kv_move``
    A KV boundary request (KV words per bank) and HB's ``KVMove`` report.
``dp_step`` / ``dp_announce`` / ``dp_source`` / ``dp_done``
    The batched datapath's per-expert source handshake
    (``docs/architecture.md`` section 8), in the datapath's own types so the
    ports join ``MoEDatapath`` directly: ``dp_announce`` <- its ``need``,
    ``dp_source`` -> its ``source``, ``dp_done`` <- its ``stats``;
    ``dp_step`` (``StepInfo``: phase, layer, eligibility mask, tokens)
    starts a layer step at the token feed (``hw/esd_feed.TokenFeed``).

Every input whose ``ready`` a unit decides passes a
:class:`~elmoe3d.hw.streams.RegisterSlice` (``host_cmd``, ``tag_rsp``,
``kv_move``, ``dp_announce``, ``dp_done``; ``ext_rsp`` and ``fill_done`` are
always ready), and every output leaves a unit's register (``trace`` a
queue; ``tag_cmd`` and ``host_rsp`` a multiplexer of units' registers), so
no ``ready`` crosses the controller combinationally.

Prefetch during drafts (``EsdCtrl(cfg, prefetch=N)``, ``N`` > 0; the
default 0 builds none of it): a :class:`~.esd_ctrl_units.prefetch.Prefetcher`
joins, ordered by the layer step (after each DRAFT pass, before each VERIFY
step) and the KV boundary (before a move). It takes the datapath's
prefetch candidates on ``dp_cand`` (``PrefetchCandidate``, one run per DRAFT
pass), shares ``ext_cmd`` with the pass engine (they never issue at once),
and gets the responses of its reads (the controller keeps one bit per
LPDDR command outstanding: whose it is; the stream engine answers in
command order) and the fill ends of its slots (``claim``).

Latency: one tag-unit round trip per tag operation (one command in
flight), a cycle per action besides; a pass ends when the datapath, every
LPDDR read and every fill of it have ended.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from ..config import Config, require_config
from . import vocab as hv
from .common import check_int
from .esd_ctrl_units.counters import COUNTERS, Counters
from .esd_ctrl_units.common import saturating_add
from .esd_ctrl_units.host import HostFrontEnd
from .esd_ctrl_units.kv import KvBoundary
from .esd_ctrl_units.pass_end import PassEnd
from .esd_ctrl_units.pass_engine import PassEngine, pass_entries
from .esd_ctrl_units.payloads import esd_ports
from .esd_ctrl_units.prefetch import Prefetcher
from .esd_ctrl_units.round import Round
from .esd_ctrl_units.step import LayerStep
from .esd_ctrl_units.tag_client import TagClient
from .esd_ctrl_units.trace import TraceEmitter
from .streams import RegisterSlice, StreamArbiter
from .vocab import (HostOp, host_command, host_response)  # re-exported: the host side imports them from here

__all__ = ["HostOp", "TagOp", "EsdCtrl", "host_command", "host_response", "esd_ports",
           "saturating_add", "COUNTERS", "BLOCK_SPECS"]

#: Tag-unit opcodes the controller issues (LOOKUP, LOOKUP_PIN, TOUCH, ALLOCATE,
#: UNPIN, ABORT, DECAY): :class:`elmoe3d.hw.vocab.TagOpcode`.
TagOp = hv.TagOpcode


class EsdCtrl(wiring.Component):
    """Elastic-SD controller for one :class:`~elmoe3d.config.Config`.

    Parameters
    ----------
    cfg : Config
    prefetch : int, optional
        Most prefetches outstanding during drafts (0: no prefetcher; at
        most ``tag_slots``).

    Members
    -------
    host_cmd, host_rsp, trace, tag_cmd, tag_rsp, ext_cmd, ext_rsp, fill_done,
    kv_req, kv_move, dp_step, dp_announce, dp_source, dp_done : streams
        See the module doc.
    dp_cand : stream
        With a prefetcher: the datapath's prefetch candidates.

    Raises
    ------
    TypeError, ValueError
        For a Config that is not one, or a pass that can name more experts
        than the ExtCommand id can count.
    """

    #: the inputs that pass a register slice (their units decide ``ready``)
    SLICED = ("host_cmd", "tag_rsp", "kv_move", "dp_announce", "dp_done")
    #: ... and with a prefetcher
    SLICED_PREFETCH = SLICED + ("dp_cand",)

    def __init__(self, cfg: Config, *, prefetch: int = 0):
        require_config("EsdCtrl", cfg)
        check_int("Prefetch depth", prefetch, 0, cfg.tag_slots)
        self.cfg, self.prefetch = cfg, prefetch
        self.entries = pass_entries(cfg)
        if self.entries > (1 << hv.CMD_ID_BITS):
            raise ValueError(f"A pass can name {self.entries} experts, more than the "
                             f"{1 << hv.CMD_ID_BITS} ExtCommand ids")
        self.t = t = esd_ports(cfg)
        S = stream.Signature
        super().__init__({
            "host_cmd": In(S(t["HostCommand"])), "host_rsp": Out(S(t["HostResponse"])),
            "trace": Out(S(t["TraceEvent"])),
            "tag_cmd": Out(S(t["TagCommand"])), "tag_rsp": In(S(t["TagResponse"])),
            "ext_cmd": Out(S(t["ExtCommand"])), "ext_rsp": In(S(t["ExtResponse"])),
            "fill_done": In(S(t["FillDone"])),
            "kv_req": Out(S(t["KVRequest"])), "kv_move": In(S(t["KVMove"])),
            "dp_step": Out(S(t["StepInfo"])), "dp_announce": In(S(t["ExpertNeed"])),
            "dp_source": Out(S(t["ExpertSource"])), "dp_done": In(S(t["PassStats"])),
            **({"dp_cand": In(S(t["PrefetchCandidate"]))} if prefetch else {}),
        })

    def elaborate(self, platform):
        m = Module()
        cfg, u = self.cfg, m.submodules
        u.host = host = HostFrontEnd(cfg)
        u.round = rnd = Round(cfg)
        N = self.prefetch
        u.layer_step = step = LayerStep(cfg, N) if N else LayerStep(cfg)
        u.pass_engine = engine = PassEngine(cfg)
        u.pass_end = end = PassEnd(cfg)
        u.kv = kv = KvBoundary(cfg, N) if N else KvBoundary(cfg)
        # trace ports by how often a producer emits (port 0: the shortest path
        # from the emitter's ready into the producer)
        producers = {"pass_engine": engine, "pass_end": end, "step": step, "round": rnd,
                     "kv": kv}
        tag_users = (engine, end, step, rnd)
        if N:
            u.prefetch = pf = Prefetcher(cfg, N)
            producers["prefetch"] = pf
            tag_users += (pf,)
            u.counters = counters = Counters(cfg, {k: p.COUNTS for k, p in producers.items()},
                                             shared=Prefetcher.COUNTS)
        else:
            u.counters = counters = Counters(cfg, {k: p.COUNTS for k, p in producers.items()})
        u.trace = trace = TraceEmitter(cfg, len(producers))
        u.tag_client = client = TagClient(cfg, len(tag_users))

        inner = {}
        for name in (self.SLICED_PREFETCH if self.prefetch else self.SLICED):
            s = u[f"{name}_slice"] = RegisterSlice(self.signature.members[name].signature
                                                   .members["payload"].shape)
            wiring.connect(m, wiring.flipped(getattr(self, name)), s.i)
            inner[name] = s.o
        port = lambda name: wiring.flipped(getattr(self, name))   # noqa: E731

        # host commands and the units that execute them
        wiring.connect(m, inner["host_cmd"], host.cmd)
        wiring.connect(m, host.rsp, port("host_rsp"))
        wiring.connect(m, host.round, rnd.cmd)
        wiring.connect(m, host.kv, kv.cmd)
        wiring.connect(m, host.counters, counters.read)
        wiring.connect(m, rnd.status, host.status)
        wiring.connect(m, kv.status, rnd.kv)
        wiring.connect(m, counters.watch, rnd.watch)
        # round -> layer step -> pass engine -> pass end -> layer step
        wiring.connect(m, rnd.step, step.order)
        wiring.connect(m, step.done, rnd.step_done)
        wiring.connect(m, step.pass_order, engine.order)
        m.d.comb += engine.hb_cache.eq(rnd.hb_cache)      # off: AR from LPDDR only
        wiring.connect(m, engine.entry, end.entry)
        wiring.connect(m, end.done, step.pass_done)
        # the datapath, the stream engine, HB
        wiring.connect(m, step.dp_step, port("dp_step"))
        wiring.connect(m, inner["dp_announce"], engine.announce)
        wiring.connect(m, engine.source, port("dp_source"))
        wiring.connect(m, inner["dp_done"], end.dp_done)
        if N:
            self._join_prefetcher(m, inner, port, step, kv, engine, end, pf)
        else:
            wiring.connect(m, engine.ext_cmd, port("ext_cmd"))
            wiring.connect(m, port("ext_rsp"), end.ext_rsp)
            wiring.connect(m, port("fill_done"), end.fill_done)
        wiring.connect(m, kv.kv_req, port("kv_req"))
        wiring.connect(m, inner["kv_move"], kv.kv_move)
        # side channels: events, counters, the tag unit
        for i, (name, p) in enumerate(producers.items()):
            wiring.connect(m, p.events, trace.events[i])
            wiring.connect(m, p.counts, getattr(counters, name))
        wiring.connect(m, trace.trace, port("trace"))
        for i, p in enumerate(tag_users):
            wiring.connect(m, p.tag, client.users[i])
        wiring.connect(m, client.tag_cmd, port("tag_cmd"))
        wiring.connect(m, inner["tag_rsp"], client.tag_rsp)
        return m

    def _join_prefetcher(self, m, inner, port, step, kv, engine, end, pf):
        """The prefetcher's jobs, candidates and LPDDR traffic (module doc)."""
        wiring.connect(m, step.prefetch, pf.step)
        m.d.comb += step.pf_slots.eq(pf.slots)
        wiring.connect(m, kv.prefetch, pf.kv)
        wiring.connect(m, inner["dp_cand"], pf.cand)
        # one LPDDR command stream; a bit per command outstanding says whose
        m.submodules.ext_arb = arb = StreamArbiter(self.t["ExtCommand"], 2)
        wiring.connect(m, engine.ext_cmd, arb.i[0])
        wiring.connect(m, pf.ext_cmd, arb.i[1])
        wiring.connect(m, arb.o, port("ext_cmd"))
        m.submodules.ext_owner = own = fifo.SyncFIFO(width=1,
                                                     depth=self.entries + self.prefetch)
        cmd, rsp = self.ext_cmd, self.ext_rsp
        m.d.comb += [own.w_en.eq(cmd.valid & cmd.ready), own.w_data.eq(arb.grant[1]),
                     own.r_en.eq(rsp.valid)]
        mine = own.r_data & own.r_rdy
        for dst, sel in ((pf.ext_rsp, mine), (end.ext_rsp, ~mine)):
            m.d.comb += [dst.valid.eq(rsp.valid & sel), dst.payload.eq(rsp.payload)]
        m.d.comb += rsp.ready.eq(Mux(mine, pf.ext_rsp.ready, end.ext_rsp.ready))
        # a fill end belongs to the prefetcher when its slot is an outstanding prefetch's
        fd = self.fill_done
        for dst, sel in ((pf.fill_done, pf.claim), (end.fill_done, ~pf.claim)):
            m.d.comb += [dst.valid.eq(fd.valid & sel), dst.payload.eq(fd.payload)]
        m.d.comb += fd.ready.eq(Mux(pf.claim, pf.fill_done.ready, end.fill_done.ready))


def _from_params(prefetch=0, **fields):
    return EsdCtrl(Config(**fields), prefetch=prefetch)


def _params(cfg):
    return cfg.to_dict()


def _block_specs():
    from ..blocks import Block
    return [Block("esd_ctrl", "elmoe3d_esd_ctrl",
                  "Elastic-SD controller: AR/SD sequencer, draft eligibility, fills, pins, "
                  "DECAY, draft length, KV back-off",
                  params=_params, factory=_from_params, order=70,
                  timing="one tag-unit command in flight; events in the golden control "
                         "sequence's order")]


BLOCK_SPECS = _block_specs()
