"""Config geometry and the one-definition layouts (``golden/layout.py``)."""

import numpy as np
import pytest

from elmoe3d.config import PRESETS, Config, preset
from elmoe3d.golden import bitslice as gbs
from elmoe3d.golden import layout as L

pytestmark = pytest.mark.golden

SMALL = {"tiny": preset("tiny"),
         "tiny-s2": preset("tiny").replace(slice_bits=2, hb_words=8192),
         "tiny-s1": preset("tiny").replace(slice_bits=1, lanes=8, hb_words=16384),
         "fpga": preset("fpga")}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_fits(name):
    c = preset(name)
    g = c.geometry()
    assert g["dense_words"] + c.tag_slots * c.slot_words + g["free_words"] == c.hb_words
    assert g["free_words"] >= 0
    assert c.slot_words == c.hb_planes_eff * 3 * c.hidden * c.ffn // (c.pes * c.lanes)


def test_impossible_geometry_names_both_sizes():
    with pytest.raises(ValueError, match=r"An expert needs 384 words per HB bank.*"
                                         r"6144 words and the dense region 1938, 8082 in all, "
                                         r"but an HB bank holds 4096 words"):
        Config(hb_words=4096)


@pytest.mark.parametrize("kw,match", [
    (dict(hidden=72), "Hidden size 72 must be a multiple of the lane count 16"),
    (dict(experts=18), "Routed expert count 18 must be a multiple of the PE count 4"),
    (dict(max_len=100), "shorter than the longest projection"),
    (dict(lanes=1, slice_bits=4, hidden=4, ffn=8, experts=4),
     "slice vector .* must be a power of two of at least 8 bits"),
    (dict(layers=65), "Layer count 65 does not fit in layer id width 6"),
    (dict(lpddr_base=100), "4 KiB aligned"),
    (dict(hb_planes=2), r"HB planes per expert must be in 1..1, not 2"),
])
def test_cross_block_checks(kw, match):
    with pytest.raises(ValueError, match=match):
        Config(**kw)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_hb_map_is_a_bijection_above_the_dense_region(name):
    c = SMALL[name]
    seen = set()
    for s in range(c.tag_slots):
        for q in range(c.hb_planes_eff):
            for r in range(c.expert_rows):
                a = L.hb_addr(c, s, q, r)
                assert L.hb_decode(c, a) == (s, q, r)
                seen.add(a)
    assert seen == set(range(c.dense_words, c.dense_words + c.tag_slots * c.slot_words))
    with pytest.raises(ValueError, match="outside the HB map"):
        L.hb_addr(c, c.tag_slots, 0, 0)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_slot_reads_are_contiguous_in_consumption_order(name):
    """A DRAFT reads a whole slot in address order and gets the weight beats
    in the order the datapath consumes them (segment, plane, chunk)."""
    c = SMALL[name]
    order = [(seg.row0 + ch, q) for seg in L.segments(c) for q in range(c.hb_planes_eff)
             for ch in range(seg.chunks)]
    addrs = [L.hb_addr(c, 3, q, r) for r, q in order]
    assert addrs == list(range(addrs[0], addrs[0] + c.slot_words))


def test_kv_covers_highest_slots_first():
    c = preset("default")
    prev = 0
    for kv in range(0, L.kv_limit(c) + 1, 97):
        m = L.slot_covered_mask(c, kv)
        assert m & prev == prev                      # monotone
        # covered slots are a top run: m is of the form 1..10..0 from the top
        top = (1 << c.tag_slots) - 1
        assert m == 0 or (m | (m - 1)) & top == top or m == top
        prev = m
    assert L.slot_covered_mask(c, L.kv_limit(c)) == (1 << c.tag_slots) - 1
    free = c.geometry()["free_words"]
    assert L.slot_covered_mask(c, free) == 0
    assert L.slot_covered_mask(c, free + 1) == 1 << (c.tag_slots - 1)
    with pytest.raises(ValueError, match="KV region"):
        L.slot_covered_mask(c, L.kv_limit(c) + 1)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_lpddr_runs_cover_every_byte_once(name):
    c = SMALL[name]
    n = c.planes
    for mask in range(1, 1 << n):
        covered = np.zeros(c.expert_bytes, dtype=np.int64)
        for off, ln, seg, q in L.lpddr_plane_runs(c, mask):
            covered[off:off + ln] += 1
        want_bytes = bin(mask).count("1") * c.expert_bytes // n
        assert covered.max() == 1 and covered.sum() == want_bytes


