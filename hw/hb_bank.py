"""HB bank controller: ``B`` single-port SRAM banks of slice vectors, one read
stream per bank to its paired PE, the fill stream from the external-memory
stream engine, a KV-cache port and the KV boundary register.

The rules (what is resident, which reads succeed, what a fill must look like,
what a KV access may touch) are those of the golden model,
:mod:`elmoe3d.golden.hb_map`; the address map is
:mod:`elmoe3d.golden.layout`'s: dense region at the bottom, expert slots above
it, the KV region at the top growing downwards. This module says *when*
things happen.

Arbitration: why fills cannot starve
------------------------------------
Every bank is one single-port SRAM: one access (PE read, KV access or fill
write) per cycle. A fill beat writes the ``fill_words`` banks of one *bank
group* at once. Time is cut into periods of ``P = FILL_PERIOD`` (4) cycles,
and group ``g`` owns cycle ``g mod P`` of every period (its *fill slot*). In
its fill slot a group's banks are *held* whenever a fill beat is at the head
of the fill queue: the beat is written there if it is for that group, and
neither a KV access nor a PE read takes the banks in that cycle either way
(the hold is two registers, so the read and KV grants never wait for the
fill's decision). In every other cycle the order is KV access, PE read, fill
(a fill beat is written when none of its banks is wanted by a KV access or a
PE read). So under any read load a head fill beat waits at most ``P - 1``
cycles for its banks, and every bank gives fills at least one cycle in
``P``: 0.25 words/cycle/bank, while PE reads keep at least ``(P-1)/P`` = 0.75
words/cycle (1.00 when no fill beat is queued).
Because consecutive groups own consecutive cycles, a fill stream in address
order (bank fastest, as the stream engine sends it) is written at one beat per
cycle even while every PE reads continuously. KV accesses wait at most one
cycle (a fill slot) and, one in flight, take at most one cycle in four.

Why fills, reads and boundary moves cannot deadlock
---------------------------------------------------
The fill path never waits for a read, a PE, a KV access or a boundary move:
its head beat is either written within ``P - 1`` cycles, or dropped because
its fill was refused or is malformed; starting a fill costs at most 3 cycles
(the claim below). So ``fill.ready`` is never low for more than
``FILL_READY_BOUND`` consecutive cycles, whatever the PEs do -- proved in
``tb/formal/hb_bank.py``. In particular a fill whose slot is being read is not
*blocked* by the read (which may wait for a PE that waits for the stream
engine that waits for this very fill queue): HB *refuses* it (BUSY: nothing of
it is written, its end is reported) and the fill stream flows on. Reads never
wait for fills longer than the arbitration bound. A boundary move waits only
for the reads and fills of the slots whose coverage it changes that began
before the move was accepted: from then on, reads and fills of those slots
are refused. Nothing waits for a move except KV accesses, so there is no
cycle of waits.

Timing of the state changes
---------------------------
* A read is *accepted* when its command is decoded (it enters a bank's
  next-session register); it then counts as reading its region until its
  last word has been read from the SRAM. It succeeds iff the region is
  resident and not about to be covered at that cycle.
* A fill's first DATA beat *claims* its region when it reaches the head of
  the fill queue: the valid bit clears (``slot_valid`` falls the next cycle);
  one cycle later the fill is refused if, in the claim cycle, a read of the
  region was open or was accepted (BUSY) or the slot was covered or being
  covered (COVERED) -- the hits are registered in the claim cycle, so the
  check cycle does not see the reading and coverage vectors. Its
  COMMIT/ABORT takes effect when it leaves the queue: ``fill_done`` and (for
  a committed expert slot) the ``commit`` strobe are shown for one cycle, and
  at the end of that cycle ``slot_valid`` rises -- the tag unit turns PENDING
  into RESIDENT on the same clock edge.
* A boundary write is taken into a register (one at a time) with its new
  coverage and error computed from it; the next cycle (EVAL) the slots whose
  coverage changes are marked (``pend``), and from then on reads and fills
  of them are refused. After one more cycle (SETTLE: the reads accepted in
  EVAL are open in it) the move takes effect at the first cycle in which the
  registered view of the cycle before shows no read or fill of those slots
  open and no KV access in flight (that set only shrinks once ``pend`` is
  set, so a view one cycle old is safe): ``covered``, ``kv_words`` and the
  valid bits change at one clock edge and ``moved`` reports it,
  ``MOVE_LATENCY`` (4) cycles after the write at the earliest.
* KV accesses are not accepted while a move is pending; a KV access checks
  its address against the boundary when accepted.

Every output is a register and every input ``ready`` a function of registers
only (the read commands and fill beats enter through register slices).
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from . import vocab as hv
from .common import check_int
from .streams import CreditFIFO, QueueFIFO, RegisterSlice
from .vocab import FillBeatKind, FillResultCode, HBRegionKind, bits

__all__ = ["HBBank", "ReadSession", "FillDecoder", "fill_op", "hb_params", "FILL_PERIOD",
           "FILL_READY_BOUND", "READ_LATENCY", "OUT_DEPTH", "FIRST_WORD_LATENCY",
           "FILL_OVERHEAD", "KV_WRITE_LATENCY", "KV_READ_LATENCY", "MOVE_LATENCY"]

#: Period of the fill slots (cycles): each bank group owns one cycle in ``P``.
FILL_PERIOD = 4
#: Cycles from a read's grant to its word entering the output FIFO (grant ->
#: registered SRAM address -> its two copies on the way to the SRAM -> SRAM
#: data -> SRAM output register -> the register across the die -> read-data
#: register).
READ_LATENCY = 7
#: Depth of each bank's output FIFO (= read credits); enough for one word per
#: cycle with an always-ready PE.
OUT_DEPTH = 10
#: Longest run of cycles ``fill.ready`` can stay low (formally proved).
FILL_READY_BOUND = 9
#: Cycles from a read command's transfer on ``rd_cmd`` (idle bank, PE ready)
#: to its first word's transfer on ``rd`` (asserted by the bandwidth test).
FIRST_WORD_LATENCY = 12
#: Cycles a fill costs besides one per DATA beat: up to 3 for its claim (its
#: first beat) and 1 for its COMMIT/ABORT beat.
FILL_OVERHEAD = 4
#: Cycles from a KV write's / read's transfer on ``kv`` to its response on
#: ``kv_rsp`` on an idle HB (one more when its bank group's fill slot is held
#: for a queued fill beat); asserted by ``test_hb_kv_and_move_latency``.
KV_WRITE_LATENCY = 3
KV_READ_LATENCY = 9
#: Cycles from a boundary write's transfer to its ``moved`` report when no
#: read, fill or KV access holds it up (asserted by the same test).
MOVE_LATENCY = 4


def _onehot(value, n: int):
    """``n``-bit one-hot of ``value`` (0 when ``value >= n``)."""
    return Cat(*[value == j for j in range(n)])


def _sum_le(a, b, k: int):
    """``a + b <= k`` for unsigned ``a``, ``b`` and a constant ``k``: the
    sign of ``a + b - (k + 1)``, the three operands reduced by one carry-save
    layer (a LUT per bit) to two, so one carry chain instead of an adder and a
    comparator behind it."""
    n = max(len(a), len(b)) + 2
    kk = Const((-(k + 1)) % (1 << n), n)
    a, b = a.as_unsigned(), b.as_unsigned()
    a = Cat(a, Const(0, n - len(a)))
    b = Cat(b, Const(0, n - len(b)))
    s = a ^ b ^ kk
    cy = ((a & b) | (a & kk) | (b & kk))[:n - 1]
    return (s + Cat(Const(0, 1), cy))[n - 1]


def _slot_base(slot, slots: int, slot_words: int, dense_words: int, words: int):
    """Address of slot ``slot``'s first word, ``D + slot*SW``, read from a
    table of constants (0 past ``S``): one LUT level for up to 16 slots,
    where the product and the sum are two carry chains in front of the add
    of the offset (issue 11: they were the critical path of both decoders)."""
    return Array([Const(dense_words + j * slot_words if j < slots else 0, range(words))
                  for j in range(1 << len(slot))])[slot]


# ---------------------------------------------------------------------------------------
# one bank's read sessions


class ReadSession(wiring.Component):
    """The read side of one bank: command decode, the current and the next
    read session, and the output FIFO to the paired PE.

    Its range check, region one-hot and start address are computed in front
    of its register slice. A command is decoded when it enters the *next*
    register (that is when it is accepted: the region must be resident then,
    see ``open_mask``); the
    next session becomes *current* as soon as the current one has issued its
    last word, so a bank streams one word per cycle back to back across
    commands. A refused command becomes one ``last`` + ``error`` beat. Words
    are issued only with a free output-FIFO entry (``out_depth`` credits), so
    the SRAM output never has to be held.

    Parameters
    ----------
    slots, slot_words, dense_words, words : int
        ``S``, ``SW``, ``D``, ``W`` (``golden/layout.py``).
    slice_bits, lanes : int
        Word = slice vector of ``lanes`` slices of ``slice_bits`` bits.

    Members
    -------
    cmd : ``In(stream.Signature(HBRead))``
    beat : ``Out(stream.Signature(HBBeat))``
    open_mask : ``In(S + 1)``
        Regions a read may start on now (resident slots not about to be
        covered; bit ``S`` = the dense region).
    reading : ``Out(S + 1)``
        Regions with an accepted read that has not read its last word yet.
    req : ``Out(1)``
        The current session wants the bank's SRAM port this cycle.
    kv_next, hold : ``In(1)``
        A KV access wants the bank in the next cycle (KV goes first) / the
        bank is held for a fill this cycle.
    go : ``Out(1)``
        The session has the bank's SRAM port this cycle: ``req`` and no KV
        access and no hold.
    addr : ``Out(range(W))``
        Address of the word it wants.
    ram_data : ``In(sv_bits)``
        The read data (the third register behind the SRAM), ``READ_LATENCY``
        cycles after a grant.
    start, start_ok : ``Out(1)``
        A command was decoded this cycle / it was accepted.
    out_overrun : ``Out(1)``
        A word is written into a full output FIFO (the credit rule broken;
        never, asserted by the formal check).
    start_oh : ``Out(S + 1)``
        The region of the command being decoded (one-hot; valid with ``start``).
    """

    def __init__(self, *, slots, slot_words, dense_words, words, slice_bits, lanes, planes,
                 out_depth=OUT_DEPTH):
        self.S, self.SW, self.D, self.W = slots, slot_words, dense_words, words
        self.out_depth = out_depth
        #: the output FIFO's entries (= the credits, ``out_depth``)
        self.fifo_depth = out_depth
        self.sv_bits = slice_bits * lanes
        self.read_t = hv.hb_read(slots, slot_words, dense_words, planes)
        self.beat_t = hv.hb_beat(slice_bits, lanes)
        super().__init__({
            "cmd": In(stream.Signature(self.read_t)),
            "beat": Out(stream.Signature(self.beat_t)),
            "open_mask": In(slots + 1), "reading": Out(slots + 1),
            "req": Out(1), "kv_next": In(1), "hold": In(1), "go": Out(1),
            "addr": Out(range(words)),
            "ram_data": In(self.sv_bits), "start": Out(1), "start_ok": Out(1),
            "out_overrun": Out(1),
            "start_oh": Out(slots + 1),
        })

    def decoded_layout(self):
        """What the register slice holds: the command's checks that depend on
        the command alone, computed in front of the slice (so the cycle that
        accepts a read only adds the residency check)."""
        S, SW, D, W = self.S, self.SW, self.D, self.W
        return data.StructLayout({
            "nz": 1,                         # count != 0
            "exp": 1,                        # an expert slot (else the dense region)
            "in_exp": 1,                     # offset + count <= SW
            "in_dense": 1,                   # offset + count <= D
            "onehot": S + 1,                 # the region (bit S = dense; 0 = no such slot)
            "addr": range(W),                # absolute address of the first word
            "left": range(max(SW, D) + 1),   # count - 1
            "one": 1,                        # count == 1
            "plane": self.read_t.as_shape()["plane"].shape})

    def elaborate(self, platform):
        m = Module()
        S, SW, D, W = self.S, self.SW, self.D, self.W

        # -- command checks that need only the command, in front of the slice ------
        c = self.cmd.payload
        dl = self.decoded_layout()
        pre = Signal(dl)
        c_exp = c.region == HBRegionKind.EXPERT
        base = Signal(range(W))
        m.d.comb += base.eq(_slot_base(c.slot, S, SW, D, W))
        m.d.comb += [
            # offset + count <= size for both sizes; the choice is made behind
            # the slice, in parallel with the residency check
            pre.nz.eq(c.count != 0), pre.exp.eq(c_exp),
            pre.in_exp.eq(_sum_le(c.offset, c.count, SW)),
            pre.in_dense.eq(_sum_le(c.offset, c.count, D)),
            # a slot number past S names no region (as in golden/hb_map.region_index)
            pre.onehot.eq(Mux(c_exp, Mux(c.slot < S, _onehot(c.slot, S + 1), 0),
                              1 << S)),
            pre.addr.eq(Mux(c_exp, base, 0) + c.offset),
            pre.left.eq(c.count - 1), pre.one.eq(c.count == 1), pre.plane.eq(c.plane)]
        m.submodules.slice = sl = RegisterSlice(dl)
        m.d.comb += [sl.i.valid.eq(self.cmd.valid), sl.i.payload.eq(pre),
                     self.cmd.ready.eq(sl.i.ready)]

        # -- accept into the next session (from the slice's registers) -----------------
        p = sl.o.payload
        oh = p.onehot
        ok = Signal()
        in_range = p.nz & Mux(p.exp, p.in_exp, p.in_dense)
        m.d.comb += ok.eq(in_range & (oh & self.open_mask).any())

        n_valid, n_err, n_last = Signal(), Signal(), Signal()
        n_addr = Signal(range(W))
        n_left = Signal(range(max(SW, D) + 1))
        n_plane = Signal.like(p.plane)
        n_oh = Signal(S + 1)
        c_active, c_err, c_last = Signal(), Signal(), Signal()
        c_addr = Signal(range(W))
        c_left = Signal(range(max(SW, D) + 1))
        c_plane = Signal.like(p.plane)
        c_oh = Signal(S + 1)

        owed = Signal(range(self.out_depth + 1))
        credit = Signal(init=1)           # = owed < out_depth, registered
        # ``req`` = c_active & credit & ~c_err, kept as its own register (from
        # the next values of the three) so that the bank arbitration and the
        # fill's choice of a free group start at a flip-flop
        # ``req_free`` = req & (no KV access wants the bank) and ``err_go`` =
        # c_active & credit & c_err likewise, so ``issue`` is one LUT
        req, req_free, err_go = Signal(), Signal(), Signal()
        c_active_n, c_err_n, credit_n = Signal(), Signal(), Signal()
        issue = Signal()
        m.d.comb += [self.req.eq(req), self.go.eq(req_free & ~self.hold),
                     issue.eq((req_free & ~self.hold) | err_go),
                     self.addr.eq(c_addr),
                     self.reading.eq(c_oh | n_oh)]
        m.d.sync += [req.eq(c_active_n & credit_n & ~c_err_n),
                     req_free.eq(c_active_n & credit_n & ~c_err_n & ~self.kv_next),
                     err_go.eq(c_active_n & credit_n & c_err_n)]
        c_take = Signal()
        n_take = Signal()
        m.d.comb += [c_take.eq(n_valid & (~c_active | (issue & c_last))),
                     sl.o.ready.eq(~n_valid | c_take),
                     n_take.eq(sl.o.valid & sl.o.ready),
                     self.start.eq(n_take), self.start_ok.eq(n_take & ok),
                     self.start_oh.eq(oh)]

        m.d.comb += [c_active_n.eq(c_active), c_err_n.eq(c_err)]
        m.d.sync += [c_active.eq(c_active_n), c_err.eq(c_err_n)]
        with m.If(issue):
            m.d.sync += [c_addr.eq(c_addr + 1), c_left.eq(c_left - 1), c_last.eq(c_left == 1)]
            with m.If(c_last):
                m.d.comb += c_active_n.eq(0)
                m.d.sync += c_oh.eq(0)
        with m.If(c_take):
            m.d.comb += [c_active_n.eq(1), c_err_n.eq(n_err)]
            m.d.sync += [c_last.eq(n_last), c_addr.eq(n_addr),
                         c_left.eq(n_left), c_plane.eq(n_plane), c_oh.eq(n_oh)]
        with m.If(c_take & ~n_take):
            m.d.sync += [n_valid.eq(0), n_oh.eq(0)]
        with m.If(n_take):
            m.d.sync += [n_valid.eq(1), n_err.eq(~ok), n_last.eq(~ok | p.one),
                         n_addr.eq(p.addr), n_left.eq(p.left),
                         n_plane.eq(p.plane), n_oh.eq(Mux(ok, oh, 0))]

        # -- pipeline to the output FIFO (matches the SRAM's READ_LATENCY) --------
        meta = data.StructLayout({"v": 1, "err": 1, "last": 1, "plane": p.plane.shape()})
        stages = [Signal(meta, name=f"m{i}") for i in range(READ_LATENCY)]
        m.d.sync += [stages[0].v.eq(issue), stages[0].err.eq(c_err),
                     stages[0].last.eq(c_last | c_err), stages[0].plane.eq(c_plane)]
        for a, b in zip(stages, stages[1:]):
            m.d.sync += b.eq(a)
        mo = stages[-1]
        # the credits guarantee room: a FIFO whose write is ``w_en`` alone
        m.submodules.out = ofifo = CreditFIFO(width=self.beat_t.as_shape().size,
                                              depth=self.fifo_depth)
        w = Signal(self.beat_t)
        m.d.comb += [w.sv.slices.eq(Mux(mo.err, 0, self.ram_data)),
                     w.sv.plane.eq(Mux(mo.err, 0, mo.plane)),
                     w.last.eq(mo.last), w.error.eq(mo.err),
                     ofifo.w_data.eq(w), ofifo.w_en.eq(mo.v),
                     self.beat.payload.eq(ofifo.r_data), self.beat.valid.eq(ofifo.r_rdy),
                     ofifo.r_en.eq(self.beat.ready),
                     # a write into a full output FIFO: a broken credit rule
                     # (never; the formal check asserts it)
                     self.out_overrun.eq(ofifo.w_en & ~ofifo.w_rdy)]
        pop = self.beat.valid & self.beat.ready
        owed_n = Signal.like(owed)
        m.d.comb += [owed_n.eq(owed + issue - pop), credit_n.eq(owed_n < self.out_depth)]
        m.d.sync += [owed.eq(owed_n), credit.eq(credit_n)]
        return m


# ---------------------------------------------------------------------------------------
# the fill stream: stream-local rules and pre-decode


def fill_op(cfg_slots: int, words: int, groups: int, sv_bits: int, fill_words: int):
    """``FillOp``: a fill beat pre-decoded for the queue head (internal)."""
    return hv.struct("FillOp", {
        "data": unsigned(1), "first": unsigned(1), "write": unsigned(1),
        "onehot": unsigned(cfg_slots + 1), "addr": unsigned(bits(words)),
        "group": unsigned(groups), "phase": unsigned(bits(FILL_PERIOD)),
        "words": data.ArrayLayout(unsigned(sv_bits), fill_words),
        "result": FillResultCode, "stray": unsigned(1),
        "rkind": HBRegionKind, "slot": unsigned(bits(cfg_slots))})


class FillDecoder(wiring.Component):
    """The stream-local fill rules (:class:`elmoe3d.golden.hb_map.FillParser`)
    and the pre-decode of each beat for the queue head.

    Combinational from ``i`` to ``o`` (put a register slice in front); its
    state (the open fill: region, expected next ``{offset, bank}``, whether it
    is still well formed and complete) advances on each transfer. A DATA beat
    becomes a write op (``write`` = the fill is well formed up to and
    including this beat) with its absolute address, bank group and fill-slot
    (one-hot) and fill-slot phase (index); COMMIT/ABORT becomes an end op carrying the predicted
    result (COMMITTED, ABORTED, MALFORMED, or STRAY with no fill open) and
    the open fill's region.
    """

    def __init__(self, *, slots, slot_words, dense_words, words, banks, fill_words, sv_bits):
        self.S, self.SW, self.D, self.W = slots, slot_words, dense_words, words
        self.B, self.FW = banks, fill_words
        self.G = banks // fill_words
        self.beat_t = hv.fill_beat(sv_bits, fill_words, slots, slot_words, dense_words, banks)
        self.op_t = fill_op(slots, words, self.G, sv_bits, fill_words)
        super().__init__({"i": In(stream.Signature(self.beat_t)),
                          "o": Out(stream.Signature(self.op_t))})

    def commit_ok(self, *, good, complete, same, is_commit):
        """A COMMIT makes its fill resident only if every beat was well formed,
        the last word was written and the COMMIT names the open fill's region."""
        return good & complete & same & is_commit

    def elaborate(self, platform):
        m = Module()
        S, SW, D, B, FW, G = self.S, self.SW, self.D, self.B, self.FW, self.G
        NONE = S + 1
        p, o = self.i.payload, self.o.payload

        f_open, f_good, f_complete = Signal(), Signal(), Signal()
        f_region = Signal(range(S + 2))
        f_oh = Signal(S + 1)
        f_off = Signal.like(p.offset)
        f_bank = Signal(range(B))
        f_rkind = Signal(HBRegionKind)
        f_slot = Signal.like(p.slot)

        is_end = (p.kind == FillBeatKind.COMMIT) | (p.kind == FillBeatKind.ABORT)
        is_exp = p.region == HBRegionKind.EXPERT
        ridx = Signal(range(S + 2))
        m.d.comb += ridx.eq(Mux(is_exp, Mux(p.slot < S, p.slot, NONE), S))
        oh = Signal(S + 1)
        m.d.comb += oh.eq(_onehot(ridx, S + 1))
        size = Mux(is_exp, SW, D)
        fw_bits = (FW - 1).bit_length()
        bank_ok = (p.bank < B) & ((p.bank[:fw_bits] == 0) if fw_bits else 1)
        in_range = Signal()
        m.d.comb += in_range.eq((p.kind == FillBeatKind.DATA) & (ridx != NONE)
                                & (p.offset < size) & bank_ok)
        first_ok = (p.bank == 0) & (~is_exp | (p.offset == 0))
        next_ok = (p.offset == f_off) & (p.bank == f_bank) & (ridx == f_region)
        good = Signal()
        m.d.comb += good.eq(in_range & Mux(f_open, f_good & next_ok, first_ok))
        wrap = p.bank + FW >= B
        n_bank = Mux(wrap, 0, p.bank + FW)
        n_off = Mux(wrap, p.offset + 1, p.offset)
        complete = Mux(is_exp, wrap & (p.offset == SW - 1), wrap)
        grp = p.bank // FW if FW > 1 else p.bank
        bases = Mux(is_exp, _slot_base(p.slot, S, SW, D, self.W), 0)

        m.d.comb += [self.o.valid.eq(self.i.valid), self.i.ready.eq(self.o.ready),
                     o.words.eq(p.words), o.addr.eq(bases + p.offset),
                     o.group.eq(_onehot(grp, G)),
                     o.phase.eq(grp % FILL_PERIOD)]
        with m.If(~is_end):
            m.d.comb += [o.data.eq(1), o.first.eq(~f_open), o.write.eq(good),
                         o.onehot.eq(Mux(f_open, f_oh, oh))]
        with m.Else():
            commit_ok = self.commit_ok(good=f_good, complete=f_complete, same=ridx == f_region,
                                       is_commit=p.kind == FillBeatKind.COMMIT)
            m.d.comb += [o.data.eq(0), o.stray.eq(~f_open),
                         o.onehot.eq(Mux(f_open, f_oh, 0)),
                         o.rkind.eq(Mux(f_open, f_rkind, p.region)),
                         o.slot.eq(Mux(f_open, f_slot, p.slot))]
            with m.If(~f_open):
                m.d.comb += o.result.eq(FillResultCode.STRAY)
            with m.Elif(p.kind == FillBeatKind.ABORT):
                m.d.comb += o.result.eq(FillResultCode.ABORTED)
            with m.Elif(commit_ok):
                m.d.comb += o.result.eq(FillResultCode.COMMITTED)
            with m.Else():
                m.d.comb += o.result.eq(FillResultCode.MALFORMED)

        with m.If(self.i.valid & self.i.ready):
            with m.If(is_end):
                m.d.sync += f_open.eq(0)
            with m.Else():
                m.d.sync += f_good.eq(good)
                with m.If(~f_open):
                    m.d.sync += [f_open.eq(1), f_region.eq(ridx), f_oh.eq(oh),
                                 f_rkind.eq(p.region), f_slot.eq(p.slot)]
                with m.If(good):
                    m.d.sync += [f_off.eq(n_off), f_bank.eq(n_bank), f_complete.eq(complete)]
        return m


