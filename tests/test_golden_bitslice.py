"""Golden bit-slice model, exhaustively over all 256 INT8 values for every s and k."""


import numpy as np
import pytest

from elmoe3d.golden import bitslice as g

pytestmark = [pytest.mark.golden, pytest.mark.pe]

ALL = np.arange(-128, 128, dtype=np.int64)
SK = [(s, k) for s in (1, 2, 4) for k in range(1, 8 // s + 1)]


@pytest.mark.parametrize("s", [1, 2, 4])
def test_split_ranges_and_exact_combine(s):
    n = g.n_planes(s)
    planes = g.split(ALL, s)
    assert planes.shape == (n, 256)
    assert planes[0].min() == -(1 << (s - 1)) and planes[0].max() == (1 << (s - 1)) - 1
    for p in range(1, n):
        assert planes[p].min() == 0 and planes[p].max() == (1 << s) - 1
    np.testing.assert_array_equal(g.combine(planes, s), ALL)
    # every (plane tuple) appears exactly once: the slicing is a bijection
    assert len({tuple(c) for c in planes.T}) == 256


@pytest.mark.parametrize("s,k", SK)
def test_reconstruct_truncated_and_augmented(s, k):
    n = g.n_planes(s)
    d = s * (n - k)
    t = g.reconstruct(ALL, s, k, augment=False)
    a = g.reconstruct(ALL, s, k, augment=True)
    if k == n:
        np.testing.assert_array_equal(t, ALL)
        np.testing.assert_array_equal(a, ALL)
        return
    err_t, err_a = t - ALL, a - ALL
    # truncation: floor to the grid, error in [-(2^d - 1), 0], mean -(2^d - 1)/2
    assert err_t.max() == 0 and err_t.min() == -((1 << d) - 1)
    assert err_t.mean() == pytest.approx(-((1 << d) - 1) / 2)
    # augmented: the midpoint, |error| <= 2^(d-1), mean +1/2 (integer midpoint)
    assert np.abs(err_a).max() == 1 << (d - 1)
    assert err_a.mean() == pytest.approx(0.5)
    # and equal to the top-k planes recombined with the dropped planes = 100..0
    planes = g.split(ALL, s)
    kept = sum(planes[p] << (s * (n - 1 - p)) for p in range(k))
    np.testing.assert_array_equal(t, kept)


@pytest.mark.parametrize("s,k", [(s, k) for s, k in SK if k < 8 // s])
def test_msb_plus_lsb_equals_full(s, k):
    rng = np.random.default_rng(s * 10 + k)
    a = rng.integers(-128, 128, size=(64, 256))
    w = np.broadcast_to(ALL, (64, 256))
    full = g.dot(a, w, s, g.Mode.FULL)
    np.testing.assert_array_equal(g.dot(a, w, s, g.Mode.MSB, k) + g.dot(a, w, s, g.Mode.LSB, k), full)
    np.testing.assert_array_equal(full, (a * ALL).sum(-1))


@pytest.mark.parametrize("s", [1, 2, 4])
def test_pe_field_algorithm_matches_spec_exhaustively(s):
    """The PE's field/shift/rounding arithmetic equals the weight-level spec
    for every INT8 weight, every mode and keep, including extreme activations."""
    n = g.n_planes(s)
    planes = g.split(ALL, s)
    for act in (np.full(256, -128), np.full(256, 127), np.arange(256) % 256 - 128):
        for mode in g.Mode:
            keeps = [n] if mode is g.Mode.FULL else range(1, n)
            for keep in keeps:
                pr = list(g.plane_range(s, mode, keep))
                # one weight per "dot product" so every value is checked on its own
                for idx in range(256):
                    got = g.pe_dot([act[idx:idx + 1]] * len(pr),
                                   [planes[q, idx:idx + 1] for q in pr], pr, s, mode, keep)
                    want = int(g.dot(act[idx:idx + 1], ALL[idx:idx + 1], s, mode, keep))
                    assert got == want, (s, mode, keep, int(ALL[idx]))


def test_forced_field_bit_is_the_augmentation_for_s4():
    """For s=4, DRAFT = 8*(2m+1) = 16m+8 exactly (the paper's field trick)."""
    m = g.split(ALL, 4)[0]
    np.testing.assert_array_equal(8 * g.field(m, 0, 4, round_bit=1), 16 * m + 8)
    np.testing.assert_array_equal(g.reconstruct(ALL, 4, 1, augment=True), 16 * m + 8)
    assert g.field_shift(0, 4) == 3 and g.field_shift(1, 4) == 0


def test_acc_width_holds_worst_case():
    for L in (1, 7, 4096):
        w = g.acc_width(L)
        assert 128 * 128 * L <= (1 << (w - 1)) - 1
        assert -(1 << (w - 1)) <= -128 * 127 * L


@pytest.mark.parametrize("bad,exc", [(3, ValueError), (8, ValueError), ("4", TypeError),
                                     (True, TypeError)])
def test_bad_slice_width(bad, exc):
    with pytest.raises(exc, match="Slice width"):
        g.n_planes(bad)


def test_bad_mode_and_keep():
    with pytest.raises(ValueError, match="kept plane count"):
        g.dot([1], [1], 4, g.Mode.DRAFT, 2)
    with pytest.raises(ValueError, match="kept plane count"):
        g.dot([1], [1], 2, g.Mode.LSB, 0)
    with pytest.raises(ValueError, match="PE mode"):
        g.dot([1], [1], 4, 7, 1)
    with pytest.raises(ValueError, match="INT8"):
        g.split([200], 4)


def test_acc_width_counts_the_real_limit():
    """Issue 10: the limit is ceil(max_len / L) chunks of L elements, so the
    width must hold that many elements, not max_len."""
    assert g.max_chunks(7, 4) == 2 and g.acc_width(7, 4) == g.acc_width(8)
    for max_len, L in ((7, 4), (4095, 16), (4096, 16), (1, 1), (100, 32)):
        n = g.max_chunks(max_len, L) * L
        w = g.acc_width(max_len, L)
        assert 128 * 128 * n <= (1 << (w - 1)) - 1 < 128 * 128 * n * 2
    with pytest.raises(ValueError, match="Lane count must be >= 1, not 0"):
        g.max_chunks(8, 0)


S4 = dict(max_len=32, lanes=16)        # 2 chunks per plane at most


@pytest.mark.parametrize("beats,reason", [
    ([(0, 0, 2), (1, 0, 2)], "OK"),                                   # FULL, keep ignored
    ([(0, 0, 1), (0, 0, 3), (1, 0, 0), (1, 0, 1)], "OK"),
    ([(0, 1, 1)], "OK"), ([(1, 3, 1), (1, 3, 1)], "OK"),
    ([(0, 2, 0)], "BAD_KEEP"), ([(1, 3, 2)], "BAD_KEEP"),
    ([(0, 2, 1), (0, 1, 1)], "MODE_CHANGE"), ([(0, 0, 0), (1, 2, 1)], "MODE_CHANGE"),
    ([(1, 0, 0), (0, 0, 0)], "BAD_START"), ([(0, 3, 1)], "BAD_START"),
    ([(0, 0, 0), (1, 0, 0), (0, 0, 0), (1, 0, 0)], "PLANE_ORDER"),   # chunk-major
    ([(0, 2, 1), (1, 2, 1)], "PLANE_ORDER"),                          # past MSB's last plane
    ([(0, 0, 0), (0, 0, 0), (1, 0, 0)], "CHUNK_MISMATCH"),
    ([(0, 0, 0), (1, 0, 0), (1, 0, 0)], "CHUNK_MISMATCH"),
    ([(0, 0, 0)], "MISSING_PLANE"), ([(0, 0, 0), (0, 0, 0)], "MISSING_PLANE"),
    ([(0, 2, 1)] * 3, "TOO_LONG"), ([(0, 0, 0)] * 3 + [(1, 0, 0)] * 3, "TOO_LONG"),
])
def test_check_beats_rules(beats, reason):
    assert g.check_beats(4, beats, **S4).name == reason


def test_check_beats_multi_plane_partial_modes():
    """s = 2: DRAFT/MSB keep 2 span planes 0..1, LSB keep 1 spans 1..3."""
    kw = dict(max_len=8, lanes=4)
    assert g.check_beats(2, [(0, 1, 2), (1, 1, 2)], **kw) is g.SeqError.OK
    assert g.check_beats(2, [(0, 1, 2)], **kw) is g.SeqError.MISSING_PLANE
    assert g.check_beats(2, [(1, 3, 1), (2, 3, 1), (3, 3, 1)], **kw) is g.SeqError.OK
    assert g.check_beats(2, [(1, 3, 1), (3, 3, 1)], **kw) is g.SeqError.PLANE_ORDER
    assert g.check_beats(2, [(1, 3, 1), (2, 3, 1), (2, 3, 1), (3, 3, 1)], **kw) \
        is g.SeqError.CHUNK_MISMATCH


@pytest.mark.parametrize("s", [1, 2, 4])
def test_pe_result_is_the_dot_of_the_row(s):
    """pe_result reassembles the row from well-formed beats and equals dot()
    in every mode (plain baseline: DRAFT = MSB); a broken rule gives error."""
    rng = np.random.default_rng(s)
    n, L, C = g.n_planes(s), 4, 3
    for mode in g.Mode:
        for keep in ([n] if mode is g.Mode.FULL else range(1, n)):
            a = rng.integers(-128, 128, C * L)
            w = rng.integers(-128, 128, C * L)
            planes = g.split(w, s) & ((1 << s) - 1)
            beats = [(a[c * L:(c + 1) * L], planes[q, c * L:(c + 1) * L], q, mode, keep)
                     for q in g.plane_range(s, mode, keep) for c in range(C)]
            v, e, r = g.pe_result(s, beats, max_len=C * L, lanes=L)
            assert (e, r) == (0, g.SeqError.OK) and v == g.dot(a, w, s, mode, keep)
            v2, _, _ = g.pe_result(s, beats, max_len=C * L, lanes=L, augment=False)
            want = g.dot(a, w, s, g.Mode.MSB if mode is g.Mode.DRAFT else mode, keep)
            assert v2 == want
            assert g.pe_result(s, beats, max_len=C * L - L, lanes=L)[:2] == (None, 1)


def test_mac_result():
    a, w = np.full(8, -128), np.full(8, -128)
    assert g.mac_result([(a[:4], w[:4]), (a[4:], w[4:])], max_len=7, lanes=4) == \
        (8 * 16384, 0, g.SeqError.OK)
    assert g.mac_result([(a[:4], w[:4])] * 3, max_len=7, lanes=4)[:2] == (None, 1)


def test_bitfusion_result():
    from elmoe3d.golden import bitfusion as bf
    a = np.arange(8) - 4
    w8 = np.array([1, 2, 3, 4]) & 0xFF
    w4 = bf.pack_w4(np.array([1, -1, 2, -2, 3, -3, 4, -4]))
    assert bf.max_beats(bf.W8, max_len=16, lanes=4) == 4
    assert bf.max_beats(bf.W4, max_len=16, lanes=4) == 2
    v, e, _ = bf.result([(a, w8, bf.W8), (a, w4, bf.W4)], max_len=16, lanes=4)
    assert (v, e) == (None, 1)
    v, e, _ = bf.result([(a, w4, bf.W4)] * 2, max_len=16, lanes=4)
    assert e == 0 and v == 2 * bf.beat_dot(a, w4, bf.W4)
    assert bf.result([(a, w4, bf.W4)] * 3, max_len=16, lanes=4)[1] == 1
