"""HB bank controller: ``B`` single-port SRAM banks of slice vectors, one
read stream per bank to its paired PE, a fill stream from the external-memory
stream engine, a KV-cache access port and the KV/expert boundary register.

The address map (KV region below the boundary, expert slots ``{slot, plane,
row}`` above it) is specified in :mod:`elmoe3d.golden.hb_map`; the golden
:class:`~elmoe3d.golden.hb_map.HBModel` gives the bank contents and slot valid
bits after any sequence of accepted events.

Arbitration and ordering
------------------------
Every bank is one single-port SRAM (one access per cycle). Per bank and
cycle the access goes, in priority order, to (1) the paired PE's read
session, (2) the pending KV access, (3) the fill beat at the head of the fill
FIFO. A fill beat writes ``fill_words`` banks at once and waits until all of
them are free; it is never dropped: when the FIFO is full, ``fill.ready`` is
low and the stream engine waits. Under continuous PE reads on a bank, fills
to that bank wait (PE reads win by definition); the tile schedules reads so
that this ends.

No torn expert. A read *session* (one read command, from acceptance until its
last word is read from the SRAM) and a *fill* of the same slot (from the
acceptance of its first beat until its COMMIT/ABORT beat leaves the FIFO)
exclude each other, whichever starts first finishes first:

* a fill beat at the FIFO head for slot ``X`` is not written while any bank
  has a read session on ``X`` (the FIFO head blocks);
* a read command for slot ``X`` is not accepted while a fill of ``X`` is in
  progress (any beat of ``X`` in the FIFO, or its DATA beats accepted and its
  COMMIT/ABORT not yet).

So a read returns either the whole old expert or the whole new one, exactly
the words the slot held when the command was accepted. Every fill beat clears
the slot's valid bit when accepted; COMMIT sets it when it leaves the FIFO,
ABORT leaves it clear, so a partly written expert is never resident.

Boundary moves. A write to ``boundary`` waits until no slot whose coverage
it changes (newly covered, or uncovered) is being read or filled and no KV
access is pending, then takes effect in one cycle: the newly covered slots
lose their valid bit and a ``moved`` report (new boundary, newly covered
slots, which of those were resident) is emitted. Fill beats for a covered slot are consumed without writing (the KV
data there is never overwritten) and its COMMIT does not make it resident.
Reads of a covered slot return ``error`` beats. KV accesses at or above the
boundary are refused with ``error``. In one cycle the controller applies a
boundary move before a KV access, a KV access before a read command, and a
read command before a fill beat (the order the golden model uses).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, enum, fifo, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..golden import bitslice as gbs
from ..golden.hb_map import FillKind, HBMap, axi_beat_words, hb_planes_for
from .common import check_int

__all__ = ["HBBank", "FillBeatKind", "read_cmd_layout", "read_beat_layout", "fill_layout",
           "kv_cmd_layout", "kv_rsp_layout", "moved_layout", "hb_params"]


class FillBeatKind(enum.Enum, shape=2):
    """Values equal :class:`elmoe3d.golden.hb_map.FillKind`."""
    DATA = int(FillKind.DATA)
    COMMIT = int(FillKind.COMMIT)
    ABORT = int(FillKind.ABORT)


def _bits(n: int) -> int:
    """Width of an unsigned field holding ``0 .. n-1``."""
    return max(1, (n - 1).bit_length())


def read_cmd_layout(slots, planes, slot_words):
    """PE read command: ``len + 1`` words from ``{slot, plane, 0}``."""
    return data.StructLayout({"slot": unsigned(_bits(slots)), "plane": unsigned(_bits(planes)),
                              "len": unsigned(_bits(slot_words))})


def read_beat_layout(sv_bits, planes, rows):
    """One word to the paired PE (``SliceVector`` plus its position)."""
    return data.StructLayout({"data": unsigned(sv_bits), "plane": unsigned(_bits(planes)),
                              "row": unsigned(_bits(rows)), "last": unsigned(1),
                              "error": unsigned(1)})


def fill_layout(sv_bits, fill_words, slots, planes, rows, banks):
    """``FillBeat``: ``fill_words`` words for banks ``bank .. bank+fill_words-1``
    at ``{slot, plane, row}`` (DATA), or the end of a slot's fill (COMMIT/ABORT)."""
    return data.StructLayout({
        "kind": FillBeatKind, "slot": unsigned(_bits(slots)), "plane": unsigned(_bits(planes)),
        "row": unsigned(_bits(rows)), "bank": unsigned(_bits(banks)),
        "data": data.ArrayLayout(unsigned(sv_bits), fill_words)})


