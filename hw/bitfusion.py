"""Baseline: a Bit-Fusion-style fused bit-brick PE (Sharma et al., ISCA 2018).

Each of the ``L`` lanes is a fusion unit of sixteen 2-bit x 2-bit BitBricks
(3-bit signed multipliers after sign/zero extension). Shift-add fuses them
into one INT8 x INT8 product (mode W8) or two INT8 x INT4 products (mode W4)
per lane per cycle. It is the spatial alternative to the temporal bit-slice
PE: W4 doubles throughput, but the 4-bit weights are a separately stored copy
(no nested MSB planes, no LSB augmentation), and the activation port is twice
as wide. Golden model: :mod:`elmoe3d.golden.bitfusion`.

Pipelined exactly like the PE (:mod:`elmoe3d.hw.pe_pipeline`), so that the
comparison is at equal effort: ``a_`` input register -> ``d_`` mode decode
(each brick column's activation source, the weight slices' signedness) ->
``b_`` registered brick products -> the same registered adder tree, with the
bricks grouped by their shift across lanes (the low and the high weight
nibble in two trees) -> ``x_`` fusion of the two nibbles (``hi << 4`` in W8,
``hi`` in W4: one mux after the lane reduction instead of one per lane) ->
accumulator -> credit-managed result FIFO.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed

from ..geometry import fusion_max_beats
from ..golden import bitfusion as gbf
from .pe import LEVELS_PER_STAGE
from .pe_pipeline import LengthCheck, PipelinedMAC, Term, pipelined_sum, tree_stages
from .vocab import BitFusionMode, bitfusion_beat

__all__ = ["BitFusionPE", "BitFusionMode"]


class BitFusionPE(PipelinedMAC):
    """Bit-Fusion-style PE baseline.

    Parameters
    ----------
    lanes : int
        Fusion units (16 BitBricks each).
    max_len : int
        Longest dot product in elements: ``ceil(max_len / L)`` W8 beats or
        ``ceil(max_len / 2L)`` W4 beats (:func:`elmoe3d.golden.bitfusion.result`);
        the accumulator is sized as the PE's.
    levels_per_stage : int
        Adder-tree levels between registers (default as the PE).

    Members
    -------
    i : ``In(stream.Signature(BitFusionBeat))``
        ``act[2L]``, ``weight[L]`` bytes, ``mode`` (:class:`BitFusionMode`),
        ``last``; one mode per dot product.
    o : ``Out(stream.Signature(PEResult))``
        ``error`` (``value`` unspecified) for a dot product that is too long
        or changes mode.

    One beat per cycle: ``L`` MACs in W8, ``2L`` in W4. Latency ``T + 8``
    cycles (15 at ``L = 16``: two trees of 128 bricks, 7 levels).
    """

    def __init__(self, *, lanes: int = 16, max_len: int = 4096,
                 levels_per_stage: int = LEVELS_PER_STAGE):
        from .common import check_int
        check_int("Lane count", lanes, 1, 1024)
        check_int("Adder levels per pipeline stage", levels_per_stage, 1, 16)
        self.tree_stages = tree_stages(8 * lanes, levels_per_stage)
        self.data_stage = self.tree_stages + 3      # a_ = 0, d_, b_, tree, x_
        self.max_beats = tuple(fusion_max_beats(mode is gbf.Mode.W4, max_len=max_len, lanes=lanes)
                               for mode in gbf.Mode)
        super().__init__(bitfusion_beat(lanes), lanes=lanes, max_len=max_len,
                         levels_per_stage=levels_per_stage)

    def elaborate(self, platform):
        m = Module()
        a, a_valid = self.frame(m)
        L = self.lanes
        m.submodules.check = check = LengthCheck(max_beats=self.max_beats)
        m.d.comb += [check.valid.eq(a_valid), check.last.eq(a.last), check.mode.eq(a.mode)]

        # ---- d_: mode decode: activation source of each brick column ------------------
        # W8: every brick of lane j multiplies act[j]; W4: the low-nibble
        # bricks act[2j], the high-nibble bricks act[2j+1].
        w4 = a.mode == BitFusionMode.W4
        d_w4 = Signal(name="d_w4")
        d_lo = [Signal(signed(8), name=f"d_alo{j}") for j in range(L)]
        d_hi = [Signal(signed(8), name=f"d_ahi{j}") for j in range(L)]
        d_w = [Signal(8, name=f"d_w{j}") for j in range(L)]
        m.d.sync += d_w4.eq(w4)
        for j in range(L):
            m.d.sync += [d_lo[j].eq(Mux(w4, a.act[2 * j], a.act[j])),
                         d_hi[j].eq(Mux(w4, a.act[2 * j + 1], a.act[j])),
                         d_w[j].eq(a.weight[j])]

        # ---- b_: BitBricks ---------------------------------------------------------------
        # brick (i, k): 2-bit slice i of the activation (signed for i = 3) times
        # 2-bit slice k of the weight byte (signed for k = 3, and for k = 1 in W4)
        bricks = {}
        for j in range(L):
            for i in range(4):
                for k in range(4):
                    src = d_lo[j] if k < 2 else d_hi[j]
                    a_sl = src.as_unsigned()[2 * i:2 * i + 2]
                    w_sl = d_w[j][2 * k:2 * k + 2]
                    w_signed = d_w4 if k == 1 else (1 if k == 3 else 0)
                    ax = Cat(a_sl, a_sl[1] if i == 3 else 0).as_signed()
                    wx = Cat(w_sl, w_sl[1] & w_signed).as_signed()
                    b = Signal(signed(6), name=f"b_{j}_{i}{k}")
                    m.d.sync += b.eq(ax * wx)
                    bricks[j, i, k] = b
        b_w4 = Signal(name="b_w4")
        m.d.sync += b_w4.eq(d_w4)

        # ---- t_: the low and the high nibble's bricks, grouped by shift ----------------
        order = [(i, k) for i in range(4) for k in range(2)]
        lo_terms = [Term(bricks[j, i, k], 2 * (i + k)) for i, k in order for j in range(L)]
        hi_terms = [Term(bricks[j, i, k + 2], 2 * (i + k)) for i, k in order for j in range(L)]
        lo, st_lo = pipelined_sum(m, lo_terms, levels_per_stage=self.levels_per_stage, name="tl")
        hi, st_hi = pipelined_sum(m, hi_terms, levels_per_stage=self.levels_per_stage, name="th")
        assert st_lo == st_hi == self.tree_stages
        t_w4 = b_w4
        for k in range(st_lo):
            r = Signal(name=f"t{k}_w4")
            m.d.sync += r.eq(t_w4)
            t_w4 = r

        # ---- x_: fusion of the two nibbles ------------------------------------------------
        lo_v = lo.value << lo.shift if lo.shift else lo.value
        hi_v = hi.value << hi.shift if hi.shift else hi.value
        x_term = Signal(signed(self.acc_width), name="x_term")
        m.d.sync += x_term.eq(lo_v + Mux(t_w4, hi_v, hi_v << 4))
        self.finish(m, check, x_term, st_lo + 3)
        return m


def _register():
    from ..blocks import Block
    return [Block("bitfusion", "elmoe3d_bitfusion",
                  "baseline: Bit-Fusion-style fused BitBrick PE (W8: L MACs, W4: 2L MACs per cycle)",
                  lambda cfg: dict(lanes=cfg.lanes, max_len=cfg.max_len), BitFusionPE,
                  baseline_of="pe", order=13,
                  timing=lambda c: f"1 beat/cycle (W8: L, W4: 2L MACs); result {c.latency} "
                                   f"cycles after `last`")]


BLOCK_SPECS = _register()
