"""LSB-augmented bit-slice processing element (PE) and its two baselines.

The PE multiplies ``L`` INT8 activations by ``L`` weight slices per cycle and
accumulates across beats and slice planes. See :mod:`elmoe3d.golden.bitslice`
for the arithmetic it must match bit for bit.

Why a *field*, and where the rounding bit comes from
----------------------------------------------------
A bit-slice multiplier must accept both the signed MSB slice of a weight and
its unsigned lower slices. An unsigned ``s``-bit slice needs one more bit to
enter a signed multiplier (``{0, l}``), so the multiplier is
``INT8 x (s+1)``-bit signed. The MSB slice is already signed and does not need
that bit; instead of wasting it, the PE places the MSB slice one position up,
``{m, r}``, which is worth ``2m + r`` half-units of the MSB plane, and
shifts that plane's partial sum one place less (``s*(n-1) - 1`` instead of
``s*(n-1)``). With ``r = 0`` nothing changes (FULL, MSB-partial). With
``r = 1`` every weight gains exactly half of the dropped LSB range: for
``s = 4``, ``8*(2m + 1) = 16m + 8``, the midpoint of ``[16m, 16m + 15]``.
That turns MSB truncation (biased by -7.5 on average) into
round-to-nearest at the cost of one AND gate per PE: the mode decides ``r``.

When more than one plane is kept (``k > 1``, only possible with ``s < 4``), the
last kept plane is unsigned and has no spare low bit; the PE then adds
``sum(a) << (shift - 1)`` from a small activation adder tree, generated only
when ``n > 2``.
"""

from __future__ import annotations

import math

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from ..golden import bitslice as gbs
from .common import adder_tree, check_int

__all__ = ["PEMode", "BitSlicePE", "Int8MacVector", "pe_input_layout", "pe_output_layout"]


class PEMode(enum.Enum, shape=2):
    """PE precision mode; values equal :class:`elmoe3d.golden.bitslice.Mode`."""
    FULL = int(gbs.Mode.FULL)
    DRAFT = int(gbs.Mode.DRAFT)
    MSB = int(gbs.Mode.MSB)
    LSB = int(gbs.Mode.LSB)


def _plane_bits(n: int) -> int:
    return max(1, math.ceil(math.log2(n)))


def pe_input_layout(lanes: int, slice_bits: int) -> data.StructLayout:
    """One PE beat: a slice vector (``slices``, lane 0 in the low bits, and its
    ``plane``, 0 = MSB) with the activations it multiplies, the mode, the
    number of kept planes, and ``last`` closing the dot product."""
    n = gbs.n_planes(slice_bits)
    return data.StructLayout({
        "act": data.ArrayLayout(signed(8), lanes),
        "slices": data.ArrayLayout(unsigned(slice_bits), lanes),
        "plane": unsigned(_plane_bits(n)),
        "mode": PEMode,
        "keep": unsigned(n.bit_length()),
        "last": unsigned(1),
    })


def pe_output_layout(acc_width: int) -> data.StructLayout:
    return data.StructLayout({"value": signed(acc_width), "error": unsigned(1)})


def _pipeline_ctrl(m: Module, o) -> Signal:
    """Global-stall control of a 3-stage pipeline feeding one output register:
    everything advances when the output register is empty or being read."""
    adv = Signal()
    m.d.comb += adv.eq(~o.valid | o.ready)
    return adv


def _accumulate(m: Module, adv, o, width: int, max_beats: int, term, valid, last, bad_beat):
    """Last pipeline stage shared by the PE and its baselines: accumulate
    ``term`` into a ``width``-bit signed register, count beats, and load the
    output register on ``last``. The error flag is sticky within a dot product
    and set by a bad beat or by more than ``max_beats`` beats."""
    acc = Signal(signed(width))
    acc_next = Signal(signed(width))
    fresh = Signal(init=1)                   # the next beat starts a dot product
    bad = Signal()
    beats = Signal(range(max_beats + 1))
    m.d.comb += acc_next.eq(Mux(fresh, 0, acc) + term)
    over = Mux(fresh, 0, beats) >= max_beats
    bad_next = Mux(fresh, 0, bad) | bad_beat | over
    with m.If(adv):
        with m.If(valid):
            m.d.sync += [acc.eq(acc_next), bad.eq(bad_next), fresh.eq(last),
                         beats.eq(Mux(over, beats, Mux(fresh, 0, beats) + 1))]
        m.d.sync += [o.valid.eq(valid & last),
                     o.payload.value.eq(acc_next),
                     o.payload.error.eq(bad_next)]


