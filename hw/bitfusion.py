"""Baseline: a Bit-Fusion-style fused bit-brick PE (Sharma et al., ISCA 2018).

Each of the ``L`` lanes is a fusion unit of sixteen 2-bit x 2-bit BitBricks
(3-bit signed multipliers after sign/zero extension). Shift-add fuses them
into one INT8 x INT8 product (mode W8) or two INT8 x INT4 products (mode W4)
per lane per cycle. It is the spatial alternative to the temporal bit-slice
PE: W4 doubles throughput, but the 4-bit weights are a separately stored copy
(no nested MSB planes, no LSB augmentation), and the activation port is twice
as wide. Golden model: :mod:`elmoe3d.golden.bitfusion`.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Mux, Signal, signed, unsigned
from amaranth.lib import data

from .common import adder_tree
from .pe import _accumulate, _VectorMAC

__all__ = ["BitFusionPE", "bitfusion_input_layout"]


def bitfusion_input_layout(lanes: int) -> data.StructLayout:
    return data.StructLayout({
        "act": data.ArrayLayout(signed(8), 2 * lanes),
        "weight": data.ArrayLayout(unsigned(8), lanes),
        "mode": unsigned(1),                 # 0 = W8 (INT8 weights), 1 = W4 (two INT4 per byte)
        "last": unsigned(1),
    })


class BitFusionPE(_VectorMAC):
    """Bit-Fusion-style PE baseline.

    Parameters
    ----------
    lanes : int
        Fusion units (16 BitBricks each).
    max_len : int
        Longest dot product in elements (accumulator sizing, as the PE).

    Members
    -------
    i : ``In(stream.Signature(bitfusion_input_layout(L)))``
    o : ``Out(stream.Signature(pe_output_layout(w)))``

    One beat per cycle: ``L`` MACs in W8, ``2L`` in W4; result 3 cycles
    after ``last``. ``error`` flags a dot product longer than ``max_len``.
    """

    def __init__(self, *, lanes: int = 16, max_len: int = 4096):
        # the beat limit counts W8 beats; W4 beats carry twice as many elements
        super().__init__(lambda: bitfusion_input_layout(lanes), lanes=lanes, max_len=max_len)

    def elaborate(self, platform):
        m, adv, p = self._begin()
        L = self.lanes
        w4 = p.mode == 1

        # stage 0: 16 BitBricks per lane -> registered brick products
        bricks = {}                                    # (lane, i, k) -> product
        with m.If(adv):
            for j in range(L):
                a0, a1 = p.act[2 * j], p.act[2 * j + 1]
                w = p.weight[j]
                for i in range(4):                     # activation 2-bit slice
                    for k in range(4):                 # weight 2-bit slice
                        # act operand: W8 -> act[j]; W4 -> act[2j] (k<2) or act[2j+1] (k>=2)
                        a_src = Mux(w4, a0 if k < 2 else a1, p.act[j])
                        a_sl = a_src.as_unsigned()[2 * i:2 * i + 2]
                        w_sl = w[2 * k:2 * k + 2]
                        w_signed = Mux(w4, k in (1, 3), k == 3)
                        ax = Cat(a_sl, a_sl[1] if i == 3 else 0).as_signed()
                        wx = Cat(w_sl, w_sl[1] & w_signed).as_signed()
                        b = Signal(signed(6), name=f"s1_b{j}_{i}{k}")
                        m.d.sync += b.eq(ax * wx)
                        bricks[j, i, k] = b
        s1_mode, s1_last, s1_valid = Signal(), Signal(), Signal()
        with m.If(adv):
            m.d.sync += [s1_mode.eq(p.mode), s1_last.eq(p.last), s1_valid.eq(self.i.valid)]

        # stage 1: fusion. Bricks of weight slices 0-1 form the low half, 2-3 the
        # high half, each shifted by 2*(i + k mod 2); W8 fuses the halves with
        # a 4-bit shift, W4 adds them as two separate products (one mux per lane).
        lanes = []
        for j in range(L):
            lo = adder_tree([bricks[j, i, k] << (2 * (i + k)) for i in range(4) for k in (0, 1)])
            hi = adder_tree([bricks[j, i, k] << (2 * (i + k - 2)) for i in range(4) for k in (2, 3)])
            lanes.append(lo + Mux(s1_mode, hi, hi << 4))
        s2_sum = Signal(adder_tree(lanes).shape())
        s2_last, s2_valid = Signal(), Signal()
        with m.If(adv):
            m.d.sync += [s2_sum.eq(adder_tree(lanes)), s2_last.eq(s1_last), s2_valid.eq(s1_valid)]

        _accumulate(m, adv, self.o, self.acc_width, self.max_beats, s2_sum, s2_valid, s2_last, 0)
        return m


def _register():
    from ..blocks import Block
    return [Block("bitfusion", "elmoe3d_bitfusion",
                  "baseline: Bit-Fusion-style fused BitBrick PE (W8: L MACs, W4: 2L MACs per cycle)",
                  lambda cfg: dict(lanes=cfg.lanes, max_len=cfg.max_len), BitFusionPE,
                  baseline_of="pe", order=13)]


BLOCK_SPECS = _register()
