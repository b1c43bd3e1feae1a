"""The ELMoE-3D tile (issue 13): :class:`TileMem` (top ``elmoe3d_tile_mem``),
the memory side -- the Elastic-SD controller joined with the real tag unit,
the real HB bank controller and the real external-memory stream engine, all
built from one :class:`~elmoe3d.config.Config`, the datapath side as
top-level ports -- and :class:`Tile` (top ``elmoe3d_tile``, at the end of
this module): ``TileMem`` + the token feed + the batched MoE datapath, with
one host command stream and one response stream.

Wiring (``docs/blocks/tile.md``, "What remains", steps 1-2)
----------------------------------------------------------
* ``ctrl.tag_cmd`` / ``ctrl.tag_rsp`` <-> ``TagUnit.i`` / ``TagUnit.o``;
* ``ctrl.ext_cmd`` / ``ctrl.ext_rsp`` <-> ``ExtStream.cmd`` / ``ExtStream.rsp``;
  the stream engine's AXI4 read master is the top-level ``m_axi_*`` port;
* ``ExtStream.fill`` -> ``HBBank.fill``;
* HB's ``commit`` strobe (``HBCommit``) -> the tag unit's ``commit``
  (``SlotStrobe``): PENDING becomes RESIDENT on the edge HB's valid bit rises;
* HB's registered ``covered`` mask -> the tag unit's ``disabled``;
* ``ctrl.kv_req`` (``KVRequest.kv_words``) -> ``HBBank.boundary``,
  ``HBBank.moved`` (``KVMove``) -> ``ctrl.kv_move``;
* HB's ``FillDone`` strobe (no ``ready``) -> a FIFO -> ``ctrl.fill_done``
  (``slot``, ``ok`` = result COMMITTED); only expert-region fill ends enter it.
  The FIFO is one cycle behind the strobe, so the tag unit has committed the
  slot before the controller sees ``ok`` (the controller's contract (3)).

Depth of the FillDone FIFO. Every fill the controller starts is one ALLOCATE
of a distinct pinned victim in the current pass, and the controller takes the
``fill_done`` of every fill of a pass before the next pass's lookups (hence
before any later fill starts). HB ends each fill exactly once (COMMITTED,
ABORTED, BUSY, COVERED, ...). So at most ``min(experts per pass, S)`` fill ends
are ever waiting: that is the depth. ``fill_done_overflow`` is a sticky flag
(a write the FIFO could not take) that the testbench asserts is never set.

Top-level ports
---------------
``host_cmd``, ``host_rsp``, ``trace``, ``dp_step``, ``dp_announce``,
``dp_source``, ``dp_done``
    The controller's (``docs/blocks/esd_ctrl.md``).
``hb_rd_cmd[b]`` / ``hb_rd[b]``
    HB's per-bank read streams (``HBRead`` / ``HBBeat``), to the datapath.
``ext_pe``
    The stream engine's ``ExtBeat`` output (LPDDR planes to the PEs).
``m_axi_ar*``, ``m_axi_r*``
    AXI4 read master (``AxiReadBus.from_prefix(dut, "m_axi")``).
``resident``, ``pending``, ``slot_valid``, ``covered`` (S bits)
    The tag unit's slot states and HB's valid / covered bits (observation:
    one definition of resident).
``fill_done_overflow``
    Sticky: the FillDone FIFO had to drop a fill end (never, by the argument
    above).

HB's KV access port is tied off (no access; responses taken).

With ``load=True`` (what :class:`Tile` builds) a second ``ExtCommand``
source joins the stream engine: ``load_cmd`` (In) / ``load_rsp`` (Out,
``ExtResponse``) and ``load_done`` (a strobe: ``valid``, ``ok``), HB's
DENSE-region fill ends. ``ctrl.ext_cmd`` and ``load_cmd`` meet in a
fixed-priority arbiter (:func:`priority_arbiter`: the controller first; a
request presented and not yet taken keeps the port). The response of a
``load_cmd`` goes back to ``load_rsp``: an ``ExtResponse`` whose ``id`` is
:data:`LOAD_ID` while a load command is out; every other to the controller.
(At ``tiny`` the controller never uses :data:`LOAD_ID` -- its ids are the
positions in a pass, below ``min(E, T * top_k)`` -- at ``default`` it can;
the tile only issues a load while the controller has no command in hand, so
the "load out" flag alone is exact there.) With ``load=False`` the module
is the one above, port for port.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from ..config import Config, require_config
from ..geometry import lpddr_layout, tag_unit_params
from .esd_ctrl import EsdCtrl
from .esd_feed import TokenFeed
from .ext_stream import ExtStream
from .hb_bank import HBBank, hb_params
from .moe import MoEDatapath
from .streams import RegisterSlice
from .tag_unit import TagUnit
from . import vocab as hv
from .vocab import FillResultCode, HBRegionKind
# the tile's host-port types, re-exported: the host side imports them from here
from .vocab import TileError, TileOp, TileRspKind, tile_command, tile_response

__all__ = ["TileMem", "Tile", "connect_compute", "TileOp", "TileRspKind", "TileError", "tile_command",
           "tile_response", "fill_done_depth", "priority_arbiter", "LOAD_ID", "BLOCK_SPECS"]

#: ``ExtCommand.id`` of the tile's dense-region load (the largest id)
LOAD_ID = (1 << hv.CMD_ID_BITS) - 1

#: TileMem ports the tile joins inside (the rest are the tile's)
_TILE_INNER = ("host_cmd", "host_rsp", "dp_step", "dp_announce", "dp_source", "dp_done", "dp_cand",
               "hb_rd_cmd", "hb_rd", "ext_pe", "load_cmd", "load_rsp", "load_done")

#: controller ports wired inside the tile
_INNER = ("tag_cmd", "tag_rsp", "ext_cmd", "ext_rsp", "fill_done", "kv_req", "kv_move")


def fill_done_depth(cfg: Config, prefetch: int = 0) -> int:
    """Depth of the FillDone FIFO: the most fills one pass can start, plus
    the prefetches outstanding (see the module doc)."""
    return max(2, min(cfg.experts, cfg.batch_tokens * cfg.top_k, cfg.tag_slots)) + prefetch


def connect_compute(m, ctrl, feed, dp) -> None:
    """The controller <-> token feed / datapath handshake
    (``docs/architecture.md`` section 8), one ``wiring.connect`` per stream:
    ``dp_step`` -> feed ``step``, feed ``tok`` -> ``tok``, ``need`` ->
    ``dp_announce``, ``dp_source`` -> ``source``, ``stats`` -> ``dp_done``.
    ``ctrl`` is anything with the controller's ``dp_*`` ports (the
    controller, :class:`TileMem`, the test joins)."""
    wiring.connect(m, ctrl.dp_step, feed.step)
    wiring.connect(m, feed.tok, dp.tok)
    wiring.connect(m, dp.need, ctrl.dp_announce)
    wiring.connect(m, ctrl.dp_source, dp.source)
    wiring.connect(m, dp.stats, ctrl.dp_done)
    if "dp_cand" in ctrl.signature.members:      # a controller that prefetches
        wiring.connect(m, dp.cand, ctrl.dp_cand)


def priority_arbiter(m, name: str, sources, sink) -> None:
    """Join ``sources`` (``(valid, ready, payload)`` triples, index 0 first)
    onto the stream ``sink`` with fixed priority: the lowest-index valid
    source is granted, and a grant whose transfer did not happen (``valid``
    without ``ready``) is kept the next cycle, so the sink sees a stable
    payload until it takes it (the stream rules; every source keeps its own
    ``valid`` too). ``ready`` reaches a source through one multiplexer."""
    n = len(sources)
    held = Signal(name=f"{name}_held")
    owner = Signal(range(max(n, 2)), name=f"{name}_owner")
    pick = Signal(range(max(n, 2)), name=f"{name}_pick")
    with m.If(held):
        m.d.comb += pick.eq(owner)
    with m.Else():
        for i in reversed(range(n)):
            with m.If(sources[i][0]):
                m.d.comb += pick.eq(i)
    for i, (valid, ready, payload) in enumerate(sources):
        with m.If(pick == i):
            m.d.comb += [sink.valid.eq(valid), sink.payload.eq(payload), ready.eq(sink.ready)]
    m.d.sync += [held.eq(sink.valid & ~sink.ready), owner.eq(pick)]


class TileMem(wiring.Component):
    """Controller + tag unit + HB bank controller + stream engine for ``cfg``
    (the ports are in the module doc).

    Raises
    ------
    TypeError
        For a ``cfg`` that is not a Config.
    """

    def __init__(self, cfg: Config, *, load: bool = False, prefetch: int = 0):
        require_config("TileMem", cfg)
        self.cfg, self.load, self.prefetch = cfg, bool(load), prefetch
        self.ctrl = EsdCtrl(cfg, prefetch=prefetch)
        self.tags = TagUnit(**tag_unit_params(cfg))
        self.hb = HBBank(**hb_params(cfg))
        self.ext = ExtStream(cfg)
        S, B = cfg.tag_slots, cfg.pes
        members = {name: member for name, member in self.ctrl.signature.members.items()
                   if name not in _INNER}
        members.update(
            hb_rd_cmd=In(stream.Signature(self.hb.read_t)).array(B),
            hb_rd=Out(stream.Signature(self.hb.beat_t)).array(B),
            ext_pe=Out(stream.Signature(self.ext.geo.vocab.ExtBeat)),
            resident=Out(S), pending=Out(S), slot_valid=Out(S), covered=Out(S),
            fill_done_overflow=Out(1))
        if self.load:
            v = hv.vocab(cfg)
            members.update(load_cmd=In(stream.Signature(v.ExtCommand)),
                           load_rsp=Out(stream.Signature(v.ExtResponse)),
                           load_done=Out(wiring.Signature({"valid": Out(1), "ok": Out(1)})))
        for name, member in self.ext.signature.members.items():
            if name.startswith("m_axi_"):
                members[name] = member
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        m.submodules.ctrl = ctrl = self.ctrl
        m.submodules.tag_unit = tags = self.tags
        m.submodules.hb = hb = self.hb
        m.submodules.ext = ext = self.ext

        # controller <-> tag unit, stream engine
        wiring.connect(m, ctrl.tag_cmd, tags.i)
        wiring.connect(m, tags.o, ctrl.tag_rsp)
        if self.load:
            self._load_port(m, ctrl, ext, hb)
        else:
            wiring.connect(m, ctrl.ext_cmd, ext.cmd)
            wiring.connect(m, ext.rsp, ctrl.ext_rsp)
        # stream engine -> HB fills; HB -> tag unit
        wiring.connect(m, ext.fill, hb.fill)
        m.d.comb += [tags.commit.valid.eq(hb.commit.valid), tags.commit.slot.eq(hb.commit.slot),
                     tags.disabled.eq(hb.covered)]
        # KV boundary
        m.d.comb += [hb.boundary.valid.eq(ctrl.kv_req.valid),
                     hb.boundary.payload.eq(ctrl.kv_req.payload.kv_words),
                     ctrl.kv_req.ready.eq(hb.boundary.ready)]
        wiring.connect(m, hb.moved, ctrl.kv_move)
        # HB's KV access port: tied off
        m.d.comb += [hb.kv.valid.eq(0), hb.kv_rsp.ready.eq(1)]

        # FillDone strobe -> FIFO -> controller
        done_t = ctrl.fill_done.payload.shape()
        m.submodules.fill_done_fifo = fd = fifo.SyncFIFOBuffered(
            width=data.Layout.cast(done_t).size, depth=fill_done_depth(cfg, self.prefetch))
        entry = Signal(done_t)
        m.d.comb += [entry.slot.eq(hb.fill_done.slot),
                     entry.ok.eq(hb.fill_done.result == FillResultCode.COMMITTED),
                     fd.w_data.eq(entry),
                     fd.w_en.eq(hb.fill_done.valid & (hb.fill_done.region == HBRegionKind.EXPERT)),
                     ctrl.fill_done.valid.eq(fd.r_rdy),
                     ctrl.fill_done.payload.eq(fd.r_data),
                     fd.r_en.eq(ctrl.fill_done.ready)]
        with m.If(fd.w_en & ~fd.w_rdy):
            m.d.sync += self.fill_done_overflow.eq(1)

        # the rest are top-level ports
        for name in self.ctrl.signature.members:
            if name not in _INNER:
                wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(ctrl, name))
        for b in range(cfg.pes):
            wiring.connect(m, wiring.flipped(self.hb_rd_cmd[b]), hb.rd_cmd[b])
            wiring.connect(m, hb.rd[b], wiring.flipped(self.hb_rd[b]))
        wiring.connect(m, ext.pe, wiring.flipped(self.ext_pe))
        for name, member in self.ext.signature.members.items():
            if name.startswith("m_axi_"):
                if member.flow == In:
                    m.d.comb += getattr(ext, name).eq(getattr(self, name))
                else:
                    m.d.comb += getattr(self, name).eq(getattr(ext, name))
        m.d.comb += [self.resident.eq(tags.resident), self.pending.eq(tags.pending),
                     self.slot_valid.eq(hb.slot_valid), self.covered.eq(hb.covered)]
        return m

    def _load_port(self, m, ctrl, ext, hb):
        """The load port (module doc): arbiter in, responses routed out."""
        ld = self.load_cmd
        priority_arbiter(m, "ext_arb", [(ctrl.ext_cmd.valid, ctrl.ext_cmd.ready,
                                         ctrl.ext_cmd.payload),
                                        (ld.valid, ld.ready, ld.payload)], ext.cmd)
        out = Signal()                       # a load command is out, its response not back
        with m.If(ld.valid & ld.ready):
            m.d.sync += out.eq(1)
        mine = Signal()
        m.d.comb += mine.eq(out & (ext.rsp.payload.id == LOAD_ID))
        m.d.comb += [ctrl.ext_rsp.payload.eq(ext.rsp.payload),
                     self.load_rsp.payload.eq(ext.rsp.payload),
                     ctrl.ext_rsp.valid.eq(ext.rsp.valid & ~mine),
                     self.load_rsp.valid.eq(ext.rsp.valid & mine),
                     ext.rsp.ready.eq(Mux(mine, self.load_rsp.ready, ctrl.ext_rsp.ready))]
        with m.If(ext.rsp.valid & mine & self.load_rsp.ready):
            m.d.sync += out.eq(0)
        m.d.comb += [self.load_done.valid.eq(hb.fill_done.valid &
                                             (hb.fill_done.region == HBRegionKind.DENSE)),
                     self.load_done.ok.eq(hb.fill_done.result == FillResultCode.COMMITTED)]


# -- the tile top ---------------------------------------------------------------------

class Tile(wiring.Component):
    """The ELMoE-3D tile (top ``elmoe3d_tile``): :class:`TileMem` (controller,
    tag unit, HB bank controller, stream engine; ``load=True``) +
    :class:`~elmoe3d.hw.esd_feed.TokenFeed` + :class:`~elmoe3d.hw.moe.MoEDatapath`,
    with one host command stream and one response stream.

    Inside: HB's ``rd_cmd[b]`` / ``rd[b]`` <-> the datapath's ``hb_cmd[b]``
    / ``hb_data[b]``, the stream engine's ``ext_pe`` -> the datapath's
    ``ext``, and the controller <-> feed / datapath handshake of
    :class:`~elmoe3d.tb.esd_dp_join.EsdDpJoin` (``dp_step`` -> feed ``step``,
    feed ``tok`` -> ``tok``, ``need`` -> ``dp_announce``, ``dp_source`` ->
    ``source``, ``stats`` -> ``dp_done``), all with ``wiring.connect``.

    Parameters
    ----------
    cfg : Config
    prefetch : int, optional
        The controller's prefetch depth during drafts (0: none; the
        datapath then computes no candidates either).

    Members
    -------
    host_cmd : ``In(stream.Signature(TileCommand))``
        ROUND / STEP / ACCEPT / CONTEXT / COUNTER go to the controller as its
        ``HostCommand`` (one ``CTRL`` response each, in order); TOKEN sends
        ``x`` to the token feed (no response; a step's vectors follow its
        STEP: a vector waits at the head of the stream until the controller
        has started its step); LOAD_DENSE loads the whole dense region
        (``dense_words`` rows from ``lpddr_layout(cfg).dense_base``) with one
        ``ExtCommand`` of kind DENSE (``id`` :data:`LOAD_ID`) and answers
        with one ``TILE`` response (``op`` LOAD_DENSE, ``error``
        :class:`TileError` OK or LOAD_FAILED, ``value`` = the
        ``ExtResponse`` error code | 8 when HB did not commit the fill) once both the
        stream engine's response and HB's DENSE ``fill_done`` are in.
        LOAD_DENSE is refused (``TILE`` response, ``error`` BUSY, nothing
        issued) while a forwarded command has no response yet; opcode 7 gets
        ``error`` BAD_OP. Commands after a LOAD_DENSE wait until it is
        answered.
    host_rsp : ``Out(stream.Signature(TileResponse))``
        ``CTRL`` responses (in command order), ``OUTPUT`` beats (the layer
        outputs, in token order, ``last`` on a step's final token) and
        ``TILE`` answers, through one fixed-priority arbiter: OUTPUT first,
        then CTRL, then TILE (a granted source keeps the port until it is
        taken). A step's response may come before its final outputs.
    trace : ``Out(stream.Signature(TraceEvent))``
        The controller's event stream.
    m_axi_ar*, m_axi_r*
        The stream engine's AXI4 read master (LPDDR: expert and dense images).
    resident, pending, slot_valid, covered, fill_done_overflow
        Observation outputs of :class:`TileMem`.

    Latency and throughput: a command takes one cycle in the input register
    slice and one in the front end; ROUND..COUNTER then cost what the
    controller takes (``docs/blocks/esd_ctrl.md``), TOKEN one cycle per
    vector into the feed (the feed's one token per cycle), LOAD_DENSE the
    dense image's bursts (``dense_words * B * L*s/8`` bytes) plus a few
    cycles. Responses leave through a register slice, one per cycle.

    Raises
    ------
    TypeError
        For a ``cfg`` that is not a Config.
    """

    def __init__(self, cfg: Config, *, prefetch: int = 0):
        require_config("Tile", cfg)
        self.cfg, self.prefetch = cfg, prefetch
        self.mem = TileMem(cfg, load=True, prefetch=prefetch)
        self.feed = TokenFeed(cfg)
        self.dp = MoEDatapath(cfg, prefetch=True) if prefetch else MoEDatapath(cfg)
        self.cmd_t, self.rsp_t = tile_command(cfg), tile_response(cfg)
        S = stream.Signature
        members = {"host_cmd": In(S(self.cmd_t)), "host_rsp": Out(S(self.rsp_t))}
        members.update({n: mb for n, mb in self.mem.signature.members.items()
                        if n not in _TILE_INNER})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        m.submodules.mem = mem = self.mem
        m.submodules.feed = feed = self.feed
        m.submodules.dp = dp = self.dp
        # the datapath side
        connect_compute(m, mem, feed, dp)
        for b in range(cfg.pes):
            wiring.connect(m, dp.hb_cmd[b], mem.hb_rd_cmd[b])
            wiring.connect(m, mem.hb_rd[b], dp.hb_data[b])
        wiring.connect(m, mem.ext_pe, dp.ext)
        # the rest of TileMem's ports are the tile's
        for name in self.mem.signature.members:
            if name not in _TILE_INNER:
                mine, theirs = getattr(self, name), getattr(mem, name)
                if hasattr(mine, "signature"):
                    wiring.connect(m, wiring.flipped(mine), theirs)
                elif self.signature.members[name].flow == In:
                    m.d.comb += theirs.eq(mine)
                else:
                    m.d.comb += mine.eq(theirs)

        # ---- host commands ------------------------------------------------------------
        m.submodules.cmd_slice = cin = RegisterSlice(self.cmd_t)
        wiring.connect(m, wiring.flipped(self.host_cmd), cin.i)
        c = cin.o.payload
        hc = mem.host_cmd
        outstanding = Signal(range(8))       # forwarded commands without their response
        ans = Signal(mem.host_rsp.payload.shape())   # the tile's own answer
        ans_valid, ans_ready = Signal(), Signal()
        got_rsp, got_done = Signal(), Signal()
        ext_err = Signal(hv.ExtErrorCode)
        fill_ok = Signal()
        lay = lpddr_layout(cfg)
        ld = mem.load_cmd
        m.d.comb += [hc.payload.op.eq(c.op), hc.payload.phase.eq(c.phase),
                     hc.payload.step.eq(c.step), hc.payload.layer.eq(c.layer),
                     hc.payload.value.eq(c.value), feed.x.payload.x.eq(c.x),
                     ld.payload.kind.eq(hv.ExtKindCode.DENSE), ld.payload.addr.eq(lay.dense_base),
                     ld.payload.length.eq(cfg.dense_words), ld.payload.id.eq(LOAD_ID),
                     mem.load_rsp.ready.eq(1)]
        with m.FSM(name="front"):
            with m.State("IDLE"):
                with m.Switch(c.op):
                    with m.Case(TileOp.ROUND, TileOp.STEP, TileOp.ACCEPT, TileOp.CONTEXT,
                                TileOp.COUNTER):
                        m.d.comb += [hc.valid.eq(cin.o.valid), cin.o.ready.eq(hc.ready)]
                    with m.Case(TileOp.TOKEN):
                        m.d.comb += [feed.x.valid.eq(cin.o.valid), cin.o.ready.eq(feed.x.ready)]
                    with m.Case(TileOp.LOAD_DENSE):
                        m.d.comb += cin.o.ready.eq(1)
                        with m.If(cin.o.valid):
                            m.d.sync += [ans.op.eq(TileOp.LOAD_DENSE), ans.value.eq(0),
                                         got_rsp.eq(0), got_done.eq(0)]
                            with m.If(outstanding == 0):
                                m.next = "ISSUE"
                            with m.Else():
                                m.d.sync += ans.error.eq(TileError.BUSY)
                                m.next = "ANSWER"
                    with m.Default():
                        m.d.comb += cin.o.ready.eq(1)
                        with m.If(cin.o.valid):
                            m.d.sync += [ans.op.eq(c.op), ans.error.eq(TileError.BAD_OP),
                                         ans.value.eq(0)]
                            m.next = "ANSWER"
            with m.State("ISSUE"):
                m.d.comb += ld.valid.eq(1)
                with m.If(ld.ready):
                    m.next = "WAIT"
            with m.State("WAIT"):
                with m.If(got_rsp & got_done):
                    m.d.sync += [ans.error.eq(Mux((ext_err == hv.ExtErrorCode.OK) & fill_ok,
                                                  TileError.OK, TileError.LOAD_FAILED)),
                                 ans.value.eq(ext_err.as_value() | (~fill_ok << 3))]
                    m.next = "ANSWER"
            with m.State("ANSWER"):
                m.d.comb += ans_valid.eq(1)
                with m.If(ans_ready):
                    m.next = "IDLE"
        with m.If(mem.load_rsp.valid):
            m.d.sync += [got_rsp.eq(1), ext_err.eq(mem.load_rsp.payload.error)]
        with m.If(mem.load_done.valid):
            m.d.sync += [got_done.eq(1), fill_ok.eq(mem.load_done.ok)]

        # ---- responses -----------------------------------------------------------------
        m.submodules.rsp_slice = rout = RegisterSlice(self.rsp_t)
        wiring.connect(m, rout.o, wiring.flipped(self.host_rsp))
        r_out, r_ctrl, r_tile = (Signal(self.rsp_t, name=f"rsp_{n}")
                                 for n in ("out", "ctrl", "tile"))
        m.d.comb += [r_out.kind.eq(TileRspKind.OUTPUT),
                     r_ctrl.kind.eq(TileRspKind.CTRL), r_ctrl.rsp.eq(mem.host_rsp.payload),
                     r_tile.kind.eq(TileRspKind.TILE), r_tile.rsp.eq(ans)]
        # the datapath's outputs reach the arbiter through a register slice of
        # their own: the output stage's state ends at flip-flops beside it, not
        # at the response slice's 557 payload bits across the die
        m.submodules.out_slice = oslice = RegisterSlice(dp.o.payload.shape())
        wiring.connect(m, dp.o, oslice.i)
        m.d.comb += r_out.out.eq(oslice.o.payload)
        priority_arbiter(m, "rsp_arb", [(oslice.o.valid, oslice.o.ready, r_out),
                                        (mem.host_rsp.valid, mem.host_rsp.ready, r_ctrl),
                                        (ans_valid, ans_ready, r_tile)], rout.i)
        fwd = hc.valid & hc.ready
        back = mem.host_rsp.valid & mem.host_rsp.ready
        m.d.sync += outstanding.eq(outstanding + fwd - back)
        return m


def _factory(config, prefetch=0):
    return Tile(Config(**config), prefetch=prefetch)


def _params(cfg):
    return {"config": cfg.to_dict()}


def _block_specs():
    from ..blocks import Block
    return [Block("tile", "elmoe3d_tile",
                  "the tile: controller, tag unit, HB, LPDDR stream engine and MoE datapath "
                  "joined; AXI4 master",
                  params=_params, factory=_factory, order=90,
                  timing="host commands and responses one stream each; layer steps as the "
                         "blocks above",
                  synth=False)]


BLOCK_SPECS = _block_specs()
