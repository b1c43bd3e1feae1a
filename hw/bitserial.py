"""Peer design: a weight-bit-serial MAC vector (UNPU/Stripes-style).

Written from the published description (see :mod:`elmoe3d.golden.bitserial`,
the specification it matches bit for bit), as the closest per-area rival of
the LSB-augmented bit-slice PE at draft precision: each cycle every lane
multiplies an INT8 activation by ``b`` bits (one *digit*) of its weight,
most significant digit first, and a shift-and-add accumulator assembles the
weight's product over ``p / b`` cycles. INT8 weights take ``8/b`` cycles per
chunk of ``L`` elements, 4-bit (draft) weights ``4/b``: precision is traded
for throughput with one weight copy, and without any rounding (the draft is
the truncated weight).

Pipeline (pipelined for 200 MHz on ECP5 the way issue 11 asks of the PE
family, so that the comparison is at equal effort)
-------------------------------------------------------------------------------
* ``a_``: input register (activations, their negation for the sign digit,
  digits, flags) and the sequence checks (group/digit/limit counters).
* ``t_``: the ``L * (b + 1)`` partial products of ``act x field`` (one AND
  row per digit bit, a negated row for the sign bit of the most significant
  digit) summed by an adder tree with a register after every
  ``levels_per_stage`` adder levels.
* ``g_``: group accumulator, ``grp = (msd ? 0 : grp << b) + psum``.
* ``d_``: dot-product accumulator, added on the group's last digit.
* ``r_``: the result register, written into the output FIFO.
* Output: a :class:`~amaranth.lib.fifo.SyncFIFOBuffered` of results. The
  pipeline never stalls: ``i.ready`` is a register that says a result slot
  is free (credits = FIFO depth minus results in flight or buffered, kept
  as a thermometer code), so
  ``o.ready`` reaches no flip-flop but the FIFO's.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from ..config import check_int
from ..geometry import MAX_WEIGHT_BITS, check_digit_bits, serial_acc_width, serial_max_groups
from . import vocab as hv

__all__ = ["BitSerialMAC"]


def _tree_stage(m: Module, terms: list, name: str, levels: int) -> list:
    """``levels`` levels of pairwise adds, then a register per sum."""
    for _ in range(levels):
        if len(terms) == 1:
            break
        nxt = [terms[i] + terms[i + 1] for i in range(0, len(terms) - 1, 2)]
        if len(terms) % 2:
            nxt.append(terms[-1])
        terms = nxt
    regs = []
    for k, t in enumerate(terms):
        r = Signal(t.shape(), name=f"{name}{k}")
        m.d.sync += r.eq(t)
        regs.append(r)
    return regs


class BitSerialMAC(wiring.Component):
    """Weight-bit-serial (digit-serial) MAC vector: ``L`` lanes, ``b`` weight
    bits per lane per cycle against INT8 activations.

    Parameters
    ----------
    lanes : int
        ``L`` (default 16).
    digit_bits : int
        ``b`` = 1, 2 or 4 weight bits per cycle (default 4).
    max_len : int
        Longest dot product in elements; sets the accumulator width
        (:func:`elmoe3d.golden.bitserial.acc_width`) and the limit of
        ``ceil(max_len / L)`` weight groups.
    levels_per_stage : int
        Adder-tree levels between registers (default 1: every level
        registered, as needed for 200 MHz on ECP5).

    Members
    -------
    i : ``In(stream.Signature(BitSerialBeat))`` (:func:`elmoe3d.hw.vocab.bitserial_beat`)
        Beats; a weight group of ``p`` bits is ``p / b`` beats, ``msd`` first.
    o : ``Out(stream.Signature(BitSerialResult))``
        One result per dot product; ``error`` (``value`` unspecified) on a
        malformed group, ``last`` without ``lsd``, a group wider than 8 bits,
        or more than ``ceil(max_len / L)`` groups. The next dot product starts
        clean.

    Latency and throughput: one beat per cycle, back to back, with no
    bubble while ``o`` is read; a weight of ``p`` bits costs ``p / b`` cycles
    per chunk (INT8: ``8/b``, 4-bit draft: ``4/b``). A result leaves
    :attr:`latency` cycles after its ``last`` beat is accepted (with
    ``o.ready`` high). ``i.ready`` is low only while all :attr:`depth`
    result slots are taken.

    Raises
    ------
    TypeError, ValueError
        For a parameter of the wrong kind or value, naming it.
    """

    def __init__(self, *, lanes: int = 16, digit_bits: int = 4, max_len: int = 4096,
                 levels_per_stage: int = 1):
        check_int("Lane count", lanes, 1, 1024)
        check_digit_bits(digit_bits)
        check_int("Maximum dot-product length", max_len, 1)
        check_int("Adder levels per pipeline stage", levels_per_stage, 1, 16)
        self.lanes, self.digit_bits, self.max_len = lanes, digit_bits, max_len
        self.levels_per_stage = levels_per_stage
        self.acc_width = serial_acc_width(max_len)
        self.max_groups = serial_max_groups(max_len, lanes)
        self.max_digits = MAX_WEIGHT_BITS // digit_bits
        terms = lanes * (digit_bits + 1)
        levels = max(1, (terms - 1).bit_length())
        self.tree_stages = -(-levels // levels_per_stage)
        # a_ (1) + tree stages + g_ (1) + d_ (1) + r_ (1), then the FIFO
        self.pipe_stages = 1 + self.tree_stages + 3
        self.depth = self.pipe_stages + 3
        self.latency = self.pipe_stages + 1
        super().__init__({
            "i": In(stream.Signature(hv.bitserial_beat(lanes, digit_bits))),
            "o": Out(stream.Signature(hv.bitserial_result(self.acc_width))),
        })

    def elaborate(self, platform):
        m = Module()
        L, b, W = self.lanes, self.digit_bits, self.acc_width
        p = self.i.payload

        # ---- output buffer and credits -------------------------------------
        m.submodules.out_fifo = out_fifo = fifo.SyncFIFOBuffered(width=W + 1, depth=self.depth)
        m.d.comb += [self.o.valid.eq(out_fifo.r_stream.valid),
                     self.o.payload.as_value().eq(out_fifo.r_stream.payload),
                     out_fifo.r_stream.ready.eq(self.o.ready)]
        # Credits as a thermometer code (bit k set: at least k + 1 result
        # slots free): a last beat shifts it down, a result read shifts it
        # up, so each bit's next value is a small function of its neighbours
        # and i.ready is simply bit 0, a flip-flop -- no counter arithmetic
        # between i.valid and i.ready.
        D = self.depth
        credits = Signal(D, init=(1 << D) - 1)
        ready = credits[0]
        take = self.i.valid & ready & p.last
        give = self.o.valid & self.o.ready
        with m.If(take & ~give):
            m.d.sync += credits.eq(credits >> 1)
        with m.Elif(give & ~take):
            m.d.sync += credits.eq(Cat(Const(1, 1), credits[:-1]))
        m.d.comb += self.i.ready.eq(ready)
        accept = self.i.valid & ready

        # ---- a_: input register and sequence checks -------------------------
        a_act = [Signal(signed(8), name=f"a_act{j}") for j in range(L)]
        a_neg = [Signal(signed(9), name=f"a_neg{j}") for j in range(L)]
        a_dig = [Signal(unsigned(b), name=f"a_dig{j}") for j in range(L)]
        a_msd, a_lsd = Signal(name="a_msd"), Signal(name="a_lsd")
        a_last, a_valid = Signal(name="a_last"), Signal(name="a_valid")
        # The data registers load every cycle (no enable): a_valid alone says
        # whether they hold a beat, so i.ready drives one flip-flop, not the
        # L * (8 + 9 + b) of the input stage.
        m.d.sync += [a_valid.eq(accept), a_msd.eq(p.msd), a_lsd.eq(p.lsd), a_last.eq(p.last)]
        for j in range(L):
            m.d.sync += [a_act[j].eq(p.act[j]), a_neg[j].eq(-p.act[j]),
                         a_dig[j].eq(p.digits[j])]

        # sequence state (updated on a_ beats): inside a group, digits so far,
        # groups so far; a beat's own error goes down the pipe as a_bad
        in_group = Signal()
        ndig = Signal(range(self.max_digits + 2))
        groups = Signal(range(self.max_groups + 1))
        ndig_new = Mux(a_msd, 1, ndig + 1)
        a_bad = Signal()
        m.d.comb += a_bad.eq((a_msd != ~in_group) | (ndig_new > self.max_digits)
                             | (a_lsd & (groups >= self.max_groups)) | (a_last & ~a_lsd))
        with m.If(a_valid):
            m.d.sync += [in_group.eq(~a_lsd & ~a_last),
                         ndig.eq(Mux(ndig_new > self.max_digits, self.max_digits + 1, ndig_new)),
                         groups.eq(Mux(a_last, 0, Mux(a_lsd & (groups < self.max_groups),
                                                       groups + 1, groups)))]

        # ---- t_: partial products and the registered adder tree -------------
        # The digit enters as a (b+1)-bit field: sign-extended for the most
        # significant digit, zero-extended otherwise. Its bit k < b adds
        # act << k; bit b (set only for a negative leading digit) adds
        # -act << b, from the negation registered in a_.
        terms = []
        for j in range(L):
            for k in range(b):
                terms.append(Mux(a_dig[j][k], a_act[j], 0).as_signed() << k)
            sign = a_msd & a_dig[j][b - 1]
            terms.append(Mux(sign, a_neg[j], 0).as_signed() << b)
        ctrl = Cat(a_valid, a_msd, a_lsd, a_last, a_bad)
        stage = 0
        while True:
            terms = _tree_stage(m, terms, f"t{stage}_sum", self.levels_per_stage)
            c = Signal.like(ctrl, name=f"t{stage}_ctrl")
            m.d.sync += c.eq(ctrl)
            ctrl, stage = c, stage + 1
            if len(terms) == 1:
                break
        assert stage == self.tree_stages, (stage, self.tree_stages)
        psum = terms[0]
        t_valid, t_msd, t_lsd, t_last, t_bad = (ctrl[k] for k in range(5))

        # ---- g_: group (shift-and-add) accumulator --------------------------
        g_width = len(psum) + MAX_WEIGHT_BITS
        grp = Signal(signed(g_width))
        g_sum = Signal(signed(g_width))
        m.d.comb += g_sum.eq(Mux(t_msd, 0, grp << b) + psum)
        # g_term: the finished group, or 0 (registered here, so the dot
        # accumulator below is one add and one mux)
        g_term = Signal(signed(g_width))
        g_valid, g_last, g_bad = Signal(name="g_valid"), Signal(name="g_last"), Signal(name="g_bad")
        m.d.sync += [g_valid.eq(t_valid), g_last.eq(t_last), g_bad.eq(t_bad),
                     g_term.eq(Mux(t_valid & t_lsd, g_sum, 0))]
        with m.If(t_valid):
            m.d.sync += grp.eq(g_sum)

        # ---- d_: dot-product accumulator and the result ---------------------
        acc = Signal(signed(W))
        bad = Signal()
        fresh = Signal(init=1)
        acc_next = Mux(fresh, 0, acc) + g_term
        bad_next = Mux(fresh, 0, bad) | g_bad
        with m.If(g_valid):
            m.d.sync += [acc.eq(acc_next), bad.eq(bad_next), fresh.eq(g_last)]
        # r_: the result register (the FIFO's LUT-RAM write is not on the
        # accumulator's path)
        r_valid = Signal(name="r_valid")
        r_data = Signal(W + 1, name="r_data")
        m.d.sync += [r_valid.eq(g_valid & g_last), r_data.eq(Cat(acc_next[:W], bad_next))]
        m.d.comb += [out_fifo.w_stream.valid.eq(r_valid), out_fifo.w_stream.payload.eq(r_data)]
        return m


def _register():
    from ..blocks import Block
    return [
        Block("bitserial", "elmoe3d_bitserial",
              "peer: weight-bit-serial MAC vector (UNPU/Stripes-style), 4 weight bits/cycle",
              lambda cfg: dict(lanes=cfg.lanes, digit_bits=4, max_len=cfg.max_len),
              BitSerialMAC, baseline_of="pe", order=14,
              timing=lambda c: f"INT8 weights in {c.max_digits} beats/chunk; result "
                               f"{c.latency} cycles after `last`"),
    ]


BLOCK_SPECS = _register()
