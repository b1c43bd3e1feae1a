"""External-memory stream engine: an AXI4 read master that fetches expert
slices from LPDDR in INCR bursts and splits every beat, as it arrives,
between the PE stream and the HB fill stream.

The LPDDR layout of an expert, the burst cut and the golden split are
specified in :mod:`elmoe3d.golden.hb_map` (:func:`~elmoe3d.golden.hb_map.bursts`,
:func:`~elmoe3d.golden.hb_map.split_command`).

How it works
------------
The *address side* takes one command at a time and walks the planes the
command reads (``planes`` for the PEs, plus the ``k`` MSB planes when
``fill`` is set), issuing INCR bursts of at most ``max_burst`` beats that never
cross a 4 KiB boundary, back to back, with up to ``max_outstanding`` bursts in
flight. For every burst it queues a descriptor (plane, length, where the beats
go); the command's last burst is marked as its end (an aborted command, or one
that reads no plane, gets an explicit *end* descriptor instead).

The *data side* pops descriptors in order (one AXI ID, so data returns in
issue order). Each beat goes to the PE stream when its plane is wanted by the
PEs, to the HB fill stream when its plane is one of the ``k`` MSB planes of an
expert being cached, or to both in the same cycle (``rready`` waits until
every stream it goes to has room, so one read feeds both). When a command
ends it sends the fill's COMMIT beat and the response one cycle later from a
holding register, while the next command's PE beats keep flowing (a beat
bound for the fill stream waits that one cycle: the fill stream has one write
port and stays in order).

Errors. A beat with ``rresp`` SLVERR or DECERR marks the command failed: that
beat and every later beat of the command are read from the bus and discarded,
the address side issues no further bursts of it, the fill ends with an ABORT
beat instead of COMMIT (so the HB slot stays invalid) and the response has
``ok = 0, resident = 0``. Beats delivered before the error are not recalled:
the PE stream of a failed command simply ends without its ``last`` beat.
"""

from __future__ import annotations

from amaranth.hdl import Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from ..golden.hb_map import AXI_4K, ExpertLayout, axi_beat_words, hb_planes_for
from .common import check_int
from .hb_bank import FillBeatKind, _bits, fill_layout

__all__ = ["ExtStream", "ExtHBPair", "ext_cmd_layout", "ext_rsp_layout", "pe_beat_layout",
           "ext_params"]


def ext_cmd_layout(addr_bits, planes, slots, id_bits):
    """One command: expert base byte address, PE plane mask, cache flag,
    destination slot, command id."""
    return data.StructLayout({"addr": unsigned(addr_bits), "planes": unsigned(planes),
                              "fill": unsigned(1), "slot": unsigned(_bits(slots)),
                              "id": unsigned(id_bits)})


def ext_rsp_layout(slots, id_bits):
    return data.StructLayout({"id": unsigned(id_bits), "ok": unsigned(1),
                              "resident": unsigned(1), "slot": unsigned(_bits(slots))})


def pe_beat_layout(sv_bits, fill_words, planes, rows, banks, id_bits):
    """One AXI beat for the PEs: ``fill_words`` slice vectors for banks
    ``bank ..`` at ``{plane, row}``; ``last`` on the command's final PE beat."""
    return data.StructLayout({
        "data": data.ArrayLayout(unsigned(sv_bits), fill_words), "plane": unsigned(_bits(planes)),
        "row": unsigned(_bits(rows)), "bank": unsigned(_bits(banks)), "id": unsigned(id_bits),
        "last": unsigned(1)})


