"""Pipeline pieces shared by the PE family (``pe``, ``pe_plain``,
``mac_int8``, ``bitfusion``), so that every member gets the same pipelining
effort and every area/Fmax ratio between them stays fair.

Why the PE family is built this way
-----------------------------------
A multiply-accumulate vector at 200 MHz on an ECP5 cannot afford a
multiplier, a 16-input adder tree and an accumulator in one cycle, nor a
global stall (``~o.valid | o.ready`` as the clock enable of every flip-flop,
which puts the consumer's ``ready`` on the critical path of the whole
pipeline). The members therefore share four pieces:

* :func:`pipelined_sum`: the multiplier is split into its partial products
  (one AND row per weight bit, the sign row subtracted), rows of equal weight
  are summed across lanes first (narrow adders), rows are then combined with
  their shifts, and a register follows every ``levels_per_stage`` adder
  levels. The low bits of a shifted add pass through on wires
  (``x + (y << d)`` adds only ``x >> d + y``), so no carry cell is spent on
  known zeros.
* :class:`SequenceCheck` / :class:`LengthCheck`: the dot-product rule of
  :func:`elmoe3d.golden.bitslice.check_beats` as a three-stage pipeline beside
  the datapath (a recurrence of one small counter per stage; every
  comparison is feed-forward), giving the sticky error of a dot product with
  its ``last`` beat.
* :func:`accumulate`: the accumulator and the result register.
* :class:`CreditBuffer`: the pipeline never stalls; results go into a
  :class:`~amaranth.lib.fifo.SyncFIFOBuffered` whose free slots are counted
  as credits. ``i.ready`` is a register that says a result slot is free for
  the next ``last`` beat, so ``o.ready`` reaches only the FIFO and a small
  counter, and no ``ready`` path runs through the block.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Elaboratable, Module, Mux, Shape, Signal, signed
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from ..geometry import acc_width, max_chunks
from .common import check_int
from .vocab import PEMode

__all__ = ["Term", "pipelined_sum", "tree_stages", "delay", "mux_tree", "CHECK_STAGES",
           "SequenceCheck",
           "LengthCheck", "accumulate", "CreditBuffer", "PipelinedMAC"]


class Term:
    """One operand of :func:`pipelined_sum`: ``(-1 if neg else 1) * value << shift``."""

    __slots__ = ("value", "shift", "neg")

    def __init__(self, value, shift: int = 0, neg: bool = False):
        if not Shape.cast(value.shape()).signed:
            value = Cat(value, Const(0, 1)).as_signed()
        self.value, self.shift, self.neg = value, int(shift), bool(neg)


def _combine(x: Term, y: Term) -> Term:
    """``x + y`` as one adder; the lower-shifted operand's low bits pass through."""
    lo, hi = (x, y) if x.shift <= y.shift else (y, x)
    d = hi.shift - lo.shift
    a, b = lo.value, hi.value
    if lo.neg == hi.neg:
        op, neg = "add", lo.neg
    elif hi.neg:
        op, neg = "sub", False               # lo - hi
    else:
        op, neg = "rsub", False              # hi - lo
    if op != "rsub" and 0 < d < len(a):
        upper = a[d:].as_signed()
        upper = upper + b if op == "add" else upper - b
        return Term(Cat(a[:d], upper).as_signed(), lo.shift, neg)
    bb = b << d if d else b
    v = a + bb if op == "add" else (a - bb if op == "sub" else bb - a)
    return Term(v, lo.shift, neg)


