"""Geometry and small hardware helpers shared by the batched MoE datapath's
components: :class:`Geom` (every size the components need, derived once
from a :class:`~elmoe3d.config.Config`), pipelined integer arithmetic
(:func:`mul_pipe`, :func:`requant_pipe`, :func:`delay`), a priority
encoder and the cycle counter the pass counters are timed by
(:class:`CycleCounter`).

Why the arithmetic is written out
---------------------------------
The datapath must close timing at 125 MHz on an ECP5 without DSP blocks
(the synthesis flow maps multipliers to LUTs). Yosys turns a ``*`` into one
combinational array, 30-40 LUT levels deep for a 28 x 16 product. Here a
product is a sum of partial products ``a * b[i] << i`` added by a tree with
a register after every level: each stage is one carry chain (the AND of
the partial product folds into the first adder's LUTs). A requantisation
``clamp((v * M + 2**(sh-1)) >> sh, -128, 127)`` shifts by ``sh - 1`` in two
registered 3-level barrel stages and rounds last: ``(q + 1) >> 1`` of the
shifted value equals the rounded result exactly, and only the low 10 bits
of ``q`` (plus an all-sign-bits test) decide the clamped INT8.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import Out

from ...config import Config
from ...geometry import GATE_ONE, MULT_BITS, acc_width, dense_layout

__all__ = ["Geom", "geom", "pow2ceil", "mul_pipe", "requant_pipe", "delay", "lowest_set",
           "lowest_flag", "zext", "MUL_BITS", "CycleCount", "CycleCounter"]

MUL_BITS = MULT_BITS


def pow2ceil(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@dataclass(frozen=True)
class Geom:
    """Every size of the batched datapath for one Config (see ``docs/blocks/moe_layer.md``)."""
    cfg: Config
    s: int                 # slice bits
    n: int                 # planes
    k: int                 # HB planes = DRAFT planes
    L: int                 # lanes
    B: int                 # PEs = HB banks
    H: int
    I: int
    E: int
    K: int                 # top-k
    S: int                 # shared experts
    T: int                 # tokens per pass
    P: int                 # token lanes (tokens per beat)
    Tl: int                # tokens per lane: ceil(T / P)
    W: int                 # PE result width
    sv: int                # slice-vector bits
    fw: int                # words per ExtBeat
    rows: int              # expert rows per bank per plane
    router_words: int      # n planes of the router, per bank
    c_in: int              # chunks of a GATE/UP/ROUTER row (H/L)
    c_down: int            # chunks of a DOWN row (I/L)
    g_router: int          # E/B
    g_in: int              # I/B
    g_down: int            # H/B
    hb_depth: int          # HB weight buffer words per bank
    ext_depth: int         # LPDDR weight buffer words per bank
    accw: int              # combine accumulator width
    jobs: int              # most jobs in a pass: S + E

    @property
    def dense(self):
        return dense_layout(self.cfg)

    def lane(self) -> "Geom":
        """The geometry one token lane sees: ``T`` = :attr:`Tl` tokens (the
        lane's tokens, by lane-local index ``t div P``), one lane. The
        per-token units (top-k, softmax) are built from it, once per lane."""
        import dataclasses
        return dataclasses.replace(self, T=self.Tl, P=1)

    def lane_token(self, t: int) -> tuple[int, int]:
        """``(lane, lane-local index)`` of a pass's token ``t``."""
        return t % self.P, t // self.P


def pe_result_width(cfg: Config) -> int:
    """Width of the PE's result for this Config (``PEResult.value``)."""
    return acc_width(cfg.max_len, cfg.lanes)


def geom(cfg: Config, *, hb_depth: int | None = None, ext_depth: int | None = None) -> Geom:
    """The :class:`Geom` of a Config. Buffer depths default to
    ``hb = pow2ceil(max(router_words, k * expert_rows, 2 * n * chunks))`` (a
    whole router run, an HB slot, two segments) and
    ``ext = pow2ceil(2 * n * expert_rows)`` (two experts of look-ahead, so
    the LPDDR port keeps running while the PEs work on a heavy expert)."""
    n, k = cfg.planes, cfg.hb_planes_eff
    H, I, E, L, B = cfg.hidden, cfg.ffn, cfg.experts, cfg.lanes, cfg.pes
    router_words = n * E * H // (B * L)
    cmax = max(H, I) // L
    hb = pow2ceil(max(router_words, k * cfg.expert_rows, 2 * n * cmax)) if hb_depth is None \
        else hb_depth
    ext = pow2ceil(2 * n * cfg.expert_rows) if ext_depth is None else ext_depth
    for name, v, need in (("HB buffer depth", hb, max(router_words, 2 * n * cmax)),
                          ("LPDDR buffer depth", ext, 2 * n * cmax)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an integer, not {v!r}")
        if v < need or v & (v - 1):
            raise ValueError(f"{name} must be a power of two of at least {need} words, not {v!r}")
    S = cfg.shared_experts
    accw = ((S + 1) * GATE_ONE * 128).bit_length() + 1
    T, P = cfg.batch_tokens, cfg.token_lanes
    return Geom(cfg, cfg.slice_bits, n, k, L, B, H, I, E, cfg.top_k, S, T, P, -(-T // P),
                pe_result_width(cfg), cfg.slice_vector_bits, cfg.fill_words, cfg.expert_rows,
                router_words, H // L, I // L, E // B, I // B, H // B, hb, ext, accw, S + E)


class CycleCount(wiring.Signature):
    """The time base of the pass counters: ``cycle`` (``Out``, ``stat_bits``
    wide), the clock cycles since reset, wrapping."""

    def __init__(self, g):
        self._g = g
        super().__init__({"cycle": Out(unsigned(g.cfg.stat_bits))})

    def __eq__(self, other):
        return type(other) is CycleCount and self._g == other._g

    def __repr__(self):
        return f"CycleCount({self._g.cfg.stat_bits} bits)"


class CycleCounter(wiring.Component):
    """A free-running cycle counter (its signature is :class:`CycleCount`):
    the issue stage stamps a pass's start with it and the output stage its
    end, so ``PassStats.cycles`` is their difference.

    Latency: ``cycle`` is a register, ``n`` at the ``n``-th cycle after reset.
    """

    def __init__(self, g):
        super().__init__(CycleCount(g))

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.cycle.eq(self.cycle + 1)
        return m


def zext(v, width: int):
    """``v`` cut or zero-extended to exactly ``width`` bits (for address
    fields in a ``Cat``: a slice never widens a narrower value)."""
    v = v.as_value() if hasattr(v, "as_value") else v
    if len(v) >= width:
        return v[:width]
    return Cat(v, Const(0, width - len(v)))


def delay(m: Module, sig, stages: int, name: str):
    """``sig`` delayed by ``stages`` registers (free running)."""
    cur = sig
    for i in range(stages):
        nxt = Signal.like(cur, name=f"{name}_d{i + 1}")
        m.d.sync += nxt.eq(cur)
        cur = nxt
    return cur


def mul_pipe(m: Module, a, b, name: str, *, b_signed: bool = False):
    """Pipelined product ``a * b``: partial products over the bits of ``b``
    added by a tree with a register after every level (free running).
    Returns ``(product, latency)``; ``a`` is signed or unsigned as its shape
    says, ``b`` is read as ``b_signed``."""
    wb = len(b)
    pps = []
    for i in range(wb):
        pp = Mux(b[i], a, 0)
        term = pp << i
        if b_signed and i == wb - 1:
            term = -term
        pps.append(term)
    lat = 0
    level = 0
    while len(pps) > 1 or lat == 0:
        nxt = []
        for i in range(0, len(pps), 2):
            v = pps[i] + pps[i + 1] if i + 1 < len(pps) else pps[i]
            r = Signal(v.shape(), name=f"{name}_l{level}_{i // 2}")
            m.d.sync += r.eq(v)
            nxt.append(r)
        pps = nxt
        lat += 1
        level += 1
    return pps[0], lat


#: Stages of :func:`requant_pipe` after the product: two barrel stages, one clamp.
REQUANT_LATENCY_TAIL = 3


def requant_pipe(m: Module, v, mult, shift, name: str):
    """Pipelined ``clamp((v * mult + 2**(shift-1)) >> shift, -128, 127)``
    (:func:`elmoe3d.golden.moe_layer.requant`, ``shift`` in 1..47). ``v``
    signed, ``mult`` unsigned 16 bits, ``shift`` unsigned 6 bits; all read in
    the cycle ``v`` is presented. Returns ``(INT8 signal, latency)``."""
    prod, lat = mul_pipe(m, v, mult, f"{name}_mul")
    # `shift - 1` before the delay line (no adder before the barrel)
    s1_in = Signal(6, name=f"{name}_s1_in")
    m.d.comb += s1_in.eq(shift - 1)
    s1 = delay(m, s1_in, lat, f"{name}_s1")
    # barrel, low three bits of the shift
    qa = Signal(prod.shape(), name=f"{name}_qa")
    qa_c = Signal(prod.shape(), name=f"{name}_qa_c")
    s1b = Signal(3, name=f"{name}_s1b")
    m.d.comb += qa_c.eq(prod >> s1[:3])
    m.d.sync += [qa.eq(qa_c), s1b.eq(s1[3:])]
    # The range check below needs bits 9.. of the second barrel's output all
    # equal: those are the bits of `qa` from `9 + 8 * s1b` on (and their sign
    # extension), i.e. every 8-bit group `j` of `qa` (from bit `9 + 8 j`) from
    # group `s1b` on equals the sign's fill (the last group holds the sign
    # and is checked whenever any group is). "Before the shift's start"
    # (`s1b > j`) is registered with `qa`; the group compares are worked out
    # from `qa` beside the second barrel, so neither stage is a barrel
    # followed by a wide reduction (the first barrel's 8:1 select and an
    # 8-bit compare had been five LUT levels)
    width = len(qa)
    sign = qa[width - 1]
    ok = []
    for j, lo in enumerate(range(9, width, 8)):
        grp = qa[lo:min(lo + 8, width)]
        sk = Signal(name=f"{name}_skip{j}")
        m.d.sync += sk.eq(s1[3:] > j)
        ok.append(sk | (grp == sign.replicate(len(grp))))
    qb_c = Signal(prod.shape(), name=f"{name}_qb_c")
    m.d.comb += qb_c.eq(qa >> Cat(Const(0, 3), s1b))
    # the second barrel stage, and beside it the rounding adder (a 10-bit
    # carry chain after an 8:1 select) and the range check, so that the last
    # stage is a few LUTs of registers: r = (low + 1) >> 1 with low the low
    # 10 bits of the shifted value q; q is in [-512, 511] iff bits 9.. all
    # equal its sign
    low = Signal(signed(10), name=f"{name}_low")
    m.d.comb += low.eq(qb_c[:10])
    r = Signal(signed(10), name=f"{name}_r")
    in_range = Signal(name=f"{name}_in")
    neg = Signal(name=f"{name}_neg")
    m.d.sync += [r.eq((low + 1) >> 1), neg.eq(qb_c[width - 1]),
                 in_range.eq(Cat(*ok).all() if ok else 1)]
    # then r clipped: r >= 128 (bits 9..7 = 001, 010 or 011) and r <= -129
    # (bits 9..7 = 100, 101 or 110), written as bit logic so that no carry
    # chain compares a constant
    hi_clip = Signal(name=f"{name}_hi")
    lo_clip = Signal(name=f"{name}_lo")
    m.d.comb += [hi_clip.eq(~r[9] & (r[8] | r[7])), lo_clip.eq(r[9] & ~(r[8] & r[7]))]
    out = Signal(signed(8), name=name)
    m.d.sync += out.eq(Mux(in_range & ~hi_clip & ~lo_clip, r[:8],
                           Mux(in_range, Mux(hi_clip, 127, -128), Mux(neg, -128, 127))))
    return out, lat + REQUANT_LATENCY_TAIL


def _lowest_tree(vec, leaf, pick):
    """A priority tree over ``vec`` (lowest set bit first): ``(any, payload)``
    with ``leaf(i)`` the payload of bit ``i`` and ``pick(a_any, a, b, lo,
    mid, hi)`` the payload of ``[lo, hi)`` from its halves' payloads."""
    def tree(lo, hi):
        if hi - lo == 1:
            return vec[lo], leaf(lo)
        mid = lo + pow2ceil(hi - lo) // 2
        if mid >= hi:
            mid = lo + (hi - lo) // 2
        a_any, a = tree(lo, mid)
        b_any, b = tree(mid, hi)
        return a_any | b_any, pick(a_any, a, b, lo, mid, hi)
    return tree(0, len(vec))


def lowest_set(m: Module, vec, name: str):
    """``(any, index)`` of the lowest set bit of ``vec`` (a combinational
    tree: ``log2(len(vec))`` levels of a 2:1 choice)."""
    def pick(a_any, a_idx, b_idx, lo, mid, hi):
        wbits = max(1, (pow2ceil(hi - lo) - 1).bit_length())
        if mid - lo == 1 << (wbits - 1):
            # the upper half's offset is the top index bit: a select, no adder
            lo_w = wbits - 1                # both halves' indices fit below it
            a_lo = Cat(a_idx, Const(0, lo_w))[:lo_w]
            b_lo = Cat(b_idx, Const(0, lo_w))[:lo_w]
            idx = Mux(a_any, Cat(a_lo, Const(0, 1)), Cat(b_lo, Const(1, 1)))
        else:
            idx = Mux(a_any, a_idx, b_idx + (mid - lo))
        return idx[:wbits] if len(idx) > wbits else idx
    w = len(vec)
    a, i = _lowest_tree(vec, lambda _: Const(0, 1), pick)
    anyb = Signal(name=f"{name}_any")
    idx = Signal(range(max(2, w)), name=f"{name}_idx")
    m.d.comb += [anyb.eq(a), idx.eq(i)]
    return anyb, idx


def lowest_flag(m: Module, vec, flags, name: str):
    """``flags[i]`` of the lowest set bit ``i`` of ``vec`` (0 if none):
    :func:`lowest_set`'s tree carrying the flag instead of the index, so
    that no index-addressed select follows the priority tree."""
    _, f = _lowest_tree(vec, lambda i: flags[i],
                        lambda a_any, a_f, b_f, lo, mid, hi: Mux(a_any, a_f, b_f))
    out = Signal(name=f"{name}_flag")
    m.d.comb += out.eq(f & vec.any())
    return out