class ExtStream(wiring.Component):
    """AXI4 read master + PE/HB split (see the module docstring).

    Parameters
    ----------
    data_bits : int
        AXI data width (power of two, a multiple of the slice vector whose
        word count divides ``banks``).
    addr_bits : int
        AXI address width (12..64).
    id_bits : int
        AXI ID width (all bursts use ID 0).
    max_burst : int
        Longest burst in beats (1..256).
    max_outstanding : int
        Bursts in flight (1..64).
    lanes, slice_bits, banks, rows, hb_planes, slots : int
        Expert shape (``rows`` per plane per bank) and HB slot geometry.
    cmd_id_bits : int
        Width of the command id echoed in PE beats and responses.
    out_depth : int
        Depth of the PE and fill output FIFOs (>= 2).

    Members
    -------
    cmd : ``In(stream.Signature(ext_cmd_layout))``
    rsp : ``Out(stream.Signature(ext_rsp_layout))``
        One response per command, in order.
    pe : ``Out(stream.Signature(pe_beat_layout))``
    fill : ``Out(stream.Signature(fill_layout))``
        HB fill beats (:class:`elmoe3d.hw.hb_bank.HBBank`'s ``fill``).
    m_axi_ar* / m_axi_r* : AXI4 read address and data channels (plain
        top-level ports, so ``AxiReadBus.from_prefix(dut, "m_axi")`` binds).

    Latency and throughput: the first AR of a command leaves 2 cycles after
    the command is accepted; a beat reaches ``pe``/``fill`` 2 cycles after
    its R handshake; one R beat per cycle while the outputs have room, so
    with ``max_outstanding * max_burst`` beats above the memory's latency the
    bus runs at its peak, back to back across commands. A command that fills
    HB costs one R cycle (its COMMIT beat shares the fill FIFO's write port).

    Raises
    ------
    TypeError, ValueError
        For a parameter of the wrong kind or value, naming it.
    """

    def __init__(self, *, data_bits: int = 64, addr_bits: int = 32, id_bits: int = 4,
                 max_burst: int = 16, max_outstanding: int = 8, lanes: int = 16,
                 slice_bits: int = 4, banks: int = 4, rows: int = 128, hb_planes: int = 1,
                 slots: int = 32, cmd_id_bits: int = 4, out_depth: int = 4):
        check_int("AXI address width", addr_bits, 12, 64)
        check_int("AXI ID width", id_bits, 1, 16)
        check_int("Outstanding bursts", max_outstanding, 1, 64)
        check_int("Tag-unit slot count", slots, 1, 4096)
        check_int("Command id width", cmd_id_bits, 1, 16)
        check_int("Output FIFO depth", out_depth, 2, 1024)
        self.lay = ExpertLayout(slice_bits=slice_bits, lanes=lanes, banks=banks, rows=rows,
                                hb_planes=hb_planes, data_bits=data_bits, max_burst=max_burst)
        if self.lay.expert_bytes.bit_length() > addr_bits:
            raise ValueError(f"AXI address width {addr_bits!r} cannot address one "
                             f"{self.lay.expert_bytes}-byte expert")
        self.data_bits, self.addr_bits, self.id_bits = data_bits, addr_bits, id_bits
        self.max_burst, self.max_outstanding = max_burst, max_outstanding
        self.lanes, self.slice_bits, self.banks, self.rows = lanes, slice_bits, banks, rows
        self.hb_planes, self.slots, self.cmd_id_bits = hb_planes, slots, cmd_id_bits
        self.out_depth = out_depth
        lay = self.lay
        self.planes, self.sv_bits, self.fill_words = lay.planes, lay.sv_bits, lay.fill_words
        self.cmd_layout = ext_cmd_layout(addr_bits, lay.planes, slots, cmd_id_bits)
        self.rsp_layout = ext_rsp_layout(slots, cmd_id_bits)
        self.pe_layout = pe_beat_layout(lay.sv_bits, lay.fill_words, lay.planes, rows, banks,
                                        cmd_id_bits)
        self.fill_layout = fill_layout(lay.sv_bits, lay.fill_words, slots, hb_planes, rows, banks)
        super().__init__({
            "cmd": In(stream.Signature(self.cmd_layout)),
            "rsp": Out(stream.Signature(self.rsp_layout)),
            "pe": Out(stream.Signature(self.pe_layout)),
            "fill": Out(stream.Signature(self.fill_layout)),
            "m_axi_arid": Out(id_bits),
            "m_axi_araddr": Out(addr_bits),
            "m_axi_arlen": Out(8),
            "m_axi_arsize": Out(3),
            "m_axi_arburst": Out(2),
            "m_axi_arvalid": Out(1),
            "m_axi_arready": In(1),
            "m_axi_rid": In(id_bits),
            "m_axi_rdata": In(data_bits),
            "m_axi_rresp": In(2),
            "m_axi_rlast": In(1),
            "m_axi_rvalid": In(1),
            "m_axi_rready": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        lay = self.lay
        n, K, R, B, FW = lay.planes, self.hb_planes, self.rows, self.banks, self.fill_words
        bb = lay.beat_bytes
        bb_log = bb.bit_length() - 1
        PB = lay.plane_beats
        meta_depth = self.max_outstanding + 2
        seq_bits = max(4, (meta_depth + 2).bit_length() + 1)

        # burst / end descriptor passed from the address side to the data side
        meta_layout = data.StructLayout({
            "end": unsigned(1), "last_burst": unsigned(1), "plane": unsigned(_bits(n)),
            "first": unsigned(1),
            "len": unsigned(8), "to_pe": unsigned(1), "to_fill": unsigned(1),
            "pe_last": unsigned(1), "fill": unsigned(1), "slot": unsigned(_bits(self.slots)),
            "id": unsigned(self.cmd_id_bits)})
        m.submodules.meta = meta = fifo.SyncFIFOBuffered(width=meta_layout.size, depth=meta_depth)
        m.submodules.pe_fifo = pe_fifo = fifo.SyncFIFOBuffered(width=self.pe_layout.size,
                                                               depth=self.out_depth)
        m.submodules.fill_fifo = fill_fifo = fifo.SyncFIFOBuffered(width=self.fill_layout.size,
                                                                   depth=self.out_depth)
        m.submodules.rsp_fifo = rsp_fifo = fifo.SyncFIFOBuffered(width=self.rsp_layout.size,
                                                                 depth=2)
        m.d.comb += [
            self.pe.payload.eq(pe_fifo.r_data), self.pe.valid.eq(pe_fifo.r_rdy),
            pe_fifo.r_en.eq(self.pe.ready),
            self.fill.payload.eq(fill_fifo.r_data), self.fill.valid.eq(fill_fifo.r_rdy),
            fill_fifo.r_en.eq(self.fill.ready),
            self.rsp.payload.eq(rsp_fifo.r_data), self.rsp.valid.eq(rsp_fifo.r_rdy),
            rsp_fifo.r_en.eq(self.rsp.ready),
        ]

        # ---- shared state ------------------------------------------------------------
        outstanding = Signal(range(self.max_outstanding + 1))
        ar_seq = Signal(seq_bits)          # sequence number of the address side's command
        r_seq = Signal(seq_bits)           # ... of the command at the data side's head
        r_failed = Signal()

        # ---- address side -------------------------------------------------------------
        c_base = Signal(self.addr_bits)
        c_planes = Signal(n)
        c_fill = Signal()
        c_slot = Signal(_bits(self.slots))
        c_id = Signal(self.cmd_id_bits)
        left = Signal(n)                   # planes still to read
        c_marked = Signal()                # the command's last burst carries its end
        beat = Signal(range(PB + 1))       # next beat within the current plane
        ar_addr = Signal(self.addr_bits)
        ar_valid = Signal()
        ar_meta = Signal(meta_layout)
        m.d.comb += [self.m_axi_arid.eq(0), self.m_axi_araddr.eq(ar_addr),
                     self.m_axi_arlen.eq(ar_meta.len), self.m_axi_arsize.eq(bb_log),
                     self.m_axi_arburst.eq(1), self.m_axi_arvalid.eq(ar_valid)]
        ar_fire = Signal()
        m.d.comb += ar_fire.eq(ar_valid & self.m_axi_arready)

        # lowest plane still to read (priority encoder)
        plane = Signal(_bits(n))
        for p in reversed(range(n)):
            with m.If(left[p]):
                m.d.comb += plane.eq(p)
        msb_mask = Const((1 << K) - 1, n)
        addr = Signal(self.addr_bits)
        m.d.comb += addr.eq(c_base + plane * lay.plane_bytes + (beat << bb_log))
        to_4k = Signal(range(AXI_4K // bb + 1))
        m.d.comb += to_4k.eq((AXI_4K - addr[:12]) >> bb_log)
        remain = Signal(range(PB + 1))
        m.d.comb += remain.eq(PB - beat)
        blen = Signal(range(max(self.max_burst, PB, AXI_4K // bb) + 1))
        cap = Mux(remain < self.max_burst, remain, self.max_burst)
        m.d.comb += blen.eq(Mux(to_4k < cap, to_4k, cap))
        plane_done = Signal()
        m.d.comb += plane_done.eq(beat + blen == PB)
        higher_pe = Signal(n)
        m.d.comb += higher_pe.eq(c_planes >> (plane + 1))

        in_flight = Signal(range(meta_depth + 2))
        m.d.comb += in_flight.eq(outstanding + ar_valid)
        room = Signal()
        m.d.comb += room.eq((in_flight < self.max_outstanding)
                            & (meta.level + ar_valid < meta_depth))
        aborting = Signal()
        m.d.comb += aborting.eq(r_failed & (r_seq == ar_seq))

        meta_w = Signal(meta_layout)
        m.d.comb += [meta.w_data.eq(meta_w), meta.w_en.eq(0)]

        is_last = Signal()
        m.d.comb += is_last.eq(plane_done & ((left & ~(Const(1, n) << plane)[:n]) == 0))

        def load():
            m.d.sync += [
                ar_valid.eq(1), ar_addr.eq(addr),
                ar_meta.end.eq(0), ar_meta.plane.eq(plane), ar_meta.first.eq(beat == 0),
                ar_meta.len.eq(blen - 1), ar_meta.to_pe.eq(c_planes.bit_select(plane, 1)),
                ar_meta.to_fill.eq(c_fill & (plane < K)),
                ar_meta.pe_last.eq(c_planes.bit_select(plane, 1) & (higher_pe == 0)),
                ar_meta.fill.eq(c_fill), ar_meta.slot.eq(c_slot), ar_meta.id.eq(c_id),
                ar_meta.last_burst.eq(is_last), c_marked.eq(is_last),
            ]
            with m.If(plane_done):
                m.d.sync += [beat.eq(0), left.eq(left & ~(Const(1, n) << plane)[:n])]
            with m.Else():
                m.d.sync += beat.eq(beat + blen)

        with m.If(ar_fire):
            m.d.comb += [meta_w.eq(ar_meta), meta.w_en.eq(1)]
            m.d.sync += [ar_valid.eq(0), outstanding.eq(outstanding + 1)]

        with m.FSM(name="ar") as ar_fsm:
            with m.State("IDLE"):
                with m.If(self.cmd.valid):
                    p = self.cmd.payload
                    m.d.sync += [c_base.eq(p.addr & ~Const(bb - 1, self.addr_bits)),
                                 c_planes.eq(p.planes), c_fill.eq(p.fill), c_slot.eq(p.slot),
                                 c_id.eq(p.id), beat.eq(0), c_marked.eq(0),
                                 left.eq(p.planes | Mux(p.fill, msb_mask, 0))]
                    m.next = "ISSUE"
            with m.State("ISSUE"):
                # `ar_valid` once raised is held until the handshake (AXI rule);
                # an abort only stops the next burst from being loaded
                more = (left != 0) & ~aborting
                with m.If(more & (~ar_valid | ar_fire) & room):
                    load()
                with m.Elif(~more & (~ar_valid | ar_fire)):
                    # an aborted command (or one reading no plane) needs an
                    # explicit end descriptor; otherwise its last burst is it
                    with m.If(c_marked):
                        m.d.sync += ar_seq.eq(ar_seq + 1)
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "END"
            with m.State("END"):
                with m.If(~ar_valid & meta.w_rdy):
                    m.d.comb += [meta_w.end.eq(1), meta_w.fill.eq(c_fill), meta_w.slot.eq(c_slot),
                                 meta_w.id.eq(c_id), meta.w_en.eq(1)]
                    m.d.sync += ar_seq.eq(ar_seq + 1)
                    m.next = "IDLE"

        # a plain assignment rather than one inside the FSM's case statement:
        # Icarus never evaluates an `always @*` block whose inputs do not change
        # after time 0, which would leave `cmd.ready` X until the first command
        m.d.comb += self.cmd.ready.eq(ar_fsm.ongoing("IDLE"))

        # ---- data side --------------------------------------------------------------------
        head = Signal(meta_layout)
        m.d.comb += head.eq(meta.r_data)
        have = meta.r_rdy
        cnt = Signal(8)
        row = Signal(_bits(R))
        bank = Signal(_bits(B))
        cur_row = Signal(_bits(R))
        cur_bank = Signal(_bits(B))
        fresh = head.first & (cnt == 0)
        m.d.comb += [cur_row.eq(Mux(fresh, 0, row)), cur_bank.eq(Mux(fresh, 0, bank))]
        # A command ends at its last burst's last beat (or an explicit end
        # descriptor); its COMMIT/ABORT beat and response are written from the
        # `pend` register in a later cycle, so the next command's beats keep
        # flowing. Only a beat that needs the fill FIFO (or ends a command)
        # waits while `pend` is full, which keeps the fill stream in order.
        pend = Signal()
        pend_fill = Signal()
        pend_failed = Signal()
        pend_slot = Signal(_bits(self.slots))
        pend_id = Signal(self.cmd_id_bits)
        ends_cmd = head.last_burst & (cnt == head.len)
        pe_room = ~head.to_pe | pe_fifo.w_rdy
        fill_room = ~head.to_fill | (fill_fifo.w_rdy & ~pend)
        m.d.comb += self.m_axi_rready.eq(have & ~head.end & pe_room & fill_room
                                         & ~(ends_cmd & pend))
        r_fire = Signal()
        m.d.comb += r_fire.eq(self.m_axi_rvalid & self.m_axi_rready)
        bad = self.m_axi_rresp[1]           # SLVERR (0b10) or DECERR (0b11)
        keep = Signal()
        m.d.comb += keep.eq(r_fire & ~r_failed & ~bad)
        last_of_plane = (cur_row == R - 1) & (cur_bank == B - FW)
        words = [self.m_axi_rdata[i * self.sv_bits:(i + 1) * self.sv_bits] for i in range(FW)]

        pe_w = Signal(self.pe_layout)
        m.d.comb += [pe_w.plane.eq(head.plane), pe_w.row.eq(cur_row), pe_w.bank.eq(cur_bank),
                     pe_w.id.eq(head.id), pe_w.last.eq(head.pe_last & last_of_plane),
                     pe_fifo.w_data.eq(pe_w), pe_fifo.w_en.eq(keep & head.to_pe)]
        for i in range(FW):
            m.d.comb += pe_w.data[i].eq(words[i])
        fill_w = Signal(self.fill_layout)
        end_kind = Mux(pend_failed, FillBeatKind.ABORT, FillBeatKind.COMMIT)
        m.d.comb += [fill_w.kind.eq(Mux(pend, end_kind, FillBeatKind.DATA)),
                     fill_w.slot.eq(Mux(pend, pend_slot, head.slot)),
                     fill_w.plane.eq(Mux(pend, 0, head.plane)),
                     fill_w.row.eq(Mux(pend, 0, cur_row)), fill_w.bank.eq(Mux(pend, 0, cur_bank))]
        for i in range(FW):
            m.d.comb += fill_w.data[i].eq(Mux(pend, 0, words[i]))
        m.d.comb += [fill_fifo.w_data.eq(fill_w), fill_fifo.w_en.eq(keep & head.to_fill)]

        with m.If(r_fire):
            with m.If(bad):
                m.d.sync += r_failed.eq(1)
            with m.If(cur_bank == B - FW):
                m.d.sync += [bank.eq(0), row.eq(cur_row + 1)]
            with m.Else():
                m.d.sync += [bank.eq(cur_bank + FW), row.eq(cur_row)]
            with m.If(cnt == head.len):
                m.d.sync += cnt.eq(0)
                m.d.comb += meta.r_en.eq(1)
                m.d.sync += outstanding.eq(outstanding - 1 + ar_fire)
            with m.Else():
                m.d.sync += cnt.eq(cnt + 1)

        # command end: from the last beat, or from an explicit end descriptor
        end_desc = have & head.end & ~pend
        with m.If(end_desc):
            m.d.comb += meta.r_en.eq(1)
        with m.If((r_fire & ends_cmd) | end_desc):
            m.d.sync += [pend.eq(1), pend_fill.eq(head.fill), pend_slot.eq(head.slot),
                         pend_id.eq(head.id), pend_failed.eq(r_failed | (r_fire & bad)),
                         r_failed.eq(0), r_seq.eq(r_seq + 1)]
        rsp_w = Signal(self.rsp_layout)
        m.d.comb += [rsp_w.id.eq(pend_id), rsp_w.ok.eq(~pend_failed),
                     rsp_w.resident.eq(pend_fill & ~pend_failed), rsp_w.slot.eq(pend_slot),
                     rsp_fifo.w_data.eq(rsp_w)]
        with m.If(pend & rsp_fifo.w_rdy & (~pend_fill | fill_fifo.w_rdy)):
            m.d.comb += [rsp_fifo.w_en.eq(1), fill_fifo.w_en.eq(pend_fill)]
            m.d.sync += pend.eq(0)
        return m


def ext_params(cfg) -> dict:
    """Elaboration parameters of :class:`ExtStream` for a Config: the AXI width
    is ``cfg.axi_data_bits`` adjusted so one beat holds whole slice vectors for
    one row of banks (:func:`elmoe3d.golden.hb_map.axi_beat_words`); ``rows``
    fills one HB slot with the ``k`` MSB planes."""
    data_bits, _ = axi_beat_words(cfg.axi_data_bits, cfg.slice_vector_bits, cfg.pes)
    k = hb_planes_for(cfg.slice_bits)
    rows = (cfg.hb_words // cfg.tag_slots) // k
    return dict(data_bits=data_bits, addr_bits=32, id_bits=4, max_burst=16, max_outstanding=16,
                lanes=cfg.lanes, slice_bits=cfg.slice_bits, banks=cfg.pes, rows=rows, hb_planes=k,
                slots=cfg.tag_slots, cmd_id_bits=4, out_depth=4)


def _register():
    from ..blocks import Block
    return [Block("ext_stream", "elmoe3d_ext_stream",
                  "AXI4 stream engine: expert reads split to the PE stream and the HB fill",
                  ext_params, ExtStream, order=50,
                  sweep=(dict(axi_data_bits=64), dict(axi_data_bits=128, pes=8)))]


BLOCK_SPECS = _register()


class ExtHBPair(wiring.Component):
    """The stream engine with its fill stream wired to an HB bank controller
    (integration harness for tests; not a registered block): the ports of
    both, minus the internal ``fill`` stream.

    Parameters
    ----------
    ext, hb : dict
        Parameters of :class:`ExtStream` and :class:`~elmoe3d.hw.hb_bank.HBBank`
        (their fill layouts must agree).
    """

    def __init__(self, *, ext: dict, hb: dict):
        from .hb_bank import HBBank
        if not isinstance(ext, dict) or not isinstance(hb, dict):
            raise TypeError(f"ext and hb must be parameter dicts, not {ext!r}, {hb!r}")
        self._ext = ExtStream(**ext)
        self._hb = HBBank(**hb)
        if self._ext.fill_layout != self._hb.fill_layout:
            raise ValueError(
                f"Stream engine and HB bank disagree on the fill beat: {ext!r} vs {hb!r}")
        members = {k: v for k, v in self._ext.signature.members.items() if k != "fill"}
        members.update({k: v for k, v in self._hb.signature.members.items() if k != "fill"})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.ext = ext = self._ext
        m.submodules.hb = hb = self._hb
        wiring.connect(m, ext.fill, hb.fill)
        for sub in (ext, hb):
            for name, member in sub.signature.members.items():
                if name == "fill":
                    continue
                outer, inner = getattr(self, name), getattr(sub, name)
                if member.is_port:
                    if member.flow == wiring.In:
                        m.d.comb += inner.eq(outer)
                    else:
                        m.d.comb += outer.eq(inner)
                elif member.dimensions:
                    for i in range(member.dimensions[0]):
                        wiring.connect(m, wiring.flipped(outer[i]), inner[i])
                else:
                    wiring.connect(m, wiring.flipped(outer), inner)
        return m