def tree_stages(n_terms: int, levels_per_stage: int) -> int:
    """Register stages :func:`pipelined_sum` uses for ``n_terms`` operands."""
    levels = max(1, (n_terms - 1).bit_length())
    return -(-levels // levels_per_stage)


def pipelined_sum(m: Module, terms: list[Term], *, levels_per_stage: int, name: str):
    """Sum ``terms`` with a balanced binary tree (pairs of neighbours first),
    registering every term after each ``levels_per_stage`` levels (at least
    one stage, also for a single term). Returns ``(Term, stages)``; the
    result is the sum with its ``shift`` (a non-negative term)."""
    terms = list(terms)
    if not terms:
        raise ValueError("pipelined_sum needs at least one term")
    stage = 0
    while True:
        for _ in range(levels_per_stage):
            if len(terms) == 1:
                break
            nxt = [_combine(terms[i], terms[i + 1]) for i in range(0, len(terms) - 1, 2)]
            if len(terms) % 2:
                nxt.append(terms[-1])
            terms = nxt
        regs = []
        for k, t in enumerate(terms):
            r = Signal(t.value.shape(), name=f"{name}{stage}_{k}")
            m.d.sync += r.eq(t.value)
            regs.append(Term(r, t.shift, t.neg))
        terms, stage = regs, stage + 1
        if len(terms) == 1:
            break
    out = terms[0]
    if out.neg:                              # never the case in the PE family's trees
        out = Term(-out.value, out.shift)
    return out, stage


def delay(m: Module, value, cycles: int, name: str):
    """``value`` delayed by ``cycles`` plain registers."""
    for k in range(cycles):
        r = Signal.like(value, name=f"{name}_d{k}")
        m.d.sync += r.eq(value)
        value = r
    return value


#: Register stages of :class:`SequenceCheck` / :class:`LengthCheck` (``d_``, ``e_``, ``f_``):
#: their verdict is at stage 3 when the input register is stage 0.
CHECK_STAGES = 3


class SequenceCheck(Elaboratable):
    """The bit-slice dot-product rule (:func:`elmoe3d.golden.bitslice.check_beats`)
    as a three-stage pipeline beside the datapath.

    Inputs (the PE's input register, valid for one cycle per beat):
    ``valid``, ``plane``, ``mode``, ``keep``, ``last``. Outputs,
    :data:`CHECK_STAGES` cycles later: ``o_valid``, ``o_last`` and ``o_bad``,
    the sticky error of the dot product up to and including this beat (so
    ``o_bad`` on the ``last`` beat is the result's ``error``).

    * ``d_`` compares the beat with the previous one (same plane, the next
      plane, same mode/keep, the mode's first and last plane) and counts the
      beats of the current plane (``over`` at the ``max_chunks + 1``-th).
    * ``e_`` keeps ``C``, the chunk count of the first plane (set when the
      first plane ends), and compares the count of every plane that ends
      with it.
    * ``f_`` ORs the beat's flags into the dot product's sticky error.

    Every recurrence is a counter or a register loaded from the previous
    stage; every comparison is between registers.
    """

    def __init__(self, *, slice_bits: int, planes: int, max_chunks: int):
        self.s, self.n, self.max_chunks = slice_bits, planes, max_chunks
        pb = max(1, (planes - 1).bit_length())
        self.valid, self.last = Signal(), Signal()
        self.plane = Signal(pb)
        self.mode = Signal(PEMode)
        self.keep = Signal(planes.bit_length())
        self.o_valid, self.o_last, self.o_bad = Signal(), Signal(), Signal()

    @staticmethod
    def same_count(a, b):
        """Two planes' chunk counts agree (the comparison of stage ``e_``)."""
        return a == b

    def elaborate(self, platform):
        m = Module()
        n, maxc = self.n, self.max_chunks
        sat = maxc + 1
        # ---- d_: relations to the previous beat, chunk counter ----------------
        fresh = Signal(init=1)                 # the next beat starts a dot product
        prev_plane = Signal.like(self.plane)
        prev_mode = Signal.like(self.mode)
        prev_keep = Signal.like(self.keep)
        cnt = Signal(range(sat + 1))           # beats of the current plane so far
        full = self.mode == PEMode.FULL
        lsb = self.mode == PEMode.LSB
        keep_ok = full | ((self.keep >= 1) & (self.keep <= n - 1))
        lo = Mux(lsb, self.keep, 0)
        hi = Mux(full | lsb, n - 1, self.keep - 1)
        same = self.plane == prev_plane
        step = self.plane == prev_plane + 1
        same_mk = (self.mode == prev_mode) & (full | (self.keep == prev_keep))
        restart = fresh | ~same
        # The counter wraps instead of saturating (no compare in its loop): a
        # plane only gets past max_chunks by raising `over` first, which
        # makes the dot product's error sticky whatever the counts do later.
        cnt_new = Mux(restart, 1, cnt + 1)[:len(cnt)]
        with m.If(self.valid):
            m.d.sync += [fresh.eq(self.last), prev_plane.eq(self.plane),
                         prev_mode.eq(self.mode), prev_keep.eq(self.keep), cnt.eq(cnt_new)]
        d = {x: Signal(name=f"d_{x}") for x in
             ("valid", "last", "fresh", "same", "step", "start_bad", "mk_bad", "end_bad", "over")}
        d_cnt = Signal.like(cnt, name="d_cnt")            # this beat's count in its plane
        d_prev_cnt = Signal.like(cnt, name="d_prev_cnt")  # the previous beat's count
        m.d.sync += [d["valid"].eq(self.valid), d["last"].eq(self.last), d["fresh"].eq(fresh),
                     d["same"].eq(same), d["step"].eq(step),
                     d["start_bad"].eq(~keep_ok | (self.plane != lo)),
                     d["mk_bad"].eq(~same_mk), d["end_bad"].eq(self.plane != hi),
                     d["over"].eq(~restart & (cnt >= maxc)),
                     d_cnt.eq(cnt_new),
                     d_prev_cnt.eq(cnt)]

        # ---- e_: C and the comparisons -----------------------------------------
        in_first = Signal()                    # the previous beat was in the first plane
        chunks = Signal.like(cnt)              # C, set when the first plane ends
        first_now = d["fresh"] | (in_first & d["same"])
        leave_first = ~d["fresh"] & in_first & d["step"]
        with m.If(d["valid"]):
            m.d.sync += in_first.eq(first_now)
            with m.If(leave_first):
                m.d.sync += chunks.eq(d_prev_cnt)
        e = {x: Signal(name=f"e_{x}") for x in
             ("valid", "last", "fresh", "bad", "chk_step", "chk_lastp", "chk_last",
              "eq_step", "eq_lastp", "eq_last")}
        pre_bad = Mux(d["fresh"], d["start_bad"],
                      d["mk_bad"] | (~d["same"] & ~d["step"])) \
            | d["over"] | (d["last"] & d["end_bad"])
        m.d.sync += [e["valid"].eq(d["valid"]), e["last"].eq(d["last"]),
                     e["fresh"].eq(d["fresh"]), e["bad"].eq(pre_bad),
                     # a non-first plane ends by stepping to the next: its count must be C
                     e["chk_step"].eq(~d["fresh"] & d["step"] & ~in_first),
                     e["eq_step"].eq(self.same_count(d_prev_cnt, chunks)),
                     # the last beat opens the second plane: that plane's 1 must be C
                     e["chk_lastp"].eq(d["last"] & leave_first),
                     e["eq_lastp"].eq(self.same_count(d_cnt, d_prev_cnt)),
                     # the last beat ends a later plane: its count must be C
                     e["chk_last"].eq(d["last"] & ~first_now & ~leave_first),
                     e["eq_last"].eq(self.same_count(d_cnt, chunks))]

        # ---- f_: sticky error ---------------------------------------------------
        bad = Signal()
        beat_bad = e["bad"] | (e["chk_step"] & ~e["eq_step"]) \
            | (e["chk_lastp"] & ~e["eq_lastp"]) | (e["chk_last"] & ~e["eq_last"])
        bad_new = Mux(e["fresh"], 0, bad) | beat_bad
        with m.If(e["valid"]):
            m.d.sync += bad.eq(bad_new)
        m.d.sync += [self.o_valid.eq(e["valid"]), self.o_last.eq(e["last"]),
                     self.o_bad.eq(bad_new)]
        return m


class LengthCheck(Elaboratable):
    """The baselines' rule (:func:`elmoe3d.golden.bitslice.mac_result`,
    :func:`elmoe3d.golden.bitfusion.result`) in the same three stages: at
    most ``max_beats[mode]`` beats, and (with more than one mode) every beat
    in the first beat's mode. Same ports as :class:`SequenceCheck` (``mode``
    an unsigned index into ``max_beats``)."""

    def __init__(self, *, max_beats: tuple[int, ...]):
        self.max_beats = tuple(max_beats)
        self.valid, self.last = Signal(), Signal()
        self.mode = Signal(max(1, (len(self.max_beats) - 1).bit_length()))
        self.o_valid, self.o_last, self.o_bad = Signal(), Signal(), Signal()

    def elaborate(self, platform):
        m = Module()
        sat = max(self.max_beats) + 1
        fresh = Signal(init=1)
        prev_mode = Signal.like(self.mode)
        cnt = Signal(range(sat + 1))
        with m.If(self.valid):                 # wraps: see SequenceCheck
            m.d.sync += [fresh.eq(self.last), prev_mode.eq(self.mode),
                         cnt.eq(Mux(fresh, 1, cnt + 1)[:len(cnt)])]
        over = Const(0)
        for k, b in enumerate(self.max_beats):
            over = over | ((self.mode == k) & (cnt >= b))
        mode_bad = (self.mode != prev_mode) if len(self.max_beats) > 1 else Const(0)
        d_valid, d_last, d_fresh, d_bad = (Signal(name=f"d_{x}") for x in
                                           ("valid", "last", "fresh", "bad"))
        m.d.sync += [d_valid.eq(self.valid), d_last.eq(self.last), d_fresh.eq(fresh),
                     d_bad.eq(~fresh & (mode_bad | over))]
        e_valid, e_last, e_fresh, e_bad = (Signal(name=f"e_{x}") for x in
                                           ("valid", "last", "fresh", "bad"))
        m.d.sync += [e_valid.eq(d_valid), e_last.eq(d_last), e_fresh.eq(d_fresh),
                     e_bad.eq(d_bad)]
        bad = Signal()
        bad_new = Mux(e_fresh, 0, bad) | e_bad
        with m.If(e_valid):
            m.d.sync += bad.eq(bad_new)
        m.d.sync += [self.o_valid.eq(e_valid), self.o_last.eq(e_last), self.o_bad.eq(bad_new)]
        return m


def accumulate(m: Module, width: int, *, valid, last, term, bad):
    """Accumulate ``term`` into a ``width``-bit register (cleared after the
    last beat of each dot product) and register the result on ``last``. Returns
    ``(r_valid, r_value, r_error)``: registers, two cycles after the beat.

    The accumulator is split in two halves with the carry between them
    deferred by one cycle (``c_cy``): the low half adds the term's low bits
    and keeps its carry out; the high half adds the term's high bits plus the
    carry of the previous beat (as the carry-in of one adder). Each half is
    about ``width / 2`` bits, so no carry chain spans the whole accumulator.
    The result stage ``r_`` adds the last carry into the high half."""
    lo_w = (width + 1) // 2
    hi_w = width - lo_w
    acc_lo = Signal(lo_w, name="c_acc_lo")
    acc_hi = Signal(signed(hi_w), name="c_acc_hi")
    cy = Signal(name="c_cy")
    lo_sum = Signal(lo_w + 1, name="c_lo_sum")
    hi_sum = Signal(signed(hi_w), name="c_hi_sum")
    m.d.comb += lo_sum.eq(acc_lo + term[:lo_w])
    # (2 acc_hi + cy) + (2 term_hi + 1) = 2 (acc_hi + term_hi + cy) + 1: the
    # carry-in rides on bit 0
    m.d.comb += hi_sum.eq((Cat(cy, acc_hi).as_signed()
                           + Cat(Const(1, 1), term[lo_w:width]).as_signed())[1:])
    # The accumulator is cleared *after* a dot product's last beat (a
    # synchronous reset of its flip-flops), not muxed to 0 in front of the
    # adders on the first beat: the adders see registers only.
    with m.If(valid):
        with m.If(last):
            m.d.sync += [acc_lo.eq(0), cy.eq(0), acc_hi.eq(0)]
        with m.Else():
            m.d.sync += [acc_lo.eq(lo_sum[:lo_w]), cy.eq(lo_sum[lo_w]), acc_hi.eq(hi_sum)]
    q_valid, q_error, q_cy = Signal(name="q_valid"), Signal(name="q_error"), Signal(name="q_cy")
    q_lo = Signal(lo_w, name="q_lo")
    q_hi = Signal(signed(hi_w), name="q_hi")
    m.d.sync += [q_valid.eq(valid & last), q_error.eq(bad), q_lo.eq(lo_sum[:lo_w]),
                 q_cy.eq(lo_sum[lo_w]), q_hi.eq(hi_sum)]
    r_valid = Signal(name="r_valid")
    r_value = Signal(signed(width), name="r_value")
    r_error = Signal(name="r_error")
    m.d.sync += [r_valid.eq(q_valid), r_error.eq(q_error),
                 r_value.eq(Cat(q_lo, (q_hi + q_cy)[:hi_w]))]
    return r_valid, r_value, r_error


class CreditBuffer(wiring.Component):
    """Credit-managed output buffer of a pipeline that never stalls.

    Parameters
    ----------
    shape : shape-castable
        Result payload (``PEResult``).
    depth : int
        Result slots (FIFO depth) = credits.

    Members
    -------
    i : ``In(stream.Signature(shape))``
        Results from the pipeline. ``i.ready`` is not looked at: a result only
        exists if its slot was reserved, so the FIFO never refuses one.
    o : ``Out(stream.Signature(shape))``
        The block's output (the FIFO's read port: ``valid`` and ``payload``
        are registers).
    reserve : ``In(1)``
        A result slot is taken this cycle (a ``last`` beat is accepted).
    grant : ``Out(1)``
        Register: at least one slot is free for a ``reserve`` in this cycle.
        It is the block's ``i.ready``.

    ``grant`` of the next cycle is ``credits - reserve + (o.valid & o.ready)
    != 0`` (``grant`` is always ``credits != 0``): ``o.ready`` reaches the
    FIFO's read logic and this counter only.
    """

    def __init__(self, shape, depth: int):
        check_int("Result buffer depth", depth, 2, 1024)
        self.depth = depth
        self._shape = shape
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape)),
                          "reserve": In(1), "grant": Out(1, init=1)})

    def elaborate(self, platform):
        m = Module()
        width = Shape.cast(self._shape).width
        m.submodules.fifo = q = fifo.SyncFIFOBuffered(width=width, depth=self.depth)
        m.d.comb += [q.w_data.eq(self.i.payload),
                     q.w_en.eq(self.i.valid), self.i.ready.eq(q.w_rdy),
                     self.o.valid.eq(q.r_rdy), self.o.payload.eq(q.r_data),
                     q.r_en.eq(self.o.ready)]
        # An up/down counter whose next value and next `grant` are chosen by
        # (reserve, give) among values precomputed from the counter alone, so
        # that `grant -> reserve -> grant` is a mux, not an adder and a compare.
        credits = Signal(range(self.depth + 1), init=self.depth)
        give = self.o.valid & self.o.ready
        dec = self.reserve & ~give
        inc = give & ~self.reserve
        m.d.sync += [credits.eq(Mux(dec, credits - 1, Mux(inc, credits + 1, credits))),
                     self.grant.eq(Mux(dec, credits != 1, inc | self.grant))]
        self.credits = credits
        return m


