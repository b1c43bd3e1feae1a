"""The golden integer MoE layer on its own: requantisation, routing, integer
softmax, SiLU table, DRAFT precision and routing, overflow bounds, and how
closely the integer layer tracks its float reference."""

import math

import numpy as np
import pytest

from elmoe3d.golden import bitslice as gbs
from elmoe3d.golden import moe_layer as gm

pytestmark = [pytest.mark.golden, pytest.mark.moe]

FULL, DRAFT = gm.Precision.FULL, gm.Precision.DRAFT


@pytest.fixture(scope="module")
def layer():
    return gm.make_layer(np.random.default_rng(7))


def test_requant_rounds_half_up_and_saturates():
    assert gm.requant(5, 1, 1) == 3            # 2.5 -> 3
    assert gm.requant(-5, 1, 1) == -2          # -2.5 -> -2 (half up)
    assert gm.requant(-7, 1, 1) == -3          # -3.5 -> -3
    assert gm.requant(10_000, 1 << 14, 14) == 127
    assert gm.requant(-10_000, 1 << 14, 14) == -128
    rng = np.random.default_rng(0)
    v = rng.integers(-(1 << 22), 1 << 22, 5000)
    mult = rng.integers(0, 1 << 16, 5000)
    sh = rng.integers(1, 48, 5000)
    exp = np.clip([math.floor(int(a) * int(b) / 2 ** int(c) + 0.5) for a, b, c in zip(v, mult, sh)],
                  -128, 127)
    assert np.array_equal(gm.requant(v, mult, sh), exp)


@pytest.mark.parametrize("mult,shift", [(1 << 16, 4), (-1, 4), (3, 0), (3, 48)])
def test_requant_rejects_out_of_range_parameters(mult, shift):
    with pytest.raises(ValueError):
        gm.requant(1, mult, shift)


def test_to_mult_shift_approximates_ratio():
    r = np.array([1e-6, 3.7e-3, 0.5, 1.0, 7.9])
    m, sh = gm.to_mult_shift(r)
    assert np.all(np.abs(m / 2.0 ** sh / r - 1) < 1e-4)
    assert np.all((m >= 1 << 14) & (m < 1 << 15))


def test_route_ties_go_to_the_lower_index_and_mask_is_honoured():
    logits = np.array([5, 7, 7, 3, 7])
    assert gm.route(logits, 2) == [1, 2]
    assert gm.route(logits, 4) == [1, 2, 4, 0]
    mask = np.array([1, 0, 1, 1, 0], bool)
    assert gm.route(logits, 2, mask) == [2, 0]
    assert gm.route(logits, 4, mask) == [2, 0, 3]     # fewer allowed than k
    assert gm.route(logits, 2, np.zeros(5, bool)) == []


def test_exp2_table():
    assert gm.EXP2_Q15[0] == 32768
    assert np.all(np.diff(gm.EXP2_Q15) < 0)
    assert gm.EXP2_Q15[15] == round(32768 * 2 ** (-15 / 16))


def test_gate_weights_are_a_floored_softmax():
    assert list(gm.gate_weights([9], 1, 0)) == [4096]
    assert list(gm.gate_weights([], 1, 0)) == []
    eq = gm.gate_weights([4, 4, 4, 4], 123, 5)
    assert len(set(eq)) == 1 and eq[0] == 1024
    rng = np.random.default_rng(1)
    for _ in range(300):
        m = int(rng.integers(1, 9))
        lg = np.sort(rng.integers(-5000, 5000, m))[::-1]
        mult, shift = int(rng.integers(1, 1 << 16)), int(rng.integers(1, 30))
        g = gm.gate_weights(lg, mult, shift)
        assert 4096 - m <= g.sum() <= 4096
        assert np.all(np.diff(g) <= 0)                      # best first keeps the most weight
        # against the exact softmax in the same exponent units (t/16 octaves, clamped)
        t = np.minimum((lg[0] - lg) * mult / 2 ** shift, 255)
        p = 2.0 ** (-t / 16)
        p /= p.sum()
        assert np.max(np.abs(g / 4096 - p)) < 0.02
    with pytest.raises(ValueError):
        gm.gate_weights([1, 5], 1, 0)


def test_silu_lut_matches_silu(layer):
    q = np.arange(-128, 128)
    sg, sa = layer.scales["g"], layer.scales["a"]
    exact = q * sg / (1 + np.exp(-q * sg)) / sa
    assert layer.lut.shape == (256,) and layer.lut.min() >= -128 and layer.lut.max() <= 127
    assert np.max(np.abs(layer.lut - exact)) <= 0.5 + 1e-9


def test_draft_precision_is_the_augmented_msb_nibble(layer):
    """DRAFT of a 4-bit slice layer equals FULL on weights 16*m + 8 (m = the
    signed MSB nibble), derived here independently of bitslice.reconstruct."""
    assert layer.slice_bits == 4 and layer.draft_keep == 1
    twin = gm.MoELayer(**{**layer.__dict__})
    for name in ("wg", "wu", "wd"):
        w = getattr(layer, name)
        setattr(twin, name, (w >> 4) * 16 + 8)
    rng = np.random.default_rng(3)
    mask = np.ones(layer.experts, bool)
    for x in gm.random_tokens(rng, layer, 20):
        a = gm.forward(layer, x, DRAFT, mask)
        b = gm.forward(twin, x, FULL)
        assert np.array_equal(a.y, b.y) and a.sel == b.sel
        # DRAFT projections are bitslice.dot in DRAFT mode
        assert np.array_equal(gbs.dot(x, layer.wg[a.sel[0]], 4, gbs.Mode.DRAFT, 1),
                              twin.wg[a.sel[0]] @ x)