class _VectorMAC(wiring.Component):
    """Common constructor of the PE and its baselines: validated lanes and
    length, the accumulator width, the beat limit, and the stream ports."""

    def __init__(self, in_layout_fn, *, lanes: int, max_len: int, beats_per_chunk: int = 1):
        check_int("Lane count", lanes, 1, 1024)
        check_int("Maximum dot-product length", max_len, 1)
        self.lanes = lanes
        self.max_len = max_len
        self.acc_width = gbs.acc_width(max_len)
        self.max_beats = -(-max_len // lanes) * beats_per_chunk
        super().__init__({
            "i": In(stream.Signature(in_layout_fn())),
            "o": Out(stream.Signature(pe_output_layout(self.acc_width))),
        })

    def _begin(self):
        """Module, global-stall advance signal (``i.ready``) and input payload."""
        m = Module()
        adv = _pipeline_ctrl(m, self.o)
        m.d.comb += self.i.ready.eq(adv)
        return m, adv, self.i.payload


class BitSlicePE(_VectorMAC):
    """LSB-augmented bit-slice PE: ``L`` lanes of INT8 x ``(s+1)``-bit field.

    Parameters
    ----------
    lanes : int
        ``L``, slices per beat (default 16).
    slice_bits : int
        ``s`` = 1, 2 or 4 (default 4: signed MSB nibble, unsigned LSB nibble).
    max_len : int
        Longest dot product in elements; sets the accumulator width
        (:func:`elmoe3d.golden.bitslice.acc_width`) so no valid dot product
        can overflow, and the beat limit ``ceil(max_len / L) * n`` past which
        a result is flagged as an error.
    augment : bool
        ``True``: LSB-augmented (DRAFT rounds). ``False``: the plain bit-slice
        baseline, identical except that DRAFT rounds nothing (it computes
        MSB truncation).

    Members
    -------
    i : ``In(stream.Signature(pe_input_layout(L, s)))``
        Beats. Any number of beats, in any plane order, form one dot product
        up to and including the beat with ``last``. ``mode``/``keep`` select
        rounding: DRAFT rounds on beats of plane ``keep - 1``.
    o : ``Out(stream.Signature(pe_output_layout(w)))``
        One result per dot product. ``error`` is set (and ``value``
        unspecified) when a beat's plane is outside its mode's planes
        (``plane_range``), ``keep`` is out of ``1 .. n-1`` in a partial mode,
        or the dot product is longer than the beat limit; the next dot
        product starts clean.

    Latency and throughput: one beat per cycle, back to back, no bubbles; a
    result leaves 3 cycles after its ``last`` beat is accepted. A dot product
    of ``C`` chunks takes ``C * planes`` cycles, so DRAFT with ``k`` of ``n``
    planes takes exactly ``k/n`` of FULL's cycles. ``i.ready`` is
    ``~o.valid | o.ready`` (global stall).

    Raises
    ------
    TypeError, ValueError
        For a parameter of the wrong kind or value, naming it.
    """

    def __init__(self, *, lanes: int = 16, slice_bits: int = 4, max_len: int = 4096,
                 augment: bool = True):
        gbs.check_slice_bits(slice_bits)
        if not isinstance(augment, bool):
            raise TypeError(f"augment must be a bool, not {augment!r}")
        self.slice_bits = slice_bits
        self.planes = gbs.n_planes(slice_bits)
        self.augment = augment
        super().__init__(lambda: pe_input_layout(lanes, slice_bits), lanes=lanes,
                         max_len=max_len, beats_per_chunk=self.planes)

    def elaborate(self, platform):
        m, adv, p = self._begin()
        L, s, n = self.lanes, self.slice_bits, self.planes
        deep = self.augment and n > 2        # k > 1 drafts need the activation sum

        # ---- stage 0 (combinational): fields, products, beat checks --------
        is_draft = p.mode == PEMode.DRAFT
        rnd = Signal()
        if self.augment:
            m.d.comb += rnd.eq(is_draft & (p.plane == p.keep - 1))
        keep_ok = (p.keep >= 1) & (p.keep <= n - 1)
        plane_ok = Signal()
        with m.Switch(p.mode):
            with m.Case(PEMode.FULL):
                m.d.comb += plane_ok.eq(1)
            with m.Case(PEMode.DRAFT, PEMode.MSB):
                m.d.comb += plane_ok.eq(keep_ok & (p.plane < p.keep))
            with m.Case(PEMode.LSB):
                m.d.comb += plane_ok.eq(keep_ok & (p.plane >= p.keep))

        is_msb = p.plane == 0
        r_bit = rnd & is_msb                 # the LSB-augmentation bit
        fw = signed(s + 1)
        s1_prod = [Signal(signed(8 + s + 1), name=f"s1_prod{j}") for j in range(L)]
        s1_plane = Signal.like(p.plane)
        s1_rdeep = Signal()
        s1_last = Signal()
        s1_bad = Signal()
        s1_valid = Signal()
        with m.If(adv):
            for j in range(L):
                fld = Signal(fw, name=f"field{j}")
                m.d.comb += fld.eq(Mux(is_msb, Cat(r_bit, p.slices[j]).as_signed(),
                                       Cat(p.slices[j], Const(0, 1)).as_signed()))
                m.d.sync += s1_prod[j].eq(p.act[j] * fld)
            m.d.sync += [
                s1_plane.eq(p.plane), s1_rdeep.eq(rnd & ~is_msb), s1_last.eq(p.last),
                s1_bad.eq(~plane_ok), s1_valid.eq(self.i.valid),
            ]
            if deep:
                s1_act = [Signal(signed(8), name=f"s1_act{j}") for j in range(L)]
                m.d.sync += [s1_act[j].eq(p.act[j]) for j in range(L)]

        # ---- stage 1: adder trees ---------------------------------------------
        psum_shape = adder_tree(s1_prod).shape()
        s2_psum = Signal(psum_shape)
        s2_plane = Signal.like(s1_plane)
        s2_rdeep = Signal()
        s2_last = Signal()
        s2_bad = Signal()
        s2_valid = Signal()
        with m.If(adv):
            m.d.sync += [s2_psum.eq(adder_tree(s1_prod)), s2_plane.eq(s1_plane),
                         s2_rdeep.eq(s1_rdeep), s2_last.eq(s1_last), s2_bad.eq(s1_bad),
                         s2_valid.eq(s1_valid)]
            if deep:
                s2_asum = Signal(adder_tree(s1_act).shape())
                m.d.sync += s2_asum.eq(adder_tree(s1_act))

        # ---- stage 2: plane shift and accumulate -------------------------------
        W = self.acc_width
        term = Signal(signed(W))
        with m.Switch(s2_plane):
            for q in range(n):
                with m.Case(q):
                    t = s2_psum << gbs.field_shift(q, s)
                    if deep and 0 < q < n - 1:   # plane n-1 is never the last kept one
                        t = t + Mux(s2_rdeep, s2_asum << (gbs.field_shift(q, s) - 1), 0)
                    m.d.comb += term.eq(t)
        _accumulate(m, adv, self.o, W, self.max_beats, term, s2_valid, s2_last, s2_bad)
        return m


def int8_input_layout(lanes: int) -> data.StructLayout:
    return data.StructLayout({
        "act": data.ArrayLayout(signed(8), lanes),
        "weight": data.ArrayLayout(signed(8), lanes),
        "last": unsigned(1),
    })


class Int8MacVector(_VectorMAC):
    """Baseline: bit-parallel INT8 x INT8 MAC vector unit with ``L`` lanes.

    Same pipeline, stream protocol and accumulator sizing as
    :class:`BitSlicePE`, but each beat carries whole INT8 weights, so FULL
    precision takes one beat per chunk instead of ``n``. It has no draft
    mode: a lower-precision draft would need a second weight copy.

    Members
    -------
    i : ``In(stream.Signature(int8_input_layout(L)))``
    o : ``Out(stream.Signature(pe_output_layout(w)))`` (``error`` when longer
        than ``ceil(max_len / L)`` beats).

    Latency 3 cycles after ``last``; one beat per cycle.
    """

    def __init__(self, *, lanes: int = 16, max_len: int = 4096):
        super().__init__(lambda: int8_input_layout(lanes), lanes=lanes, max_len=max_len)

    def elaborate(self, platform):
        m, adv, p = self._begin()
        L = self.lanes
        s1_prod = [Signal(signed(16), name=f"s1_prod{j}") for j in range(L)]
        s1_last, s1_valid = Signal(), Signal()
        with m.If(adv):
            m.d.sync += [s1_prod[j].eq(p.act[j] * p.weight[j]) for j in range(L)]
            m.d.sync += [s1_last.eq(p.last), s1_valid.eq(self.i.valid)]
        s2_psum = Signal(adder_tree(s1_prod).shape())
        s2_last, s2_valid = Signal(), Signal()
        with m.If(adv):
            m.d.sync += [s2_psum.eq(adder_tree(s1_prod)), s2_last.eq(s1_last),
                         s2_valid.eq(s1_valid)]
        W = self.acc_width
        _accumulate(m, adv, self.o, W, self.max_beats, s2_psum, s2_valid, s2_last, 0)
        return m


def _pe_params(augment):
    def params(cfg):
        return dict(lanes=cfg.lanes, slice_bits=cfg.slice_bits, max_len=cfg.max_len,
                    augment=augment)
    return params


def _register():
    from ..blocks import Block
    return [
        Block("pe", "elmoe3d_pe", "LSB-augmented bit-slice PE (FULL/DRAFT/MSB/LSB modes)",
              _pe_params(True), BitSlicePE, order=10),
        Block("pe_plain", "elmoe3d_pe_plain",
              "baseline: the same bit-slice PE without LSB augmentation",
              _pe_params(False), BitSlicePE, baseline_of="pe", order=11),
        Block("mac_int8", "elmoe3d_mac_int8",
              "baseline: bit-parallel INT8xINT8 MAC vector unit, same lanes",
              lambda cfg: dict(lanes=cfg.lanes, max_len=cfg.max_len), Int8MacVector,
              baseline_of="pe", order=12),
    ]


BLOCK_SPECS = _register()