def kv_cmd_layout(sv_bits, banks, words):
    return data.StructLayout({"write": unsigned(1), "bank": unsigned(_bits(banks)),
                              "addr": unsigned(_bits(words)), "data": unsigned(sv_bits)})


def kv_rsp_layout(sv_bits):
    return data.StructLayout({"data": unsigned(sv_bits), "error": unsigned(1)})


def moved_layout(words, slots):
    return data.StructLayout({"boundary": unsigned((words).bit_length()),
                              "covered": unsigned(slots), "invalidated": unsigned(slots)})


class HBBank(wiring.Component):
    """HB bank controller (see the module docstring for the rules).

    Parameters
    ----------
    banks : int
        ``B`` banks, one per PE.
    words : int
        Words per bank (power of two).
    slots : int
        Expert slots (the tag unit's ``S``); ``slot_words = words // slots``.
    planes : int
        ``k`` MSB planes held per slot (must divide ``slot_words``).
    lanes, slice_bits : int
        Slice vector = ``lanes * slice_bits`` bits, the word width.
    fill_words : int
        Words per fill beat (divides ``banks``).
    fill_depth : int
        Fill FIFO depth in beats (>= 2).

    Members
    -------
    rd_cmd : ``In(stream.Signature(read_cmd_layout)).array(B)``
        Per-bank read commands.
    rd : ``Out(stream.Signature(read_beat_layout)).array(B)``
        Per-bank words to the paired PE, in command order.
    fill : ``In(stream.Signature(fill_layout))``
        Fill beats from the stream engine.
    kv : ``In(stream.Signature(kv_cmd_layout))`` / ``kv_rsp`` ``Out(...)``
        KV accesses (one response per access, in order).
    boundary : ``In(stream.Signature(range(words + 1)))``
        Writes of the boundary register (words of KV region per bank).
    moved : ``Out(stream.Signature(moved_layout))``
        One report per boundary write.
    slot_valid : ``Out(slots)``; ``boundary_q`` : ``Out(range(words + 1))``
        Resident slots and the current boundary.

    Latency and throughput: a read command's first word is transferred 4
    cycles after the command (measured with an always-ready PE); a bank streams one word per cycle, back to back
    across commands, while its ``rd`` is ready. A fill beat is written at the
    earliest 2 cycles after acceptance, one beat per cycle when its banks are
    free of PE reads. A KV access answers 2-3 cycles after acceptance
    (one access in flight). A boundary write takes effect in the cycle it is
    accepted.

    Raises
    ------
    TypeError, ValueError
        For a parameter of the wrong kind or value, naming it.
    """

    def __init__(self, *, banks: int = 4, words: int = 4096, slots: int = 32, planes: int = 1,
                 lanes: int = 16, slice_bits: int = 4, fill_words: int = 1, fill_depth: int = 8):
        check_int("HB bank count", banks, 1, 1024)
        check_int("Lane count", lanes, 1, 1024)
        gbs.check_slice_bits(slice_bits)
        check_int("HB planes per slot", planes, 1, gbs.n_planes(slice_bits))
        self.map = HBMap(banks=banks, words=words, slots=slots, planes=planes,
                         sv_bits=lanes * slice_bits)
        check_int("Fill words per beat", fill_words, 1, banks)
        if banks % fill_words:
            raise ValueError(
                f"Fill words per beat {fill_words!r} must divide the bank count {banks}")
        check_int("Fill FIFO depth", fill_depth, 2, 1024)
        self.banks, self.words, self.slots, self.planes = banks, words, slots, planes
        self.lanes, self.slice_bits = lanes, slice_bits
        self.sv_bits = lanes * slice_bits
        self.slot_words, self.rows = self.map.slot_words, self.map.rows
        self.fill_words, self.fill_depth = fill_words, fill_depth
        self.cmd_layout = read_cmd_layout(slots, planes, self.slot_words)
        self.beat_layout = read_beat_layout(self.sv_bits, planes, self.rows)
        self.fill_layout = fill_layout(self.sv_bits, fill_words, slots, planes, self.rows, banks)
        self.kv_layout = kv_cmd_layout(self.sv_bits, banks, words)
        self.kv_rsp_layout = kv_rsp_layout(self.sv_bits)
        self.moved_layout = moved_layout(words, slots)
        super().__init__({
            "rd_cmd": In(stream.Signature(self.cmd_layout)).array(banks),
            "rd": Out(stream.Signature(self.beat_layout)).array(banks),
            "fill": In(stream.Signature(self.fill_layout)),
            "kv": In(stream.Signature(self.kv_layout)),
            "kv_rsp": Out(stream.Signature(self.kv_rsp_layout)),
            "boundary": In(stream.Signature(unsigned((words).bit_length()))),
            "moved": Out(stream.Signature(self.moved_layout)),
            "slot_valid": Out(slots),
            "boundary_q": Out((words).bit_length()),
        })

    def elaborate(self, platform):
        m = Module()
        B, S, W = self.banks, self.slots, self.words
        SW, R, K, FW = self.slot_words, self.rows, self.planes, self.fill_words
        abits = _bits(W)

        bnd = Signal(W.bit_length())                  # boundary register
        valid = Signal(S)
        m.d.comb += [self.slot_valid.eq(valid), self.boundary_q.eq(bnd)]

        def covered_mask(b):
            return Cat(*[b > j * SW for j in range(S)])

        covered = Signal(S)
        m.d.comb += covered.eq(covered_mask(bnd))

        # ---- per-slot fill bookkeeping ------------------------------------
        fill_cnt = [Signal(range(self.fill_depth + 2), name=f"fill_cnt{j}") for j in range(S)]
        fill_open = Signal(S)
        filling = Signal(S)
        m.d.comb += filling.eq(fill_open | Cat(*[c != 0 for c in fill_cnt]))
        reading = Signal(S)

        # ---- boundary register ------------------------------------------------
        kv_busy = Signal()
        newly = Signal(S)
        changed = Signal(S)
        m.d.comb += [newly.eq(covered_mask(self.boundary.payload) & ~covered),
                     changed.eq(covered_mask(self.boundary.payload) ^ covered)]
        bnd_fire = Signal()
        m.d.comb += [
            self.boundary.ready.eq(~kv_busy & ~self.moved.valid
                                   & ((changed & (reading | filling)) == 0)),
            bnd_fire.eq(self.boundary.valid & self.boundary.ready),
        ]
        with m.If(self.moved.ready):
            m.d.sync += self.moved.valid.eq(0)
        with m.If(bnd_fire):
            m.d.sync += [bnd.eq(self.boundary.payload), self.moved.valid.eq(1),
                         self.moved.payload.boundary.eq(self.boundary.payload),
                         self.moved.payload.covered.eq(newly),
                         self.moved.payload.invalidated.eq(newly & valid)]

        # ---- banks ---------------------------------------------------------------
        pe_busy = [Signal(name=f"pe_busy{b}") for b in range(B)]
        rports, wports = [], []
        for b in range(B):
            mem = Memory(shape=unsigned(self.sv_bits), depth=W, init=[])
            m.submodules[f"bank{b}"] = mem
            rports.append(mem.read_port())
            wports.append(mem.write_port())

        reading_terms = []
        for b in range(B):
            cmd, out, rp = self.rd_cmd[b], self.rd[b], rports[b]
            active = Signal(name=f"s_active{b}")
            s_slot = Signal.like(cmd.payload.slot, name=f"s_slot{b}")
            s_addr = Signal(abits, name=f"s_addr{b}")
            s_left = Signal(_bits(SW), name=f"s_left{b}")
            s_plane = Signal(_bits(K), name=f"s_plane{b}")
            s_row = Signal(_bits(R), name=f"s_row{b}")
            s_err = Signal(name=f"s_err{b}")
            # output FIFO; a read is issued only with room for it, so the SRAM
            # output never needs to be held (credit = depth - level - in flight)
            ofifo = fifo.SyncFIFOBuffered(width=self.beat_layout.size, depth=4)
            m.submodules[f"ofifo{b}"] = ofifo
            p1_valid = Signal(name=f"p1_valid{b}")
            p1_meta = Signal(self.beat_layout, name=f"p1_meta{b}")
            issue = Signal(name=f"issue{b}")
            m.d.comb += issue.eq(active & (ofifo.level + p1_valid < 4))
            m.d.comb += pe_busy[b].eq(issue & ~s_err)
            last_issue = issue & (s_left == 0)

            c = cmd.payload
            bad = Signal(name=f"bad{b}")
            m.d.comb += bad.eq(covered.bit_select(c.slot, 1) | (c.plane >= K)
                               | (c.plane * R + c.len >= SW) | (c.slot >= S))
            m.d.comb += cmd.ready.eq((~active | last_issue) & ~filling.bit_select(c.slot, 1)
                                     & ~bnd_fire)
            with m.If(issue):
                m.d.sync += [s_addr.eq(s_addr + 1), s_left.eq(s_left - 1)]
                with m.If(s_row == R - 1):
                    m.d.sync += [s_row.eq(0), s_plane.eq(s_plane + 1)]
                with m.Else():
                    m.d.sync += s_row.eq(s_row + 1)
                with m.If(s_left == 0):
                    m.d.sync += active.eq(0)
            with m.If(cmd.valid & cmd.ready):
                m.d.sync += [active.eq(1), s_slot.eq(c.slot), s_err.eq(bad), s_left.eq(c.len),
                             s_addr.eq(c.slot * SW + c.plane * R), s_plane.eq(c.plane),
                             s_row.eq(0)]
            reading_terms.append(Cat(*[active & (s_slot == j) for j in range(S)]))

            # stage 1: SRAM read; stage 2: into the output FIFO
            m.d.sync += [p1_valid.eq(issue),
                         p1_meta.plane.eq(Mux(s_err, 0, s_plane)),
                         p1_meta.row.eq(Mux(s_err, 0, s_row)),
                         p1_meta.last.eq(s_left == 0), p1_meta.error.eq(s_err)]
            kv_rd_here = Signal(name=f"kv_rd{b}")
            m.d.comb += rp.en.eq(pe_busy[b] | kv_rd_here)
            beat = Signal(self.beat_layout, name=f"beat{b}")
            m.d.comb += [beat.eq(p1_meta), beat.data.eq(Mux(p1_meta.error, 0, rp.data)),
                         ofifo.w_data.eq(beat), ofifo.w_en.eq(p1_valid),
                         out.payload.eq(ofifo.r_data), out.valid.eq(ofifo.r_rdy),
                         ofifo.r_en.eq(out.ready)]
            rports[b] = (rp, kv_rd_here, s_addr)

        reading_or = reading_terms[0]
        for t in reading_terms[1:]:
            reading_or = reading_or | t
        m.d.comb += reading.eq(reading_or)

        # ---- KV port -------------------------------------------------------------
        kv_op = Signal(self.kv_layout)
        kv_err = Signal()
        kv_rd_wait = Signal()                          # read data arrives this cycle
        kv_rd_bank = Signal(_bits(B))
        kv_go = Signal()
        m.d.comb += self.kv.ready.eq(~kv_busy & ~kv_rd_wait & ~self.kv_rsp.valid & ~bnd_fire)
        with m.If(self.kv.valid & self.kv.ready):
            m.d.sync += [kv_op.eq(self.kv.payload), kv_busy.eq(1),
                         kv_err.eq(self.kv.payload.addr >= bnd)]
        kv_bank_free = Signal()
        m.d.comb += kv_bank_free.eq(~Cat(*pe_busy).bit_select(kv_op.bank, 1))
        m.d.comb += kv_go.eq(kv_busy & (kv_err | kv_bank_free))
        kv_use = [Signal(name=f"kv_use{b}") for b in range(B)]
        for b in range(B):
            m.d.comb += kv_use[b].eq(kv_busy & ~kv_err & (kv_op.bank == b))
            # Plain Mux expressions, not `with m.If` overrides, for the SRAM
            # ports: Yosys turns an If into an `always @*` block, which Icarus
            # (-g2012) never evaluates while its inputs keep their time-0
            # values, leaving the address X until then.
            rp, kv_rd_here, s_addr = rports[b]
            m.d.comb += kv_rd_here.eq(kv_go & ~kv_err & ~kv_op.write & (kv_op.bank == b))
            m.d.comb += rp.addr.eq(Mux(kv_rd_here, kv_op.addr, s_addr))
        with m.If(self.kv_rsp.ready):
            m.d.sync += self.kv_rsp.valid.eq(0)
        with m.If(kv_go):
            m.d.sync += kv_busy.eq(0)
            with m.If(kv_err | kv_op.write):
                m.d.sync += [self.kv_rsp.valid.eq(1), self.kv_rsp.payload.error.eq(kv_err),
                             self.kv_rsp.payload.data.eq(0)]
            with m.Else():
                m.d.sync += [kv_rd_wait.eq(1), kv_rd_bank.eq(kv_op.bank)]
        with m.If(kv_rd_wait):
            m.d.sync += [kv_rd_wait.eq(0), self.kv_rsp.valid.eq(1),
                         self.kv_rsp.payload.error.eq(0)]
            with m.Switch(kv_rd_bank):
                for b in range(B):
                    with m.Case(b):
                        m.d.sync += self.kv_rsp.payload.data.eq(rports[b][0].data)

        # ---- fill FIFO -------------------------------------------------------------
        ff = fifo.SyncFIFOBuffered(width=self.fill_layout.size, depth=self.fill_depth)
        m.submodules.fill_fifo = ff
        fin = self.fill.payload
        acc = Signal()
        m.d.comb += [ff.w_data.eq(fin), ff.w_en.eq(self.fill.valid),
                     self.fill.ready.eq(ff.w_rdy), acc.eq(self.fill.valid & ff.w_rdy)]
        head = Signal(self.fill_layout)
        m.d.comb += head.eq(ff.r_data)
        head_cov = covered.bit_select(head.slot, 1)
        is_data = head.kind == FillBeatKind.DATA
        target = [Signal(name=f"fill_target{b}") for b in range(B)]
        blocked = Signal()
        block_terms = []
        for b in range(B):
            m.d.comb += target[b].eq(is_data & ~head_cov & (head.bank == (b // FW) * FW))
            block_terms.append(target[b] & (pe_busy[b] | kv_use[b]))
        m.d.comb += blocked.eq(Cat(*block_terms).any() | reading.bit_select(head.slot, 1))
        pop = Signal()
        m.d.comb += [pop.eq(ff.r_rdy & ~blocked), ff.r_en.eq(pop)]
        for b in range(B):
            wp = wports[b]
            kv_wr = kv_go & ~kv_err & kv_op.write & (kv_op.bank == b)
            fill_addr = head.slot * SW + head.plane * R + head.row
            m.d.comb += [wp.addr.eq(Mux(kv_wr, kv_op.addr, fill_addr)),
                         wp.data.eq(Mux(kv_wr, kv_op.data, head.data[b % FW])),
                         wp.en.eq(kv_wr | (pop & target[b]))]

        # per-slot counters, open flags and valid bits
        commit = Signal(S)
        clear = Signal(S)
        for j in range(S):
            inc = acc & (fin.slot == j)
            dec = pop & (head.slot == j)
            m.d.sync += fill_cnt[j].eq(fill_cnt[j] + inc - dec)
            with m.If(inc):
                m.d.sync += fill_open[j].eq(fin.kind == FillBeatKind.DATA)
            m.d.comb += [clear[j].eq(inc),
                         commit[j].eq(dec & (head.kind == FillBeatKind.COMMIT) & ~head_cov)]
        m.d.sync += valid.eq((valid | commit) & ~clear & ~Mux(bnd_fire, newly, 0))
        return m


def hb_params(cfg) -> dict:
    """Elaboration parameters of :class:`HBBank` for a Config: ``k`` = MSB half
    of the planes, fill beat = one AXI beat of the stream engine."""
    _, fw = axi_beat_words(cfg.axi_data_bits, cfg.slice_vector_bits, cfg.pes)
    return dict(banks=cfg.pes, words=cfg.hb_words, slots=cfg.tag_slots,
                planes=hb_planes_for(cfg.slice_bits), lanes=cfg.lanes,
                slice_bits=cfg.slice_bits, fill_words=fw, fill_depth=8)


def _register():
    from ..blocks import Block
    return [Block("hb_bank", "elmoe3d_hb_bank",
                  "HB bank controller: banked SRAM, PE read streams, fill FIFO, KV port, boundary",
                  hb_params, HBBank, order=40)]


BLOCK_SPECS = _register()