@pytest.mark.parametrize("name", sorted(SMALL))
def test_images_agree_with_the_beat_order(name):
    """LPDDR image, HB slot image and weight_beats describe the same words,
    and the beats reassemble the INT8 weights exactly."""
    c = SMALL[name]
    rng = np.random.default_rng(1)
    H, I, B, Ln, s = c.hidden, c.ffn, c.pes, c.lanes, c.slice_bits
    wg, wu = rng.integers(-128, 128, (2, I, H))
    wd = rng.integers(-128, 128, (H, I))
    words = L.expert_slice_words(c, wg, wu, wd)
    img = L.expert_image(c, wg, wu, wd)
    slot = L.hb_slot_image(c, wg, wu, wd)
    svb = c.slice_vector_bits // 8
    mats = {L.Proj.GATE: wg, L.Proj.UP: wu, L.Proj.DOWN: wd}
    rebuilt = {p: np.zeros_like(w) for p, w in mats.items()}
    mask = (1 << s) - 1
    for seg, q, ch, ws in L.weight_beats(c, words, range(c.planes)):
        for b, wv in enumerate(ws):
            r = seg.row0 + ch
            i = L.lpddr_word_index(c, q, r, b)
            assert int.from_bytes(img[i * svb:(i + 1) * svb], "little") == wv
            if q < c.hb_planes_eff:
                assert slot[b, L.hb_addr(c, 0, q, r) - c.expert_base] == wv
            row = seg.group * B + b
            for lane in range(Ln):
                v = (wv >> (lane * s)) & mask
                if q == 0 and v >> (s - 1):
                    v -= 1 << s
                rebuilt[seg.proj][row, ch * Ln + lane] += v << (s * (c.planes - 1 - q))
    for p in mats:
        assert np.array_equal(rebuilt[p], mats[p])


def test_param_record_roundtrip_and_limits():
    r = L.pack_param_record(0xBEEF, 47)
    assert L.unpack_param_record(r) == L.ParamRecord(0xBEEF, 47)
    with pytest.raises(ValueError, match="do not fit a record"):
        L.pack_param_record(1 << 16, 1)


def test_planes_for_modes():
    c = preset("tiny").replace(slice_bits=2, hb_words=8192)
    assert list(L.planes_for(c, gbs.Mode.FULL)) == [0, 1, 2, 3]
    assert list(L.planes_for(c, gbs.Mode.DRAFT)) == [0, 1]
    assert list(L.planes_for(c, gbs.Mode.LSB)) == [2, 3]


def test_lpddr_image_places_experts_and_dense_rows():
    """The LPDDR window: an expert's image at its base, the dense image row
    by row, bank fastest, at dense_base; a dense image of the wrong shape is
    refused, naming the shape."""
    cfg = preset("tiny")
    g = np.random.default_rng(5)
    H, I = cfg.hidden, cfg.ffn
    w = [g.integers(-128, 128, size=s, dtype=np.int64) for s in ((I, H), (I, H), (H, I))]
    wb = cfg.slice_vector_bits // 8
    dense = g.integers(0, 1 << (8 * wb), size=(cfg.pes, cfg.dense_words), dtype=np.uint64)
    mem = L.lpddr_image(cfg, {(1, 3): w}, dense)
    lay = L.lpddr_layout(cfg)
    assert len(mem) == lay.base + lay.total_bytes
    a = L.lpddr_expert_base(cfg, 1, 3)
    assert bytes(mem[a:a + cfg.expert_bytes]) == L.expert_image(cfg, *w)
    assert not any(mem[L.lpddr_expert_base(cfg, 0, 0):a])       # experts left out are zero
    r, b = cfg.dense_words - 1, cfg.pes - 1
    o = lay.dense_base + (r * cfg.pes + b) * wb
    assert int.from_bytes(mem[o:o + wb], "little") == int(dense[b, r])
    with pytest.raises(ValueError, match=r"dense image shape \(1,"):
        L.lpddr_image(cfg, {}, dense[:1])


@pytest.mark.parametrize("name,over", [("tiny", {}), ("default", {}),
                                       ("tiny", {"slice_bits": 2, "hb_words": 8192})])
def test_plane_group_slots(name, over):
    """A slot holds one plane group: the MSB group at :func:`hb_addr`'s
    offsets, the LSB group (planes ``k .. n-1``) segment-interleaved the same
    way; each slot image read from offset 0 is its planes in the order a
    datapath consumes them (:func:`weight_beats`), bank by bank."""
    cfg = preset(name).replace(**over)
    rng = np.random.default_rng(3)
    H, I = cfg.hidden, cfg.ffn
    wg, wu = rng.integers(-127, 128, (I, H)), rng.integers(-127, 128, (I, H))
    wd = rng.integers(-127, 128, (H, I))
    words = L.expert_slice_words(cfg, wg, wu, wd)
    k, n = cfg.hb_planes_eff, cfg.planes
    for r_ in range(cfg.expert_rows):
        assert L.group_offset(cfg, 0, k - 1, r_) == L.hb_addr(cfg, 0, k - 1, r_) - cfg.expert_base
    for group, planes in ((0, range(k)), (1, range(k, n))):
        img = L.hb_slot_image(cfg, wg, wu, wd, group)
        beats = list(L.weight_beats(cfg, words, planes))
        for b in range(cfg.pes):
            assert [int(x) for x in img[b, :len(beats)]] == [ws[b] for *_, ws in beats]
    assert L.lsb_group_fits(cfg)
    with pytest.raises(ValueError, match="group"):
        L.group_planes(cfg, 2)


def test_lsb_group_that_does_not_fit():
    """With more LSB planes than a slot holds, no slot holds the LSB group."""
    cfg = preset("tiny").replace(slice_bits=2, hb_planes=1, hb_words=8192)    # n = 4, k = 1
    assert not L.lsb_group_fits(cfg)
    with pytest.raises(ValueError, match="does not fit a slot"):
        L.group_planes(cfg, 1)
