"""LSB-augmented bit-slice processing element (PE) and its two baselines.

The PE multiplies ``L`` INT8 activations by ``L`` weight slices per cycle and
accumulates across beats and slice planes. :mod:`elmoe3d.golden.bitslice` is
its specification: the arithmetic (:func:`~elmoe3d.golden.bitslice.dot`) and
the rule that says which beat sequences are one dot product
(:func:`~elmoe3d.golden.bitslice.check_beats`).

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
``sum(a) << (shift - 1)``: one more partial-product row (the activations,
gated by the rounding bit) in a tree that counts half-units, generated only
when ``n > 2``.

Pipeline (the PE family's common scheme, :mod:`elmoe3d.hw.pe_pipeline`)
-------------------------------------------------------------------------
``a_`` input register (the raw beat) -> ``d_`` decode: the fields
``{m, r}`` / ``{0, l}`` (the rounding bit from mode, plane and keep) ->
``t*_`` the ``L * (s + 1)`` partial products (field bit ``k`` AND
activation, the sign row subtracted) summed by a tree with a register after
every ``levels_per_stage`` adder levels -> ``x_`` the plane's shift -> the
accumulator and result register -> a credit-managed result FIFO. The rule
checker (:class:`~elmoe3d.hw.pe_pipeline.SequenceCheck`) runs beside ``d_``
and ``e_``. Nothing stalls inside; ``i.ready`` is low only while every
result slot is taken.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed

from ..geometry import check_slice_bits, field_shift, n_planes
from .pe_pipeline import (PipelinedMAC, LengthCheck, SequenceCheck, Term, mux_tree, pipelined_sum,
                          tree_stages)
from .vocab import PEMode, int8_beat, pe_beat

__all__ = ["PEMode", "BitSlicePE", "Int8MacVector", "LEVELS_PER_STAGE"]

#: Adder-tree levels between pipeline registers in every PE-family block.
LEVELS_PER_STAGE = 1


class BitSlicePE(PipelinedMAC):
    """LSB-augmented bit-slice PE: ``L`` lanes of INT8 x ``(s+1)``-bit field.

    Parameters
    ----------
    lanes : int
        ``L``, slices per beat (default 16).
    slice_bits : int
        ``s`` = 1, 2 or 4 (default 4: signed MSB nibble, unsigned LSB nibble).
    max_len : int
        Longest dot product in elements: at most ``C = ceil(max_len / L)``
        chunks per plane (:func:`elmoe3d.golden.bitslice.max_chunks`); the
        accumulator (:func:`elmoe3d.golden.bitslice.acc_width`) holds every
        dot product of ``C * L`` elements, so none that is accepted overflows.
    augment : bool
        ``True``: LSB-augmented (DRAFT rounds). ``False``: the plain bit-slice
        baseline, identical except that DRAFT rounds nothing (it computes
        MSB truncation).
    levels_per_stage : int
        Adder-tree levels between registers (default :data:`LEVELS_PER_STAGE`).

    Members
    -------
    i : ``In(stream.Signature(PEBeat))``
        ``act[L]`` (INT8), ``sv`` (``SliceVector``: ``slices[L]``, ``plane``),
        ``mode``, ``keep``, ``last``. A dot product is the beats of one weight
        row in consumption order (``golden.layout.weight_beats``): for each
        plane of ``plane_range(s, mode, keep)``, increasing, all ``C`` chunks,
        the same ``C`` for every plane, ``1 <= C <= ceil(max_len / L)``, one
        mode (and, except in FULL, one ``keep``) throughout, ``last`` on its
        final beat. DRAFT rounds on the beats of plane ``keep - 1``.
    o : ``Out(stream.Signature(PEResult))``
        One result per ``last`` beat, in order. ``error`` is set (``value``
        unspecified) when the beats up to that ``last`` break the rule
        (:class:`elmoe3d.golden.bitslice.SeqError`: a bad ``keep``, a mode
        change, a wrong first plane, a plane skipped, repeated or out of order,
        a different chunk count, a missing last plane, too many chunks). The
        next dot product starts clean; nothing needs a reset.

    Attributes
    ----------
    latency : int
        Cycles from the transfer of a ``last`` beat to the transfer of its
        result with ``o.ready`` high: ``T + 7`` with ``T`` =
        :attr:`tree_stages` (input register, decode, ``T`` tree stages, plane
        shift, two accumulator/result stages, two in the result FIFO). 14 at
        the default (``L = 16``, ``s = 4``, one level per stage: 80 partial
        products, 7 levels).
    depth : int
        Result slots (= ``latency + 1``).

    Throughput: one beat per cycle, back to back, for as long as ``o`` is read
    every cycle, whatever the lengths of the dot products. A dot product of
    ``C`` chunks takes ``C * planes`` cycles, so DRAFT with ``k`` of ``n``
    planes takes exactly ``k/n`` of FULL's cycles. ``i.ready`` is a register
    (a result slot is free) and ``o`` comes from the FIFO's registers:
    ``o.ready`` reaches only the FIFO and its credit counter.

    Raises
    ------
    TypeError, ValueError
        For a parameter of the wrong kind or value, naming it.
    """

    #: The rule checker (a class attribute, so that a test can plant a bug in
    #: a subclass without a hook in the design).
    check_cls = SequenceCheck

    def __init__(self, *, lanes: int = 16, slice_bits: int = 4, max_len: int = 4096,
                 augment: bool = True, levels_per_stage: int = LEVELS_PER_STAGE,
                 tokens: int = 1):
        check_slice_bits(slice_bits)
        if not isinstance(augment, bool):
            raise TypeError(f"augment must be a bool, not {augment!r}")
        from .common import check_int
        check_int("Lane count", lanes, 1, 1024)
        check_int("Adder levels per pipeline stage", levels_per_stage, 1, 16)
        self.slice_bits = slice_bits
        self.planes = n_planes(slice_bits)
        self.augment = augment
        self.deep = augment and self.planes > 2
        rows = slice_bits + 1 + (1 if self.deep else 0)
        self.tree_stages = tree_stages(rows * lanes, levels_per_stage)
        self.data_stage = self.tree_stages + 2          # a_ = 0, d_ = 1, tree, x_
        check_int("Token lanes", tokens, 1, 64)
        super().__init__(pe_beat(slice_bits, lanes, tokens), lanes=lanes, max_len=max_len,
                         levels_per_stage=levels_per_stage, tokens=tokens)

    @staticmethod
    def lane_act(beat, p):
        """The activations token lane ``p`` multiplies (a token-parallel PE)."""
        return beat.act[p]

    @staticmethod
    def rounds(beat):
        """The LSB-augmentation decision for one beat: DRAFT, on the last kept
        plane (``plane == keep - 1``)."""
        return (beat.mode == PEMode.DRAFT) & (beat.sv.plane + 1 == beat.keep)

    def elaborate(self, platform):
        m = Module()
        a, a_valid = self.frame(m)
        L, s, n, W = self.lanes, self.slice_bits, self.planes, self.acc_width
        deep = self.deep

        m.submodules.check = check = self.check_cls(slice_bits=s, planes=n,
                                                    max_chunks=self.max_chunks)
        m.d.comb += [check.valid.eq(a_valid), check.last.eq(a.last), check.plane.eq(a.sv.plane),
                     check.mode.eq(a.mode), check.keep.eq(a.keep)]

        # ---- d_: mode decode and fields (shared by the token lanes) -----------------------
        P = self.tokens
        is_msb = a.sv.plane == 0
        rnd = self.rounds(a) if self.augment else Const(0)
        d_field = [Signal(s + 1, name=f"d_field{j}") for j in range(L)]
        sfx = [""] if P == 1 else [f"_p{p}" for p in range(P)]
        d_act = [[Signal(signed(8), name=f"d_act{j}{sfx[p]}") for j in range(L)]
                 for p in range(P)]
        acts = [a.act] if P == 1 else [self.lane_act(a, p) for p in range(P)]
        d_plane = Signal.like(a.sv.plane, name="d_plane")
        d_rdeep = Signal(name="d_rdeep")
        for j in range(L):
            sl = a.sv.slices[j]
            m.d.sync += [d_field[j].eq(Mux(is_msb, Cat(rnd, sl), Cat(sl, Const(0, 1))))]
            m.d.sync += [d_act[p][j].eq(acts[p][j]) for p in range(P)]
        m.d.sync += [d_plane.eq(a.sv.plane), d_rdeep.eq(rnd & ~is_msb)]

        # ---- t_: partial products -> registered adder tree, one per token lane ----------
        # Field bit k of lane j adds act_j << k; bit s is the sign bit of the
        # signed MSB field {m, r} (always 0 in {0, l}) and is subtracted. With
        # `deep` the tree counts half-units: the field rows move up one bit and
        # the activations, gated by the rounding bit, form one more row.
        u = 1 if deep else 0
        stages = self.tree_stages
        t_plane = None
        x_terms = []
        for p in range(P):
            terms = [Term(Mux(d_field[j][k], d_act[p][j], 0), k + u, neg=(k == s))
                     for k in range(s + 1) for j in range(L)]
            if deep:
                terms += [Term(Mux(d_rdeep, d_act[p][j], 0), 0) for j in range(L)]
            psum, st = pipelined_sum(m, terms, levels_per_stage=self.levels_per_stage,
                                     name=f"t{sfx[p]}")
            assert st == stages, (st, stages)
            if t_plane is None:
                # the plane travels beside the trees (their stages are equal)
                t_plane = d_plane
                for k in range(stages):
                    r = Signal.like(t_plane, name=f"t{k}_plane")
                    m.d.sync += r.eq(t_plane)
                    t_plane = r
            total = psum.value << psum.shift if psum.shift else psum.value

            # ---- x_: the plane's shift ---------------------------------------------------
            opts = []
            for q in range(n):
                sh = field_shift(q, s) - u
                opts.append(total << sh if sh >= 0 else total >> 1)   # exact: even there
            x_term = Signal(signed(W), name=f"x_term{sfx[p]}")
            m.d.sync += x_term.eq(mux_tree(t_plane, opts) if n > 1 else opts[0])
            x_terms.append(x_term)

        self.finish(m, check, x_terms[0] if P == 1 else x_terms, stages + 2)
        return m


class Int8MacVector(PipelinedMAC):
    """Baseline: bit-parallel INT8 x INT8 MAC vector unit with ``L`` lanes.

    Same pipelining as :class:`BitSlicePE` (input register, partial-product
    rows of the 8 weight bits summed by the same registered tree, the same
    accumulator and credit-managed result buffer), but each beat carries
    whole INT8 weights, so FULL precision takes one beat per chunk instead of
    ``n``. It has no draft mode: a lower-precision draft would need a second
    weight copy. It needs no decode stage.

    Members
    -------
    i : ``In(stream.Signature(Int8Beat))``
        ``act[L]``, ``weight[L]`` (INT8), ``last``. A dot product is 1 ..
        ``ceil(max_len / L)`` beats closed by ``last``
        (:func:`elmoe3d.golden.bitslice.mac_result`).
    o : ``Out(stream.Signature(PEResult))``
        ``error`` (``value`` unspecified) when longer.

    Latency ``T + 5`` cycles (12 at ``L = 16``: 128 partial products, 7
    levels; ``max(T, 3) + 5`` for tiny ``L``, where the rule checker's three
    stages are the longer path); one beat per cycle; ``i.ready`` a register,
    as the PE.
    """

    def __init__(self, *, lanes: int = 16, max_len: int = 4096,
                 levels_per_stage: int = LEVELS_PER_STAGE):
        from .common import check_int
        check_int("Lane count", lanes, 1, 1024)
        check_int("Adder levels per pipeline stage", levels_per_stage, 1, 16)
        self.tree_stages = tree_stages(8 * lanes, levels_per_stage)
        self.data_stage = self.tree_stages
        super().__init__(int8_beat(lanes), lanes=lanes, max_len=max_len,
                         levels_per_stage=levels_per_stage)

    def elaborate(self, platform):
        m = Module()
        a, a_valid = self.frame(m)
        L = self.lanes
        m.submodules.check = check = LengthCheck(max_beats=(self.max_chunks,))
        m.d.comb += [check.valid.eq(a_valid), check.last.eq(a.last)]
        terms = [Term(Mux(a.weight[j][k], a.act[j], 0), k, neg=(k == 7))
                 for k in range(8) for j in range(L)]
        psum, stages = pipelined_sum(m, terms, levels_per_stage=self.levels_per_stage,
                                     name="t")
        assert stages == self.tree_stages
        total = psum.value << psum.shift if psum.shift else psum.value
        term = Signal(signed(self.acc_width), name="t_term")
        m.d.comb += term.eq(total)
        self.finish(m, check, term, stages)
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
              _pe_params(True), BitSlicePE, order=10,
              timing=lambda c: f"1 beat/cycle ({c.lanes} slice-MACs), no bubbles; "
                               f"DRAFT k of n planes: k/n of FULL's "
                               f"cycles; result {c.latency} cycles after `last`"),
        Block("pe_lanes", "elmoe3d_pe_lanes",
              "the MoE array's PE: one weight slice vector applied to P token lanes per cycle",
              lambda cfg: dict(_pe_params(True)(cfg), tokens=cfg.token_lanes), BitSlicePE,
              order=10,
              timing=lambda c: f"1 beat/cycle for {c.tokens} tokens: {c.tokens * c.lanes} "
                               f"slice-MACs/cycle; result {c.latency} cycles after `last`"),
        Block("pe_plain", "elmoe3d_pe_plain",
              "baseline: the same bit-slice PE without LSB augmentation",
              _pe_params(False), BitSlicePE, baseline_of="pe", order=11,
              timing=lambda c: f"1 beat/cycle; result {c.latency} cycles after `last`"),
        Block("mac_int8", "elmoe3d_mac_int8",
              "baseline: bit-parallel INT8xINT8 MAC vector unit, same lanes",
              lambda cfg: dict(lanes=cfg.lanes, max_len=cfg.max_len), Int8MacVector,
              baseline_of="pe", order=12,
              timing=lambda c: f"1 INT8 vector/cycle; result {c.latency} cycles after `last`"),
    ]


BLOCK_SPECS = _register()