def mux_tree(sel, options: list):
    """``options[sel]`` as a balanced tree of 2:1 muxes on the bits of ``sel``
    (``len(options)`` a power of two), written as expressions (Icarus reads
    ``m.Switch`` processes on registers as X after reset)."""
    opts = list(options)
    b = 0
    while len(opts) > 1:
        opts = [Mux(sel[b], opts[i + 1], opts[i]) for i in range(0, len(opts), 2)]
        b += 1
    return opts[0]


class PipelinedMAC(wiring.Component):
    """Common frame of the PE family: parameter checks, ports, the input
    register, the rule checker beside the datapath, the accumulator and the
    credit-managed output buffer.

    A member sets ``self.data_stage`` (the register stage, counted from the
    input register = 0, whose output is the accumulator's term) in its
    constructor before calling ``super().__init__``, and in ``elaborate``
    calls :meth:`frame` (input register), builds its datapath, and calls
    :meth:`finish`. Then :attr:`latency` is ``max(data_stage, 2) + 4``
    cycles from the transfer of a ``last`` beat to the transfer of its result
    (with ``o.ready`` high): +1 accumulator/result register, +2 the FIFO's
    write-to-read delay, +1 the input register. :attr:`depth` = latency + 1
    result slots keep the input from ever stalling while ``o`` is read every
    cycle, even for dot products of one beat.
    """

    def __init__(self, beat_type, *, lanes: int, max_len: int, levels_per_stage: int,
                 tokens: int = 1):
        from .vocab import pe_result
        check_int("Lane count", lanes, 1, 1024)
        check_int("Maximum dot-product length", max_len, 1)
        check_int("Adder levels per pipeline stage", levels_per_stage, 1, 16)
        check_int("Token lanes", tokens, 1, 64)
        self.lanes, self.max_len, self.levels_per_stage = lanes, max_len, levels_per_stage
        self.tokens = tokens
        self.max_chunks = max_chunks(max_len, lanes)
        self.acc_width = acc_width(max_len, lanes)
        self.latency = max(self.data_stage, CHECK_STAGES) + 5
        self.depth = self.latency + 1
        super().__init__({"i": In(stream.Signature(beat_type)),
                          "o": Out(stream.Signature(pe_result(max_len, lanes, tokens)))})
        #: the credit-managed result buffer (a member, so that the formal
        #: wrapper can state that it never refuses a result)
        self.result_buffer = CreditBuffer(self.o.payload.shape(), self.depth)

    def frame(self, m: Module):
        """Input register (``a_``) and output buffer; returns ``(a, a_valid)``."""
        m.submodules.out = buf = self.result_buffer
        wiring.connect(m, buf.o, wiring.flipped(self.o))
        m.d.comb += self.i.ready.eq(buf.grant)
        take = self.i.valid & buf.grant
        m.d.comb += buf.reserve.eq(take & self.i.payload.last)
        a = Signal(self.i.payload.shape(), name="a")
        a_valid = Signal(name="a_valid")
        m.d.sync += [a.eq(self.i.payload), a_valid.eq(take)]
        return a, a_valid

    def finish(self, m: Module, check, term, term_stage: int):
        """Join the checker (outputs at stage 3) and the datapath term (at
        ``term_stage``; a list of terms, one per token lane, for a
        token-parallel member), accumulate, and write results into the
        buffer."""
        if isinstance(term, (list, tuple)):
            return self._finish_tokens(m, check, term, term_stage)
        if term_stage != self.data_stage:
            raise RuntimeError(f"{type(self).__name__}: datapath term at stage {term_stage}, "
                               f"latency computed for {self.data_stage}")
        stage = max(term_stage, CHECK_STAGES)
        term = delay(m, term, stage - term_stage, "x_term")
        valid = delay(m, check.o_valid, stage - CHECK_STAGES, "c_valid")
        last = delay(m, check.o_last, stage - CHECK_STAGES, "c_last")
        bad = delay(m, check.o_bad, stage - CHECK_STAGES, "c_bad")
        r_valid, r_value, r_error = accumulate(m, self.acc_width, valid=valid, last=last,
                                               term=term, bad=bad)
        buf = self.result_buffer
        m.d.comb += [buf.i.valid.eq(r_valid), buf.i.payload.value.eq(r_value),
                     buf.i.payload.error.eq(r_error)]

    def _finish_tokens(self, m: Module, check, terms, term_stage: int):
        """:meth:`finish` for ``P`` token lanes: one checker, ``P``
        accumulators in lockstep, one result of ``P`` values."""
        if term_stage != self.data_stage:
            raise RuntimeError(f"{type(self).__name__}: datapath term at stage {term_stage}, "
                               f"latency computed for {self.data_stage}")
        stage = max(term_stage, CHECK_STAGES)
        valid = delay(m, check.o_valid, stage - CHECK_STAGES, "c_valid")
        last = delay(m, check.o_last, stage - CHECK_STAGES, "c_last")
        bad = delay(m, check.o_bad, stage - CHECK_STAGES, "c_bad")
        buf = self.result_buffer
        for p, term in enumerate(terms):
            term = delay(m, term, stage - term_stage, f"x_term_p{p}")
            sub = Module()
            r_valid, r_value, r_error = accumulate(sub, self.acc_width, valid=valid, last=last,
                                                   term=term, bad=bad)
            m.submodules[f"acc{p}"] = sub
            m.d.comb += buf.i.payload.value[p].eq(r_value)
            if p == 0:
                m.d.comb += [buf.i.valid.eq(r_valid), buf.i.payload.error.eq(r_error)]
