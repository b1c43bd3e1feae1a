"""Golden integer MoE layer: the specification of the MoE layer datapath.

One token ``x`` (INT8, hidden size ``H``) goes through::

    logits  = Wr @ x                                  INT8 x INT8 -> INT32, E values
    sel     = top-k of logits (DRAFT: allowed experts only), ties -> lower index
    gates   = integer softmax over the selected logits (Q12, see below)
    for every expert j (shared experts first, then sel in rank order):
        g   = rq(Wg_j @ x,  gate_rq[j])               per-channel requantise -> INT8
        u   = rq(Wu_j @ x,  up_rq[j])
        a   = SILU_LUT[g]                             256-entry INT8 table
        h   = rq(a * u,     prod_rq[j])               INT8 x INT8 -> INT16 -> INT8
        d_j = rq(Wd_j @ h,  down_rq[j])               INT8, H values
    acc = sum_j w_j * d_j      (w_j = gate of a routed expert, 2**12 for a shared one)
    y   = rq(acc, out_rq)                             INT8, H values

Requantisation ``rq(v, (M, sh))`` (one multiplier ``M`` in ``0 .. 2**16-1`` and
one shift ``sh`` in ``1 .. 47`` per output channel) is::

    clamp((v * M + 2**(sh - 1)) >> sh, -128, 127)

an arithmetic right shift after adding half an output step: round half up.

Integer softmax over the ``m <= k`` selected logits ``l_0 >= l_1 >= ...``
(``l_0`` is the largest)::

    t_j = min(((l_0 - l_j) * SM_MULT) >> SM_SHIFT, 255)   exponent in 1/16 of an octave
    e_j = EXP2_Q15[t_j & 15] >> (t_j >> 4)                2**(-t_j / 16) in Q15
    w_j = (e_j << 12) // sum(e)                           floor division, Q12

with ``EXP2_Q15[f] = round(2**15 * 2**(-f / 16))``. ``SM_MULT / 2**SM_SHIFT``
is ``16 * log2(e) * s_x * s_r`` (the router's logit scale), so ``e_j`` is
``exp(logit_j - logit_0)`` in fixed point. Gate weights are floored, so they
sum to at most 4096 (1.0) and lose at most ``m`` LSBs.

Precision modes
---------------
FULL
    INT8 weights everywhere, routing over all ``E`` experts.
DRAFT
    Expert projections use the top ``draft_keep`` slice planes of each weight
    with LSB augmentation (:func:`elmoe3d.golden.bitslice.reconstruct` /
    :func:`~elmoe3d.golden.bitslice.dot` in ``Mode.DRAFT``), and routing is
    restricted to an allowed-expert mask (the HB-resident experts): the
    ``k`` highest-ranked *allowed* experts are taken, fewer if fewer are
    allowed (none: the layer output is ``rq(0) = 0`` plus shared experts).

    **The router runs in FULL precision in both modes.** Its weights are
    tiny (``E x H``) and always resident, its ranking decides which experts
    run at all, and with a per-tensor router scale the integer ranking is
    exactly the float ranking; an MSB-only router would change routing
    decisions, not just their precision. The RTL follows the same rule.

The float reference :func:`float_forward` is the same layer on the
de-quantised weights in floating point (exact SiLU, exact softmax, no
requantisation); :func:`make_layer` calibrates every integer scale against it
on random tokens.

All arithmetic is NumPy ``int64`` with explicit rounding and saturation; no
step can overflow for the widths the RTL uses (the tests check the ranges).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..geometry import GATE_FRAC, GATE_ONE, MULT_BITS, SHIFT_BITS, SHIFT_MAX, T_MAX
from . import bitslice as gbs

__all__ = [
    "GATE_FRAC", "GATE_ONE", "EXP2_Q15", "MULT_BITS", "SHIFT_BITS", "SHIFT_MAX", "T_MAX", "Precision",
    "MoELayer", "requant", "route", "gate_weights", "silu_lut", "forward",
    "float_forward", "make_layer", "random_tokens", "random_mask", "analytic_cycles",
    "to_mult_shift", "Result",
]

#: 2**(-f/16) in Q15 for f = 0..15 (the formats' widths, GATE_FRAC, MULT_BITS,
#: ..., are :mod:`elmoe3d.geometry`'s).
EXP2_Q15 = np.array([round(32768 * 2.0 ** (-f / 16)) for f in range(16)], dtype=np.int64)


class Precision:
    """Layer precision modes (values equal the PE mode encoding)."""
    FULL = int(gbs.Mode.FULL)
    DRAFT = int(gbs.Mode.DRAFT)


# ---------------------------------------------------------------------------------------------
# integer primitives


def requant(v, mult, shift) -> np.ndarray:
    """``clamp((v * mult + 2**(shift-1)) >> shift, -128, 127)`` elementwise (int64)."""
    v = np.asarray(v, dtype=np.int64)
    mult = np.asarray(mult, dtype=np.int64)
    shift = np.asarray(shift, dtype=np.int64)
    if np.any(shift < 1) or np.any(shift > SHIFT_MAX):
        raise ValueError(f"Requantisation shift must be in 1..{SHIFT_MAX}")
    if np.any(mult < 0) or np.any(mult >= 1 << MULT_BITS):
        raise ValueError(f"Requantisation multiplier must be in 0..{(1 << MULT_BITS) - 1}")
    r = (v * mult + (np.int64(1) << (shift - 1))) >> shift
    return np.clip(r, -128, 127).astype(np.int64)


def to_mult_shift(ratio) -> tuple[np.ndarray, np.ndarray]:
    """Integer ``(M, sh)`` with ``M / 2**sh ~= ratio``, ``M`` in ``[2**14, 2**15)``
    where the shift range allows (elementwise)."""
    ratio = np.atleast_1d(np.asarray(ratio, dtype=np.float64))
    if np.any(ratio <= 0):
        raise ValueError("Requantisation ratios must be positive")
    e = np.floor(np.log2(ratio)).astype(np.int64)
    sh = np.clip(14 - e, 1, SHIFT_MAX)
    m = np.clip(np.round(ratio * 2.0 ** sh), 0, (1 << MULT_BITS) - 1).astype(np.int64)
    return m, sh.astype(np.int64)


def route(logits, k: int, mask=None) -> list[int]:
    """Top-``k`` expert indices, best first; equal logits rank the lower index
    first; with ``mask`` (bool per expert) only allowed experts are taken
    (fewer than ``k`` when fewer are allowed)."""
    logits = np.asarray(logits, dtype=np.int64)
    E = logits.shape[0]
    allowed = np.ones(E, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    order = sorted(range(E), key=lambda e: (-int(logits[e]), e))
    return [e for e in order if allowed[e]][:k]


def gate_weights(sel_logits, sm_mult: int, sm_shift: int) -> np.ndarray:
    """Integer softmax (Q12) over logits given best first (see module doc)."""
    sel_logits = np.asarray(sel_logits, dtype=np.int64)
    if sel_logits.size == 0:
        return np.zeros(0, dtype=np.int64)
    d = sel_logits[0] - sel_logits
    if np.any(d < 0):
        raise ValueError("Selected logits must be given best first")
    t = np.minimum((d * int(sm_mult)) >> int(sm_shift), T_MAX)
    e = EXP2_Q15[t & 15] >> (t >> 4)
    return (e << GATE_FRAC) // int(e.sum())


def silu_lut(s_g: float, s_a: float) -> np.ndarray:
    """256-entry INT8 SiLU table, index ``q + 128`` for input code ``q``:
    ``clamp(round(silu(q * s_g) / s_a))``."""
    q = np.arange(-128, 128, dtype=np.float64) * s_g
    return np.clip(np.round(q / (1 + np.exp(-q)) / s_a), -128, 127).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# the layer


@dataclass
class MoELayer:
    """One integer MoE layer with its float twin.

    Expert index ``j`` in ``0 .. E-1`` is a routed expert, ``E .. E+S-1`` the
    shared ones. Arrays are ``int64`` holding INT8 weights / requantisation
    parameters; ``*_mult``/``*_shift`` are per output channel.
    """
    hidden: int
    ffn: int
    experts: int
    top_k: int
    shared: int
    slice_bits: int
    draft_keep: int
    router: np.ndarray            # (E, H)
    wg: np.ndarray                # (E+S, I, H)
    wu: np.ndarray                # (E+S, I, H)
    wd: np.ndarray                # (E+S, H, I)
    gate_mult: np.ndarray         # (E+S, I)
    gate_shift: np.ndarray
    up_mult: np.ndarray
    up_shift: np.ndarray
    prod_mult: np.ndarray
    prod_shift: np.ndarray
    down_mult: np.ndarray         # (E+S, H)
    down_shift: np.ndarray
    out_mult: np.ndarray          # (H,)
    out_shift: np.ndarray
    lut: np.ndarray               # (256,) INT8 SiLU table, index q + 128
    sm_mult: int
    sm_shift: int
    scales: dict = field(default_factory=dict)   # float scales for float_forward

    def expert_weights(self, j: int, precision: int):
        """``(Wg, Wu, Wd)`` as the datapath multiplies them in ``precision``."""
        ws = (self.wg[j], self.wu[j], self.wd[j])
        if precision == Precision.DRAFT:
            ws = tuple(gbs.reconstruct(w, self.slice_bits, self.draft_keep, augment=True)
                       for w in ws)
        return ws


@dataclass
class Result:
    """Everything :func:`forward` computed for one token (for debugging)."""
    y: np.ndarray
    logits: np.ndarray
    sel: list
    gates: np.ndarray
    experts_run: list             # expert indices in run order (shared first)
    expert_out: list              # d_j per run expert
    acc: np.ndarray


def _check_precision(precision):
    if precision not in (Precision.FULL, Precision.DRAFT):
        raise ValueError(f"Precision must be FULL (0) or DRAFT (1), not {precision!r}")


def forward(layer: MoELayer, x, precision: int = Precision.FULL, mask=None) -> Result:
    """The integer layer on one INT8 token ``x`` (see module doc).

    ``mask`` (``E`` bools) is only used in DRAFT; FULL routes over all experts.
    """
    _check_precision(precision)
    x = np.asarray(x, dtype=np.int64)
    if x.shape != (layer.hidden,) or x.min() < -128 or x.max() > 127:
        raise ValueError(f"Token must be {layer.hidden} INT8 values")
    logits = layer.router @ x                                   # router always FULL
    use_mask = mask if precision == Precision.DRAFT else None
    sel = route(logits, layer.top_k, use_mask)
    gates = gate_weights(logits[sel], layer.sm_mult, layer.sm_shift)
    run = list(range(layer.experts, layer.experts + layer.shared)) + sel
    weights = [GATE_ONE] * layer.shared + [int(g) for g in gates]
    acc = np.zeros(layer.hidden, dtype=np.int64)
    outs = []
    for j, wj in zip(run, weights):
        wg, wu, wd = layer.expert_weights(j, precision)
        g = requant(wg @ x, layer.gate_mult[j], layer.gate_shift[j])
        u = requant(wu @ x, layer.up_mult[j], layer.up_shift[j])
        a = layer.lut[g + 128]
        h = requant(a * u, layer.prod_mult[j], layer.prod_shift[j])
        d = requant(wd @ h, layer.down_mult[j], layer.down_shift[j])
        outs.append(d)
        acc += wj * d
    y = requant(acc, layer.out_mult, layer.out_shift)
    return Result(y, logits, sel, gates, run, outs, acc)


def _silu(v):
    return v / (1.0 + np.exp(-v))


def float_forward(layer: MoELayer, xf, precision: int = Precision.FULL, mask=None,
                  return_all=False):
    """The same layer in float on de-quantised weights: exact SiLU, exact
    softmax over the top-k logits (renormalised), no requantisation.

    ``xf`` is the float token (``x * s_x`` for an integer token ``x``).
    """
    _check_precision(precision)
    sc = layer.scales
    xf = np.asarray(xf, dtype=np.float64)
    logits = (layer.router * sc["router"]) @ xf
    use_mask = mask if precision == Precision.DRAFT else None
    allowed = np.ones(layer.experts, bool) if use_mask is None else np.asarray(use_mask, bool)
    order = [e for e in sorted(range(layer.experts), key=lambda e: (-logits[e], e)) if allowed[e]]
    sel = order[:layer.top_k]
    z = np.exp(logits[sel] - (logits[sel].max() if sel else 0))
    gates = z / z.sum() if sel else z
    run = list(range(layer.experts, layer.experts + layer.shared)) + sel
    weights = [1.0] * layer.shared + list(gates)
    y = np.zeros(layer.hidden)
    inter = {"g": [], "u": [], "h": [], "d": []}
    for j, wj in zip(run, weights):
        wg, wu, wd = layer.expert_weights(j, precision)
        g = (wg * sc["wg"][j][:, None]) @ xf
        u = (wu * sc["wu"][j][:, None]) @ xf
        h = _silu(g) * u
        d = (wd * sc["wd"][j][:, None]) @ h
        for key, v in zip("guhd", (g, u, h, d)):
            inter[key].append(v)
        y += wj * d
    return (y, inter) if return_all else y


def _quant_rows(w):
    """Per-row symmetric INT8 quantisation: ``(q, scale per row)``."""
    s = np.abs(w).max(axis=-1) / 127.0
    s = np.where(s == 0, 1.0, s)
    return np.clip(np.round(w / s[..., None]), -127, 127).astype(np.int64), s


def make_layer(rng: np.random.Generator, *, hidden=64, ffn=128, experts=16, top_k=4, shared=0,
               slice_bits=4, draft_keep=None, calib_tokens=128, stress=False) -> MoELayer:
    """A random layer with float weights ``N(0, 1/fan_in)``, per-row INT8
    weights (per-tensor for the router, so integer and float rankings agree),
    and every activation scale calibrated on ``calib_tokens`` random float
    tokens through the float reference (max-abs / 127).

    ``stress=True`` perturbs every requantisation multiplier by a random
    factor in [0.5, 4) so that saturation is common (for RTL tests).
    """
    if top_k > experts:
        raise ValueError(f"Top-k must not exceed the expert count {experts}, not {top_k!r}")
    n = gbs.n_planes(slice_bits)
    draft_keep = max(1, n // 2) if draft_keep is None else draft_keep
    H, I, E, S = hidden, ffn, experts, shared
    X = E + S
    wr_f = rng.normal(0, 1 / math.sqrt(H), (E, H))
    sr = np.abs(wr_f).max() / 127
    router = np.clip(np.round(wr_f / sr), -127, 127).astype(np.int64)
    wg, sg = _quant_rows(rng.normal(0, 1 / math.sqrt(H), (X, I, H)))
    wu, su = _quant_rows(rng.normal(0, 1 / math.sqrt(H), (X, I, H)))
    wd, sd = _quant_rows(rng.normal(0, 1 / math.sqrt(I), (X, H, I)))
    # calibrate: float tokens ~ N(0, 1); scale = max-abs / 127 over everything seen
    xs = rng.normal(0, 1, (calib_tokens, H))
    s_x = np.abs(xs).max() / 127
    zeros = np.zeros
    layer = MoELayer(H, I, E, top_k, S, slice_bits, draft_keep, router, wg, wu, wd,
                     *(zeros((X, I), np.int64) for _ in range(6)),
                     zeros((X, H), np.int64), zeros((X, H), np.int64),
                     zeros(H, np.int64), zeros(H, np.int64), zeros(256, np.int64), 0, 1,
                     scales={"x": s_x, "router": sr, "wg": sg, "wu": su, "wd": sd})
    mx = {"g": 0.0, "u": 0.0, "h": 0.0, "d": 0.0, "y": 0.0}
    for xf in xs:
        xq = np.clip(np.round(xf / s_x), -128, 127) * s_x
        y, inter = float_forward(layer, xq, return_all=True)
        for key in "guhd":
            for v in inter[key]:
                mx[key] = max(mx[key], float(np.abs(v).max()))
        mx["y"] = max(mx["y"], float(np.abs(y).max()))
    s_g, s_u, s_h, s_d, s_y = (mx[c] / 127 for c in "guhdy")
    s_a = s_g                                  # SiLU output shares the gate's scale
    layer.scales.update(g=s_g, u=s_u, a=s_a, h=s_h, d=s_d, y=s_y)
    layer.gate_mult, layer.gate_shift = to_mult_shift((s_x * sg / s_g).ravel())
    layer.up_mult, layer.up_shift = to_mult_shift((s_x * su / s_u).ravel())
    layer.prod_mult, layer.prod_shift = to_mult_shift(np.full(X * I, s_a * s_u / s_h))
    layer.down_mult, layer.down_shift = to_mult_shift((s_h * sd / s_d).ravel())
    layer.out_mult, layer.out_shift = to_mult_shift(np.full(H, s_d / (GATE_ONE * s_y)))
    for name, shape in (("gate", (X, I)), ("up", (X, I)), ("prod", (X, I)), ("down", (X, H))):
        for part in ("mult", "shift"):
            setattr(layer, f"{name}_{part}", getattr(layer, f"{name}_{part}").reshape(shape))
    layer.lut = silu_lut(s_g, s_a)
    sm_m, sm_s = to_mult_shift(16 * math.log2(math.e) * s_x * sr)
    layer.sm_mult, layer.sm_shift = int(sm_m[0]), int(sm_s[0])
    if stress:
        for name in ("gate", "up", "prod", "down"):
            m = getattr(layer, f"{name}_mult")
            f = rng.uniform(0.5, 4.0, m.shape)
            setattr(layer, f"{name}_mult",
                    np.clip(np.round(m * f), 0, (1 << MULT_BITS) - 1).astype(np.int64))
        layer.out_mult = np.clip(np.round(layer.out_mult * rng.uniform(0.5, 4.0, H)), 0,
                                 (1 << MULT_BITS) - 1).astype(np.int64)
    return layer


def random_tokens(rng: np.random.Generator, layer: MoELayer, count: int) -> np.ndarray:
    """INT8 tokens from the calibration distribution (``N(0, 1) / s_x``),
    ``(count, H)`` int64."""
    xf = rng.normal(0, 1, (count, layer.hidden))
    return np.clip(np.round(xf / layer.scales["x"]), -128, 127).astype(np.int64)


def random_mask(rng: np.random.Generator, experts: int) -> np.ndarray:
    """An allowed-expert mask: usually about half the experts, sometimes very
    few (fewer than k) or none."""
    r = rng.random()
    if r < 0.05:
        return np.zeros(experts, dtype=bool)
    if r < 0.20:
        m = np.zeros(experts, dtype=bool)
        m[rng.choice(experts, size=rng.integers(1, max(2, experts // 4) + 1), replace=False)] = True
        return m
    return rng.random(experts) < rng.uniform(0.3, 0.9)


def analytic_cycles(*, hidden, ffn, experts, top_k, shared, slice_bits, draft_keep, pes, lanes,
                    precision=Precision.FULL, selected=None) -> float:
    """Ideal cycles per token: slice-plane MACs / (PEs x lanes).

    The router always runs all ``n`` planes; each run expert's three
    projections (``3 H I`` MACs) run ``n`` planes in FULL and ``draft_keep``
    in DRAFT. ``selected`` defaults to ``top_k`` routed experts.
    """
    n = gbs.n_planes(slice_bits)
    planes = n if precision == Precision.FULL else draft_keep
    m = top_k if selected is None else selected
    macs = experts * hidden * n + (shared + m) * 3 * hidden * ffn * planes
    return macs / (pes * lanes)