# ---------------------------------------------------------------------------------------
# the controller


class HBBank(wiring.Component):
    """HB bank controller (rules: :mod:`elmoe3d.golden.hb_map`; timing,
    arbitration and the progress argument: this module's docstring).

    Parameters
    ----------
    banks : int
        ``B`` banks, one per PE.
    words : int
        ``W`` words per bank (power of two).
    slots : int
        ``S`` expert slots (the tag unit's slots).
    slot_words, dense_words : int
        ``SW`` words per slot and ``D`` words of the dense region per bank
        (``D + S*SW <= W``; :class:`~elmoe3d.config.Config` derives both).
    lanes, slice_bits : int
        Word = slice vector of ``lanes`` slices of ``slice_bits`` bits.
    fill_words : int
        Words per fill beat (a power of two dividing ``banks``).
    fill_depth : int
        Fill queue depth in beats (>= 2).
    out_depth : int
        Depth of each bank's output FIFO (read credits, >= 3); the default
        ``OUT_DEPTH`` sustains one word per cycle, less only slows reads.

    Members
    -------
    rd_cmd : ``In(stream.Signature(HBRead)).array(B)``
        Per-bank read commands (region, slot, word offset, count, plane).
    rd : ``Out(stream.Signature(HBBeat)).array(B)``
        Per-bank words to the paired PE, in command order; a refused read
        is one ``last`` + ``error`` beat.
    fill : ``In(stream.Signature(FillBeat))``
        Fill beats from the stream engine.
    fill_done : ``Out(FillDone)``
        A one-cycle strobe per fill end (COMMIT/ABORT beat), in order.
    commit : ``Out(HBCommit)``
        Strobe naming the slot whose fill commits, shown in the cycle at whose
        end its ``slot_valid`` bit rises (the tag unit's commit input).
    kv : ``In(stream.Signature(KVAccess))`` / ``kv_rsp`` ``Out(...KVResponse)``
        KV accesses, one response each, in order.
    boundary : ``In(stream.Signature(range(W + 1)))``
        Writes of the boundary register (KV words per bank).
    moved : ``Out(stream.Signature(KVMove))``
        One report per boundary write.
    slot_valid, covered : ``Out(S)``
        Resident slots; slots covered by the KV region (registered; the tag
        unit's ``disabled`` input).
    dense_valid : ``Out(1)``
        The dense region is resident.
    kv_words : ``Out(range(W + 1))``
        The boundary register.

    Latency and throughput (measured by ``tests/test_hb_bank.py``): a read's
    first word is on ``rd`` 12 cycles after its command's transfer on an idle
    bank (``FIRST_WORD_LATENCY``; register slice, decode, grant, registered
    SRAM address and its two copies on the way to the block RAM, SRAM, the
    three read-data registers behind it, output FIFO; 9 cycles before the
    extra address and read-data stages of issue 11, 11 with one copy); a bank then streams one word per cycle, back to back across
    commands, while its PE is ready. Fills: one beat per cycle in address
    order under any read load (see the arbitration rule), PE reads keep at
    least 0.75 words/cycle/bank while fill beats are queued and 1.00
    otherwise; a fill's first beat costs up to 3 extra cycles (its claim).
    KV: one access in flight; a write's response ``KV_WRITE_LATENCY`` (3) and
    a read's ``KV_READ_LATENCY`` (9) cycles after its transfer on an idle HB,
    one more when the access meets its bank's held fill slot. A boundary move
    is reported ``MOVE_LATENCY`` (4) cycles after its write at the earliest.

    Timing (issue 11): every input of the arbitration, the read issue and
    the fill head's decisions is a flip-flop or at most a few LUT levels from
    one: the per-bank ``req``/``req_free`` registers, the fill-slot hold, the
    registered open mask, refusal hits and move ``blocked`` view. Each block
    RAM's address, write data and write enable pass three registers, and its
    read data three, the first with no other load, so that the synthesis
    flow packs it into the DP16KD's output register (``REGMODE=OUTREG``,
    which Yosys 0.70 does not do: ``sim/synth.pack_ebr_outreg``); the other
    stages carry the routes across the die, where a bank's block RAMs lie
    (``docs/blocks/hb_bank.md``). A bank is ``mem_parts`` block memories
    (default: 2048 words or more each, at most 4), each with a last address,
    data and write-enable copy of its own, loaded only by an access to that
    part, so the copies cannot be merged back into one and each sits beside
    its own DP16KDs; their outputs meet in a ``mem_parts``:1 select in front
    of the stage across the die. Same latency and behaviour for any
    ``mem_parts`` (``mem_parts`` must be a power of two, at most
    ``words / 2``).

    Raises
    ------
    TypeError, ValueError
        For a parameter of the wrong kind or value, naming it.
    """

    def __init__(self, *, banks: int = 4, words: int = 8192, slots: int = 16,
                 slot_words: int = 384, dense_words: int = 1938, lanes: int = 16,
                 slice_bits: int = 4, fill_words: int = 1, fill_depth: int = 8,
                 out_depth: int = OUT_DEPTH, mem_parts: int | None = None):
        check_int("HB bank count", banks, 1, 1024)
        check_int("HB words per bank", words, 2)
        if words & (words - 1):
            raise ValueError(f"HB words per bank must be a power of two, not {words!r}")
        check_int("HB slot count", slots, 1, 4096)
        check_int("HB slot words", slot_words, 1, words)
        check_int("HB dense-region words", dense_words, 0, words)
        if dense_words + slots * slot_words > words:
            raise ValueError(f"{slots} slots of {slot_words} words and a dense region of "
                             f"{dense_words} words need {dense_words + slots * slot_words} "
                             f"words, but an HB bank holds {words}")
        check_int("Lane count", lanes, 1, 1024)
        if slice_bits not in (1, 2, 4):
            raise ValueError(f"Slice width must be 1, 2 or 4, not {slice_bits!r}")
        check_int("Fill words per beat", fill_words, 1, banks)
        if banks % fill_words or fill_words & (fill_words - 1):
            raise ValueError(f"Fill words per beat {fill_words!r} must be a power of two "
                             f"dividing the bank count {banks}")
        check_int("Fill FIFO depth", fill_depth, 2, 1024)
        # >= 3: the credit count assumes the FIFO takes a word whenever fewer
        # than ``depth`` are in it; a 2-deep SyncFIFOBuffered (a 1-entry
        # memory in front of its output register) refuses a write in the
        # cycle its entry moves on, and would drop a word (found by the
        # formal check of tb/formal/hb_bank.py)
        check_int("Output FIFO depth", out_depth, 3, 1024)
        self.out_depth = out_depth
        self.banks, self.words, self.slots = banks, words, slots
        self.slot_words, self.dense_words = slot_words, dense_words
        self.lanes, self.slice_bits = lanes, slice_bits
        self.planes = 8 // slice_bits
        self.sv_bits = lanes * slice_bits
        self.fill_words, self.fill_depth = fill_words, fill_depth
        self.kv_limit = words - dense_words
        #: block memories per bank (each with its own address / data / enable
        #: copy, see ``elaborate``); by default 2048 words or more each, at most 4
        if mem_parts is None:
            mem_parts = max(1, min(4, words // 2048))
        check_int("HB memory parts per bank", mem_parts, 1, words // 2)
        if mem_parts & (mem_parts - 1):
            raise ValueError(f"HB memory parts per bank must be a power of two, not {mem_parts!r}")
        self.mem_parts = mem_parts
        S, SW, D, W = slots, slot_words, dense_words, words
        self.read_t = hv.hb_read(S, SW, D, self.planes)
        self.beat_t = hv.hb_beat(slice_bits, lanes)
        self.fill_t = hv.fill_beat(self.sv_bits, fill_words, S, SW, D, banks)
        self.done_t = hv.fill_done(S)
        self.commit_t = hv.hb_commit(S)
        self.kv_t = hv.kv_access(self.sv_bits, banks, W)
        self.kv_rsp_t = hv.kv_response(self.sv_bits)
        self.move_t = hv.kv_move(W, S)
        super().__init__({
            "rd_cmd": In(stream.Signature(self.read_t)).array(banks),
            "rd": Out(stream.Signature(self.beat_t)).array(banks),
            "fill": In(stream.Signature(self.fill_t)),
            "fill_done": Out(self.done_t),
            "commit": Out(self.commit_t),
            "kv": In(stream.Signature(self.kv_t)),
            "kv_rsp": Out(stream.Signature(self.kv_rsp_t)),
            "boundary": In(stream.Signature(range(W + 1))),
            "moved": Out(stream.Signature(self.move_t)),
            "slot_valid": Out(S), "covered": Out(S), "dense_valid": Out(1),
            "kv_words": Out(range(W + 1)),
        })
        #: internal strobes for the formal wrapper (tb/formal/hb_bank.py)
        self.probe_start = [Signal(name=f"probe_start{b}") for b in range(banks)]
        self.probe_start_ok = [Signal(name=f"probe_start_ok{b}") for b in range(banks)]
        self.probe_out_overrun = [Signal(name=f"probe_out_overrun{b}") for b in range(banks)]
        self.probe_ren = [Signal(name=f"probe_ren{b}") for b in range(banks)]
        self.probe_wen = [Signal(name=f"probe_wen{b}") for b in range(banks)]
        self.probe_fill_wait = Signal(name="probe_fill_wait")

    #: the fill decoder's class (a subclass may change one of its rules)
    fill_decoder_cls = FillDecoder
    #: the read session's class (a subclass may change its FIFO depth)
    read_session_cls = None

    def open_regions(self, valid, pend, dense_valid):
        """Regions a read may start on: resident slots that no pending move is
        about to cover, and the dense region when resident."""
        return Cat(valid & ~pend, dense_valid)

    def busy_at_check(self, hit):
        """A starting fill is refused (BUSY) when a read of its region is open
        (``hit``: one was open or accepted in the claim cycle)."""
        return hit

    def part_select(self, part_rd, part_q):
        """The part number that selects a bank's output among its memory
        parts: ``part_q``, the one that travelled with the read to the parts'
        output registers (``part_rd`` is the next access's, a cycle early)."""
        return part_q

    def covered_thresholds(self) -> list[int]:
        """Slot ``j`` is covered iff ``kv_words > t[j]``
        (``golden.layout.slot_covered_mask``: ``D + (j+1)*SW > W - kv``)."""
        W, D, SW = self.words, self.dense_words, self.slot_words
        return [W - D - (j + 1) * SW for j in range(self.slots)]

    def elaborate(self, platform):
        m = Module()
        B, S, W, FW = self.banks, self.slots, self.words, self.fill_words
        SW, D = self.slot_words, self.dense_words
        G = B // FW
        P = FILL_PERIOD

        # ---- region state (all registers) -----------------------------------------
        valid = Signal(S)                 # resident expert slots
        dense_valid = Signal()
        covered = Signal(S)               # KV-covered slots
        kv_q = Signal(range(W + 1))       # the boundary register
        kv_lo = Signal(range(W + 1), init=W)   # lowest KV word = W - kv_q
        pend = Signal(S)                  # slots a pending move changes
        filling = Signal(S + 1)           # regions with a claimed, unfinished fill
        m.d.comb += [self.slot_valid.eq(valid), self.dense_valid.eq(dense_valid),
                     self.covered.eq(covered), self.kv_words.eq(kv_q)]
        # the regions a read may start on, registered: computed from the next
        # values of the valid bits and ``pend`` (so it equals
        # open_regions(valid, pend, dense_valid) in every cycle)
        open_mask = Signal(S + 1)
        valid_n, pend_n, dense_n = Signal(S), Signal(S), Signal()
        m.d.sync += [open_mask.eq(self.open_regions(valid_n, pend_n, dense_n)),
                     valid.eq(valid_n), pend.eq(pend_n), dense_valid.eq(dense_n)]

        phase = Signal(P, init=1)         # one-hot fill-slot phase
        phase_i = Signal(range(P))        # the same as an index
        m.d.sync += [phase.eq(phase.rotate_left(1)), phase_i.eq(phase_i + 1)]

        # ---- SRAM banks: single-port, registered inputs, registered output ---------
        # One address per bank for reads and writes (the arbitration gives a
        # bank one access per cycle), so synthesis maps a bank to single-port
        # block RAM without read-during-write bypass logic; the address, write
        # enable and write data come from registers and the read data goes
        # straight into a register (ECP5: DP16KD, then a fabric FF; Yosys 0.70
        # does not pack that FF into the DP16KD's OUTREG, and nextpnr, which
        # underestimates long vertical routes, often places it tens of rows
        # from its EBR, where 5.6 ns of clock-to-output leave 2.4 ns).
        ram_ren = [Signal(name=f"ram_ren{b}") for b in range(B)]
        ram_wen = [Signal(name=f"ram_wen{b}") for b in range(B)]
        ram_addr = [Signal(range(W), name=f"ram_addr{b}", reset_less=True) for b in range(B)]
        ram_wdata = [Signal(self.sv_bits, name=f"ram_wdata{b}", reset_less=True)
                     for b in range(B)]
        ram_q = [Signal(self.sv_bits, name=f"ram_q{b}", reset_less=True) for b in range(B)]
        ram_r = [Signal(self.sv_bits, name=f"ram_r{b}", reset_less=True) for b in range(B)]
        ram_d = [Signal(self.sv_bits, name=f"ram_d{b}", reset_less=True) for b in range(B)]
        # one more register on the way in (``mem_*``, copies of ``ram_*``)
        # and one more on the way out (``ram_r``): at the default geometry a
        # bank's 32 DP16KDs span the die, and the routes between them and the
        # logic (7-7.6 ns without any logic) need a stage of their own.
        # Reads, KV accesses and fill writes all pass the same stages, so
        # their order at the block RAM is their grant order.
        mem_wen = [Signal(name=f"mem_wen{b}") for b in range(B)]
        mem_addr = [Signal(range(W), name=f"mem_addr{b}", reset_less=True) for b in range(B)]
        mem_wdata = [Signal(self.sv_bits, name=f"mem_wdata{b}", reset_less=True)
                     for b in range(B)]
        # and a second copy (``far_*``): with one, nextpnr (whose delay model
        # underestimates long routes) left the copy beside the logic and the
        # route to the farthest DP16KD alone took 7.5 ns; two stages split it.
        # A bank is ``Q`` block memories of ``W / Q`` words (``mem_parts``), each
        # with its own copy, loaded only for an access to that part (so the
        # copies are distinct logic that synthesis cannot merge back into one):
        # at the default geometry each copy drives 8 DP16KDs instead of 32, and
        # nextpnr can place it beside them. The parts' outputs (each packed
        # into its DP16KD's output register) meet in a Q:1 select in front of
        # ``ram_r``, by the part number carried alongside (no select for Q = 1).
        Q = self.mem_parts
        PW = W // Q
        lo_bits = (PW - 1).bit_length()
        for b in range(B):
            m.d.sync += [mem_wen[b].eq(ram_wen[b]), mem_addr[b].eq(ram_addr[b]),
                         mem_wdata[b].eq(ram_wdata[b])]
            m.d.comb += [self.probe_ren[b].eq(ram_ren[b]), self.probe_wen[b].eq(ram_wen[b])]
            hi = mem_addr[b][lo_bits:]
            # the part of the word in ``ram_q``: far copy -> read -> output register
            hi_far = Signal(range(Q), name=f"far_part{b}")
            hi_rd = Signal(range(Q), name=f"rd_part{b}")
            hi_q = Signal(range(Q), name=f"q_part{b}")
            m.d.sync += [hi_far.eq(hi), hi_rd.eq(hi_far), hi_q.eq(hi_rd)]
            hi_q = self.part_select(hi_rd, hi_q)
            parts_q = []
            for i in range(Q):
                mem = Memory(shape=unsigned(self.sv_bits), depth=PW, init=[])
                m.submodules[f"bank{b}_{i}"] = mem
                wp = mem.write_port()
                # the read port reads every cycle (its data is used only when the
                # pipeline says so): a read enable would cost a hold multiplexer
                # behind the block RAM
                rp = mem.read_port()
                sel = hi == i if Q > 1 else Const(1)
                p_wen = Signal(name=f"far_wen{b}_{i}")
                p_addr = Signal(range(PW), name=f"far_addr{b}_{i}", reset_less=True)
                p_wdata = Signal(self.sv_bits, name=f"far_wdata{b}_{i}", reset_less=True)
                # no other load, no enable, no reset: the flow packs it into the
                # DP16KD's output register (``sim/synth.pack_ebr_outreg``)
                p_q = Signal(self.sv_bits, name=f"ram_q{b}_{i}", reset_less=True)
                m.d.sync += p_wen.eq(mem_wen[b] & sel)
                with m.If(sel):
                    m.d.sync += [p_addr.eq(mem_addr[b][:lo_bits]), p_wdata.eq(mem_wdata[b])]
                m.d.comb += [rp.addr.eq(p_addr), rp.en.eq(1),
                             wp.addr.eq(p_addr), wp.data.eq(p_wdata), wp.en.eq(p_wen)]
                m.d.sync += p_q.eq(rp.data)
                parts_q.append(p_q)
            # ``ram_r`` is the stage across the die; ``ram_d`` feeds the output
            # FIFO and the KV response
            m.d.comb += ram_q[b].eq(Array(parts_q)[hi_q] if Q > 1 else parts_q[0])
            m.d.sync += [ram_r[b].eq(ram_q[b]), ram_d[b].eq(ram_r[b])]

        # ---- read sessions ----------------------------------------------------------
        sess = []
        for b in range(B):
            s = (self.read_session_cls or ReadSession)(slots=S, slot_words=SW, dense_words=D, words=W,
                            slice_bits=self.slice_bits, lanes=self.lanes, planes=self.planes,
                            out_depth=self.out_depth)
            m.submodules[f"read{b}"] = s
            wiring.connect(m, wiring.flipped(self.rd_cmd[b]), s.cmd)
            wiring.connect(m, s.beat, wiring.flipped(self.rd[b]))
            m.d.comb += [s.open_mask.eq(open_mask), s.ram_data.eq(ram_d[b]),
                         self.probe_start[b].eq(s.start),
                         self.probe_start_ok[b].eq(s.start_ok),
                         self.probe_out_overrun[b].eq(s.out_overrun)]
            sess.append(s)
        reading = Signal(S + 1)
        acc = Const(0, S + 1)
        for s in sess:
            acc = acc | s.reading
        m.d.comb += reading.eq(acc)

        # ---- KV port ------------------------------------------------------------------
        k_busy, k_err, k_write = Signal(), Signal(), Signal()
        k_addr = Signal(range(W))
        k_data = Signal(self.sv_bits)
        k_bank = Signal(B)
        k_reqs = Signal(B)                # the bank a KV access in range wants (one-hot)
        k_phase = Signal(P)               # the fill slot of its bank group (one-hot)
        k_pipe = Signal(READ_LATENCY)     # a KV read is in the SRAM pipeline
        k_rbank = [Signal(B, name=f"k_rbank{i}") for i in range(READ_LATENCY)]
        move_idle = Signal()
        k_wdone = Signal()                # a KV write was granted last cycle
        m.d.comb += self.kv.ready.eq(~k_busy & ~k_wdone & ~self.kv_rsp.valid & (k_pipe == 0)
                                     & move_idle)
        kp = self.kv.payload
        kv_bad = (kp.addr < kv_lo) | (kp.bank >= B)
        k_reqs_n = Signal(B)
        m.d.sync += k_reqs.eq(k_reqs_n)
        m.d.comb += k_reqs_n.eq(k_reqs)
        with m.If(self.kv.valid & self.kv.ready):
            m.d.comb += k_reqs_n.eq(Mux(kv_bad, 0, _onehot(kp.bank, B)))
            m.d.sync += [k_busy.eq(1), k_write.eq(kp.write), k_addr.eq(kp.addr),
                         k_data.eq(kp.data), k_bank.eq(_onehot(kp.bank, B)),
                         k_phase.eq(_onehot((kp.bank // FW if FW > 1 else kp.bank) % P, P)),
                         k_err.eq(kv_bad)]
        kv_req = [k_reqs[b] for b in range(B)]

        # ---- fill path: slice -> decoder -> queue -> head ---------------------------------
        m.submodules.fill_slice = fsl = RegisterSlice(self.fill_t)
        wiring.connect(m, wiring.flipped(self.fill), fsl.i)
        m.submodules.fill_dec = dec = self.fill_decoder_cls(
            slots=S, slot_words=SW, dense_words=D, words=W, banks=B, fill_words=FW,
            sv_bits=self.sv_bits)
        wiring.connect(m, fsl.o, dec.i)
        op_t = dec.op_t
        m.submodules.fill_fifo = ff = QueueFIFO(width=op_t.as_shape().size,
                                                depth=self.fill_depth)
        m.d.comb += [ff.w_data.eq(dec.o.payload), ff.w_en.eq(dec.o.valid),
                     dec.o.ready.eq(ff.w_rdy)]
        head = Signal(op_t)
        m.d.comb += head.eq(ff.r_data)
        hv_ = ff.r_rdy

        # head state: READY (no fill open at the head) -> CLAIMED -> ACTIVE -> READY
        READY, CLAIMED, ACTIVE = 0, 1, 2
        h_state = Signal(2)
        h_refused = Signal()
        h_reason = Signal(FillResultCode)
        end_q = Signal(data.StructLayout({"v": 1, "commit": 1, "onehot": S + 1,
                                          "rkind": HBRegionKind, "slot": range(max(2, S)),
                                          "result": FillResultCode}))
        claim = Signal()
        check = Signal()
        m.d.comb += [claim.eq(hv_ & head.data & head.first & (h_state == READY) & ~end_q.v),
                     check.eq(hv_ & head.data & (h_state == CLAIMED))]
        data_here = hv_ & head.data & (h_state == ACTIVE)
        h_go = Signal()                   # = (h_state == ACTIVE) & ~h_refused
        fill_want = Signal()
        discard = Signal()
        m.d.comb += [fill_want.eq(hv_ & head.write & h_go),      # write implies data
                     discard.eq(data_here & ~(head.write & ~h_refused))]
        end_now = Signal()
        m.d.comb += end_now.eq(hv_ & ~head.data & (head.stray | (h_state == ACTIVE)))

        # arbitration (module docstring): fill slot -> fill, KV, read; else KV, read, fill
        read_req = [s.req for s in sess]
        busy_g = Cat(*[Cat(*[read_req[b] | kv_req[b] for b in range(g * FW, (g + 1) * FW)]).any()
                       for g in range(G)])
        slot_now = phase_i == head.phase
        group_free = ~(busy_g & head.group).any()
        fill_go = Signal()
        m.d.comb += fill_go.eq(fill_want & (slot_now | group_free))
        m.d.comb += self.probe_fill_wait.eq(fill_want & ~fill_go)
        fgo = [Signal(name=f"fgo{b}") for b in range(B)]
        kv_go = [Signal(name=f"kv_go{b}") for b in range(B)]
        # Reads and KV accesses do not wait for the fill decision: in a
        # group's fill slot they leave the group's banks alone whenever a fill
        # beat is at the queue head (``rsv``, two registers), whether or not
        # that beat is for this group and can be written now; outside it the
        # fill goes only to a group no read and no KV access wants. So the
        # grants are read_req & ~kv_req & ~rsv and kv_req & ~rsv (a read keeps
        # 3 cycles in 4 while fills are queued, all of them otherwise).
        rsv = Signal(G)
        m.d.comb += rsv.eq(Cat(*[hv_ & phase[g % P] for g in range(G)]))
        for b in range(B):
            s = sess[b]
            m.d.comb += [fgo[b].eq(fill_go & head.group[b // FW]),
                         kv_go[b].eq(kv_req[b] & ~rsv[b // FW]),
                         s.kv_next.eq(k_reqs_n[b]), s.hold.eq(rsv[b // FW])]
            kv_rd = kv_go[b] & ~k_write
            kv_wr = kv_go[b] & k_write
            m.d.sync += [ram_ren[b].eq(s.go | kv_rd),
                         ram_wen[b].eq(fgo[b] | kv_wr),
                         ram_addr[b].eq(Mux(kv_go[b], k_addr, Mux(s.go, s.addr, head.addr))),
                         ram_wdata[b].eq(Mux(kv_wr, k_data, head.words[b % FW]))]

        pop = Signal()
        m.d.comb += [pop.eq(fill_go | discard | end_now), ff.r_en.eq(pop)]

        # ---- KV completion --------------------------------------------------------------
        # = Cat(*kv_go).any(), from the KV access's fill-slot one-hot
        kv_any_go = Signal()
        m.d.comb += kv_any_go.eq(k_reqs.any() & ~(hv_ & (phase & k_phase).any()))
        kv_rd_go = kv_any_go & ~k_write
        m.d.sync += k_pipe.eq(Cat(kv_rd_go, k_pipe[:-1]))
        # a write's response is made from this register, the cycle after its
        # grant, so that the grant does not fan out into the response payload
        m.d.sync += k_wdone.eq(kv_any_go & k_write)
        m.d.sync += k_rbank[0].eq(k_bank)
        for i in range(1, READ_LATENCY):
            m.d.sync += k_rbank[i].eq(k_rbank[i - 1])
        with m.If(self.kv_rsp.ready):
            m.d.sync += self.kv_rsp.valid.eq(0)
        with m.If(k_busy & k_err):
            m.d.sync += [k_busy.eq(0), self.kv_rsp.valid.eq(1),
                         self.kv_rsp.payload.error.eq(1), self.kv_rsp.payload.data.eq(0)]
        with m.If(kv_any_go):
            m.d.comb += k_reqs_n.eq(0)
            m.d.sync += k_busy.eq(0)
        with m.If(k_wdone):
            m.d.sync += [self.kv_rsp.valid.eq(1), self.kv_rsp.payload.error.eq(0),
                         self.kv_rsp.payload.data.eq(0)]
        with m.If(k_pipe[-1]):
            sel = Const(0, self.sv_bits)
            for b in range(B):
                sel = sel | Mux(k_rbank[-1][b], ram_d[b], 0)
            m.d.sync += [self.kv_rsp.valid.eq(1), self.kv_rsp.payload.error.eq(0),
                         self.kv_rsp.payload.data.eq(sel)]

        # ---- fill head: claim, check, end ---------------------------------------------------
        claim_clr = Signal(S + 1)
        m.d.comb += claim_clr.eq(Mux(claim, head.onehot, 0))
        # The refusal is decided from the state of the claim cycle, registered
        # every cycle against the head's region (the head does not move between
        # claim and check): the slot covered or being covered (COVERED), a read
        # of the region open or accepted in that cycle (BUSY; reads accepted
        # later find the region no longer resident). Registering the hits
        # keeps the reading/coverage vectors out of the check cycle's logic.
        cov_q = Signal()
        open_q = Signal()
        acc_q = Signal(B)
        m.d.sync += [cov_q.eq(((covered | pend) & head.onehot[:S]).any()),
                     open_q.eq((reading & head.onehot).any()),
                     acc_q.eq(Cat(*[s.start_ok & (s.start_oh & head.onehot).any()
                                    for s in sess]))]
        with m.If(claim):
            m.d.sync += h_state.eq(CLAIMED)
        with m.If(check):
            busy_hit = self.busy_at_check(open_q | acc_q.any())
            m.d.sync += [h_state.eq(ACTIVE), h_refused.eq(cov_q | busy_hit),
                         h_go.eq(~(cov_q | busy_hit)),
                         h_reason.eq(Mux(cov_q, FillResultCode.COVERED, FillResultCode.BUSY))]
        result = Signal(FillResultCode)
        # a refused fill wrote nothing: say so, whatever its beats said
        m.d.comb += result.eq(Mux(h_refused & ~head.stray, h_reason, head.result))
        m.d.sync += end_q.v.eq(end_now)
        with m.If(end_now):
            m.d.sync += [end_q.commit.eq(result == FillResultCode.COMMITTED),
                         end_q.onehot.eq(head.onehot), end_q.rkind.eq(head.rkind),
                         end_q.slot.eq(head.slot), end_q.result.eq(result)]
            with m.If(~head.stray):
                m.d.sync += [h_state.eq(READY), h_refused.eq(0), h_go.eq(0)]
        m.d.comb += [self.fill_done.valid.eq(end_q.v),
                     self.fill_done.region.eq(end_q.rkind),
                     self.fill_done.slot.eq(end_q.slot),
                     self.fill_done.result.eq(end_q.result),
                     self.commit.valid.eq(end_q.v & end_q.commit
                                          & (end_q.rkind == HBRegionKind.EXPERT)),
                     self.commit.slot.eq(end_q.slot)]
        end_set = Signal(S + 1)
        end_clr = Signal(S + 1)
        m.d.comb += [end_set.eq(Mux(end_q.v & end_q.commit, end_q.onehot, 0)),
                     end_clr.eq(Mux(end_q.v, end_q.onehot, 0))]
        m.d.sync += filling.eq((filling & ~end_clr) | claim_clr)

        # ---- boundary moves (two phases) ----------------------------------------------------
        IDLE, EVAL, SETTLE, WAIT = 0, 1, 2, 3
        mv_state = Signal(2)
        mv_new = Signal(range(W + 1))
        mv_cov = Signal(S)
        mv_err = Signal()
        m.d.comb += [move_idle.eq(mv_state == IDLE),
                     self.boundary.ready.eq((mv_state == IDLE) & ~self.moved.valid)]
        with m.If(self.moved.ready):
            m.d.sync += self.moved.valid.eq(0)
        # the new coverage and the error are computed from the boundary write
        # itself, into registers; EVAL then only compares them with ``covered``
        thr = self.covered_thresholds()
        bnd = self.boundary.payload
        with m.If(self.boundary.valid & self.boundary.ready):
            m.d.sync += [mv_new.eq(bnd), mv_state.eq(EVAL),
                         mv_cov.eq(Cat(*[bnd > t if t >= 0 else Const(1) for t in thr])),
                         mv_err.eq(bnd > self.kv_limit)]
        m.d.comb += pend_n.eq(pend)
        with m.If(mv_state == EVAL):
            m.d.sync += mv_state.eq(SETTLE)
            m.d.comb += pend_n.eq(Mux(mv_err, 0, mv_cov ^ covered))
        with m.If(mv_state == SETTLE):
            m.d.sync += mv_state.eq(WAIT)
        newly = mv_cov & ~covered
        # ``blocked`` is registered (one cycle old): from SETTLE on, no read or
        # fill of a ``pend`` slot starts (they are refused) and no KV access is
        # accepted, so the set of open ones only shrinks and the value of the
        # cycle before is a safe (late by one) view; SETTLE makes sure that
        # cycle already saw ``pend`` (reads accepted in EVAL are open in it)
        blocked = Signal()
        m.d.sync += blocked.eq((pend & (reading[:S] | filling[:S])).any() | k_busy | k_wdone
                               | (k_pipe != 0))
        apply_ = Signal()
        m.d.comb += apply_.eq((mv_state == WAIT) & (mv_err | ~blocked))
        move_clr = Signal(S)
        m.d.comb += move_clr.eq(Mux(apply_ & ~mv_err, newly, 0))
        with m.If(apply_):
            m.d.comb += pend_n.eq(0)
            m.d.sync += [mv_state.eq(IDLE), self.moved.valid.eq(1),
                         self.moved.payload.error.eq(mv_err),
                         self.moved.payload.kv_words.eq(Mux(mv_err, kv_q, mv_new)),
                         self.moved.payload.covered.eq(Mux(mv_err, 0, newly)),
                         self.moved.payload.invalidated.eq(Mux(mv_err, 0, newly & valid))]
            with m.If(~mv_err):
                m.d.sync += [covered.eq(mv_cov), kv_q.eq(mv_new), kv_lo.eq(W - mv_new)]

        # ---- valid bits: commit sets, a claim or a covering move clears -------------------
        m.d.comb += [valid_n.eq((valid | end_set[:S]) & ~claim_clr[:S] & ~move_clr),
                     dense_n.eq((dense_valid | end_set[S]) & ~claim_clr[S])]
        return m


def hb_params(cfg) -> dict:
    """Elaboration parameters of :class:`HBBank` for a Config (geometry from
    ``Config``/``golden/layout.py``; fill beat = one AXI beat)."""
    return dict(banks=cfg.pes, words=cfg.hb_words, slots=cfg.tag_slots,
                slot_words=cfg.slot_words, dense_words=cfg.dense_words, lanes=cfg.lanes,
                slice_bits=cfg.slice_bits, fill_words=cfg.fill_words, fill_depth=cfg.fill_depth)


def _register():
    from ..blocks import Block
    return [Block("hb_bank", "elmoe3d_hb_bank",
                  "HB bank controller: banked SRAM, PE read streams, fill queue, KV port, "
                  "KV boundary", hb_params, HBBank, order=40,
                  timing=f"1 word/cycle/bank; first word {FIRST_WORD_LATENCY} cycles after a read "
                         f"command; a fill gets 1 cycle in {FILL_PERIOD}")]


BLOCK_SPECS = _register()
