"""The memory side of the ELMoE-3D tile (issue 13, item 4(a)): the Elastic-SD
controller joined with the real tag unit, the real HB bank controller and the
real external-memory stream engine, all built from one
:class:`~elmoe3d.config.Config`. A first stage of the tile top
``elmoe3d_tile``; the batched datapath is not in it yet, so the datapath side
stays top-level ports.

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
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from ..config import Config
from ..golden import tag_unit as gtu
from .esd_ctrl import EsdCtrl
from .ext_stream import ExtStream
from .hb_bank import HBBank, hb_params
from .tag_unit import TagUnit
from .vocab import FillResultCode, HBRegionKind

__all__ = ["TileMem", "fill_done_depth"]

#: controller ports wired inside the tile
_INNER = ("tag_cmd", "tag_rsp", "ext_cmd", "ext_rsp", "fill_done", "kv_req", "kv_move")


def fill_done_depth(cfg: Config) -> int:
    """Depth of the FillDone FIFO: the most fills one pass can start (see the
    module doc)."""
    return max(2, min(cfg.experts, cfg.batch_tokens * cfg.top_k, cfg.tag_slots))


class TileMem(wiring.Component):
    """Controller + tag unit + HB bank controller + stream engine for ``cfg``
    (the ports are in the module doc).

    Raises
    ------
    TypeError
        For a ``cfg`` that is not a Config.
    """

    def __init__(self, cfg: Config):
        if not isinstance(cfg, Config):
            raise TypeError(f"TileMem needs a Config, not {cfg!r}")
        self.cfg = cfg
        self.ctrl = EsdCtrl(cfg)
        self.tags = TagUnit(**gtu.params_from_config(cfg))
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
            width=data.Layout.cast(done_t).size, depth=fill_done_depth(cfg))
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