def test_router_runs_full_precision_in_draft(layer):
    rng = np.random.default_rng(4)
    for x in gm.random_tokens(rng, layer, 10):
        a, b = gm.forward(layer, x, FULL), gm.forward(layer, x, DRAFT, np.ones(layer.experts, bool))
        assert np.array_equal(a.logits, b.logits) and a.sel == b.sel


def test_draft_routing_only_uses_allowed_experts(layer):
    rng = np.random.default_rng(5)
    for x in gm.random_tokens(rng, layer, 300):
        mask = gm.random_mask(rng, layer.experts)
        r = gm.forward(layer, x, DRAFT, mask)
        assert all(mask[e] for e in r.sel)
        assert len(r.sel) == min(layer.top_k, int(mask.sum()))
        # the highest-ranked allowed experts
        allowed = [e for e in gm.route(r.logits, layer.experts) if mask[e]]
        assert r.sel == allowed[:layer.top_k]
        if not r.sel and layer.shared == 0:
            assert not r.y.any()


def test_shared_experts_always_run():
    lay = gm.make_layer(np.random.default_rng(8), hidden=16, ffn=16, experts=8, top_k=2, shared=2)
    x = gm.random_tokens(np.random.default_rng(9), lay, 1)[0]
    r = gm.forward(lay, x, DRAFT, np.zeros(8, bool))
    assert r.sel == [] and r.experts_run == [8, 9]
    assert np.array_equal(r.acc, gm.GATE_ONE * (r.expert_out[0] + r.expert_out[1]))


def test_no_intermediate_exceeds_the_rtl_widths(layer):
    """Logits fit the PE accumulator and the combine sum fits its register
    (hw.moe_layer sizes both from these bounds)."""
    W = gbs.acc_width(max(layer.hidden, layer.ffn))
    accw = ((layer.shared + 1) * gm.GATE_ONE * 128).bit_length() + 1
    rng = np.random.default_rng(6)
    for x in gm.random_tokens(rng, layer, 50):
        r = gm.forward(layer, x)
        assert np.abs(r.logits).max() < 1 << (W - 1)
        assert np.abs(r.acc).max() < 1 << (accw - 1)
        assert r.gates.sum() <= gm.GATE_ONE


def test_make_layer_validates():
    with pytest.raises(ValueError, match="Top-k"):
        gm.make_layer(np.random.default_rng(0), experts=4, top_k=5)
    with pytest.raises(ValueError, match="Precision"):
        gm.forward(gm.make_layer(np.random.default_rng(0), hidden=16, ffn=16, experts=4,
                                 top_k=2), np.zeros(16, np.int64), precision=3)


def _rel_rms(layer, tokens, precision, float_layer=None):
    fl = float_layer or layer
    num = den = 0.0
    cos = []
    for x in tokens:
        yi = gm.forward(layer, x, precision, np.ones(layer.experts, bool)).y * layer.scales["y"]
        yf = gm.float_forward(fl, x * layer.scales["x"])
        num += float(np.sum((yi - yf) ** 2))
        den += float(np.sum(yf ** 2))
        cos.append(float(yi @ yf / (np.linalg.norm(yi) * np.linalg.norm(yf) + 1e-30)))
    return math.sqrt(num / den), min(cos)


def test_integer_layer_tracks_float_reference(capsys):
    """Default-size layers, 500 tokens each: relative RMS error of the FULL
    integer output against the float layer (measured about 0.05, min cosine
    about 0.99); the DRAFT layer (augmented 4-bit weights) against the same
    float FULL layer is reported alongside (about 0.18), and must beat a
    draft made by plain MSB truncation (about 0.37-0.43)."""
    for seed in (0, 1):
        rng = np.random.default_rng(seed)
        lay = gm.make_layer(rng)
        toks = gm.random_tokens(rng, lay, 500)
        err, cmin = _rel_rms(lay, toks, FULL)
        derr, _ = _rel_rms(lay, toks, DRAFT)
        # plain MSB truncation as the draft (no augmentation), same float target
        trunc = gm.MoELayer(**{**lay.__dict__})
        for name in ("wg", "wu", "wd"):
            setattr(trunc, name, (getattr(lay, name) >> 4) << 4)
        terr, _ = _rel_rms(trunc, toks, FULL, float_layer=lay)
        with capsys.disabled():
            print(f"\n[moe golden] seed {seed}: FULL int vs float rel-RMS {err:.4f} "
                  f"(min cosine {cmin:.4f}); vs float FULL: DRAFT (augmented) {derr:.4f}, "
                  f"plain MSB truncation {terr:.4f}")
        assert err < 0.08 and cmin > 0.97
        assert err < derr < terr


def test_analytic_cycles():
    kw = dict(hidden=64, ffn=128, experts=16, top_k=4, shared=0, slice_bits=4, draft_keep=1,
              pes=4, lanes=16)
    assert gm.analytic_cycles(**kw) == 3104
    assert gm.analytic_cycles(**kw, precision=DRAFT) == 1568
    assert gm.analytic_cycles(**{**kw, "shared": 1}) == 3104 + 768
