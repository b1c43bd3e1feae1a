"""The stream engine's golden model (``golden/ext_stream.py``) on its own:
it agrees with the one-definition layouts (``golden/layout.py``) — PE beats
in the datapath's consumption order, fill beats at ``hb_addr``, the dense
image row by row — and its error, range and burst rules can fail."""

import random

import numpy as np
import pytest

from elmoe3d.config import preset
from elmoe3d.golden import ext_stream as ge
from elmoe3d.golden import layout as L
from elmoe3d.golden.vocab import AxiResp, ExtError, ExtKind, FillKind, HBRegion

pytestmark = [pytest.mark.golden, pytest.mark.ext]

CFGS = {"tiny": preset("tiny"), "default": preset("default"),
        "tiny-s2": preset("tiny").replace(slice_bits=2, hb_words=8192, lpddr_base=0x10000),
        "tiny-B3": preset("tiny").replace(pes=3, hidden=12, ffn=24, experts=6, top_k=2)}


def _expert(cfg, seed):
    rng = np.random.default_rng(seed)
    H, I = cfg.hidden, cfg.ffn
    return [rng.integers(-128, 128, size=s, dtype=np.int64) for s in ((I, H), (I, H), (H, I))]


def _image(cfg, layer, expert, w):
    mem = bytearray(L.lpddr_layout(cfg).base + cfg.lpddr_bytes)
    a = L.lpddr_expert_base(cfg, layer, expert)
    mem[a:a + cfg.expert_bytes] = L.expert_image(cfg, *w)
    return mem, a


@pytest.mark.parametrize("name", sorted(CFGS))
def test_pe_beats_are_the_consumption_order(name):
    cfg = CFGS[name]
    w = _expert(cfg, 1)
    mem, a = _image(cfg, 1, 2, w)
    words = L.expert_slice_words(cfg, *w)
    for mask in range(1, 1 << cfg.planes):
        cmd = ge.command(addr=a, plane_mask=mask, id=3)
        pe, fill, rsp = ge.split_command(cfg, mem, cmd)
        assert fill == [] and rsp == {"id": 3, "error": 0, "resident": 0, "slot": 0}
        # gather beats of B words (fill_words per ExtBeat) in arrival order
        got, cur = [], {}
        for b in pe:
            for i, x in enumerate(b["words"]):
                cur[b["bank"] + i] = x
            if len(cur) == cfg.pes:
                got.append((b["plane"], b["row"], [cur[j] for j in range(cfg.pes)]))
                cur = {}
        planes = [q for q in range(cfg.planes) if (mask >> q) & 1]
        want = [(q, seg.row0 + c, ws) for seg, q, c, ws in L.weight_beats(cfg, words, planes)]
        assert got == want
        assert [b["last"] for b in pe] == [0] * (len(pe) - 1) + [1]


@pytest.mark.parametrize("name", sorted(CFGS))
def test_fill_beats_write_the_hb_slot_image(name):
    cfg = CFGS[name]
    w = _expert(cfg, 2)
    mem, a = _image(cfg, 0, 1, w)
    slot = cfg.tag_slots - 1
    pe, fill, rsp = ge.split_command(cfg, mem, ge.command(addr=a, plane_mask=0, fill=1,
                                                           slot=slot, id=1))
    assert pe == [] and rsp["resident"] == 1 and rsp["error"] == ExtError.OK
    img = np.zeros((cfg.pes, cfg.slot_words), dtype=object)
    seen = set()
    for f in fill[:-1]:
        assert f["kind"] == FillKind.DATA and f["region"] == HBRegion.EXPERT and f["slot"] == slot
        for i, x in enumerate(f["words"]):
            assert (f["bank"] + i, f["offset"]) not in seen
            seen.add((f["bank"] + i, f["offset"]))
            img[f["bank"] + i, f["offset"]] = x
    assert len(seen) == cfg.pes * cfg.slot_words                 # every HB word exactly once
    assert (img == L.hb_slot_image(cfg, *w)).all()
    assert fill[-1] == {"kind": FillKind.COMMIT, "region": HBRegion.EXPERT, "slot": slot,
                        "offset": 0, "bank": 0, "words": [0] * cfg.fill_words}


@pytest.mark.parametrize("name", sorted(CFGS))
def test_dense_rows(name):
    cfg = CFGS[name]
    lay = L.lpddr_layout(cfg)
    rnd = random.Random(0)
    mem = bytearray(rnd.randbytes(lay.base + cfg.lpddr_bytes))
    rb, D, sv = ge.row_bytes(cfg), cfg.dense_words, cfg.slice_vector_bits
    for o0, n in ((0, D), (D - 1, 1), (3, 5)):
        cmd = ge.command(kind=ExtKind.DENSE, addr=lay.dense_base + o0 * rb, length=n, slot=2)
        pe, fill, rsp = ge.split_command(cfg, mem, cmd)
        assert pe == [] and rsp == {"id": 0, "error": 0, "resident": 0, "slot": 2}
        assert fill[-1]["kind"] == FillKind.COMMIT and fill[-1]["region"] == HBRegion.DENSE
        got = {}
        for f in fill[:-1]:
            assert f["region"] == HBRegion.DENSE and f["slot"] == 0
            for i, x in enumerate(f["words"]):
                got[(f["offset"], f["bank"] + i)] = x
        assert sorted(got) == [(o, b) for o in range(o0, o0 + n) for b in range(cfg.pes)]
        for (o, b), x in got.items():
            a = lay.dense_base + (o * cfg.pes + b) * sv // 8
            assert x == int.from_bytes(mem[a:a + sv // 8], "little")


@pytest.mark.parametrize("name", sorted(CFGS))
def test_range_limits(name):
    cfg = CFGS[name]
    lay = L.lpddr_layout(cfg)
    lo, hi, bb, rb = lay.base, lay.base + lay.total_bytes, ge.beat_bytes(cfg), ge.row_bytes(cfg)
    E = ExtKind.EXPERT

    def rng(**kw):
        return ge.check_command(cfg, ge.command(**kw))
    last = hi - cfg.expert_bytes - (hi - cfg.expert_bytes) % bb
    assert rng(kind=E, addr=lo, plane_mask=1) == ExtError.OK
    assert rng(kind=E, addr=last) == ExtError.OK                  # the highest legal expert
    assert rng(kind=E, addr=last + bb) == ExtError.RANGE          # one beat past it
    if bb > 1:
        assert rng(kind=E, addr=lo + 1) == ExtError.RANGE         # not beat aligned
    if lo:
        assert rng(kind=E, addr=lo - bb) == ExtError.RANGE
    d = lay.dense_base
    D = cfg.dense_words
    assert rng(kind=ExtKind.DENSE, addr=d, length=D) == ExtError.OK      # the longest
    assert rng(kind=ExtKind.DENSE, addr=d, length=D + 1) == ExtError.RANGE
    assert rng(kind=ExtKind.DENSE, addr=d + rb, length=D) == ExtError.RANGE
    assert rng(kind=ExtKind.DENSE, addr=d, length=0) == ExtError.RANGE
    assert rng(kind=ExtKind.DENSE, addr=d - rb, length=1) == ExtError.RANGE
    assert rng(kind=ExtKind.DENSE, addr=d + rb // 2 if rb > 1 else d - 1, length=1) \
        == ExtError.RANGE
    # a refused command: PE error beat, ABORT, RANGE, nothing read
    cmd = ge.command(kind=E, addr=hi, plane_mask=1, fill=1, slot=1, id=7)
    pe, fill, rsp = ge.split_command(cfg, bytes(0), cmd)
    assert ge.read_runs(cfg, cmd) == [] and rsp["error"] == ExtError.RANGE
    assert pe == [{"words": [0] * cfg.fill_words, "plane": 0, "row": 0, "bank": 0, "id": 7,
                   "last": 1, "error": 1}]
    assert [f["kind"] for f in fill] == [FillKind.ABORT] and rsp["resident"] == 0


def test_failed_command_ends_its_streams():
    cfg = CFGS["tiny-s2"]                      # n = 4, k = 2
    w = _expert(cfg, 3)
    mem, a = _image(cfg, 1, 0, w)
    cmd = ge.command(addr=a, plane_mask=0b1111, fill=1, slot=2, id=4)
    full = ge.read_beats(cfg, cmd)
    pe0, fill0, _ = ge.split_command(cfg, mem, cmd)
    for e in (0, 1, len(full) // 2, len(full) - 1):
        pe, fill, rsp = ge.split_command(cfg, mem, cmd, (e, ExtError.DECERR))
        assert rsp == {"id": 4, "error": ExtError.DECERR, "resident": 0, "slot": 2}
        assert pe[:-1] == pe0[:e] and pe[-1]["last"] == 1 and pe[-1]["error"] == 1
        assert fill[-1]["kind"] == FillKind.ABORT
        assert fill[:-1] == [f for f in fill0[:-1]][:len(fill) - 1]
    # the PE stream had already ended when the bad beat came: no error beat
    cmd = ge.command(addr=a, plane_mask=0b0001, fill=1, slot=2)
    full = ge.read_beats(cfg, cmd)
    last_pe = max(i for i, b in enumerate(full) if b.to_pe)
    pe, fill, rsp = ge.split_command(cfg, mem, cmd, (len(full) - 1, ExtError.SLVERR))
    assert last_pe < len(full) - 1 and pe[-1]["error"] == 0 and pe[-1]["last"] == 1
    assert rsp["error"] == ExtError.SLVERR and fill[-1]["kind"] == FillKind.ABORT
    with pytest.raises(ValueError, match="not a bad beat"):
        ge.split_command(cfg, mem, cmd, (len(full), ExtError.SLVERR))


def test_beat_error_rules():
    cfg = CFGS["tiny"]
    ok = dict(rid=0, rresp=AxiResp.OKAY, rlast=1, expect_last=True)
    assert ge.beat_error(cfg, **ok) == ExtError.OK
    assert ge.beat_error(cfg, **{**ok, "rid": 1}) == ExtError.PROTOCOL
    assert ge.beat_error(cfg, **{**ok, "rlast": 0}) == ExtError.PROTOCOL         # missing
    assert ge.beat_error(cfg, **{**ok, "expect_last": False}) == ExtError.PROTOCOL  # early
    assert ge.beat_error(cfg, **{**ok, "rresp": AxiResp.EXOKAY}) == ExtError.PROTOCOL
    assert ge.beat_error(cfg, **{**ok, "rresp": AxiResp.SLVERR}) == ExtError.SLVERR
    assert ge.beat_error(cfg, **{**ok, "rresp": AxiResp.DECERR}) == ExtError.DECERR
    assert ge.beat_error(cfg, **{**ok, "rresp": AxiResp.SLVERR, "rid": 2}) == ExtError.PROTOCOL


def _cut(cfg, cmd, size):
    """Bursts of at most ``size`` beats along the read runs, 4 KiB split."""
    bb = ge.beat_bytes(cfg)
    out = []
    for a, n in ge.read_runs(cfg, cmd):
        end = a + n
        while a < end:
            m = min(size * bb, end - a, 4096 - a % 4096)
            out.append((a, m // bb, (bb - 1).bit_length(), 1, 0))
            a += m
    return out


def test_burst_rules_can_fail():
    cfg = CFGS["tiny"]
    a = L.lpddr_expert_base(cfg, 0, 2)                 # 3072 .. 4607: crosses 4 KiB
    cmd = ge.command(addr=a, plane_mask=0b11, fill=1)
    good = _cut(cfg, cmd, 16)
    assert ge.burst_violations(cfg, cmd, good) == []
    assert ge.burst_violations(cfg, cmd, _cut(cfg, cmd, 3)) == []       # any legal cut
    assert "crosses a 4 KiB" in " ".join(ge.burst_violations(
        cfg, cmd, [(4096 - 8, 4, 2, 1, 0)] + good))
    assert "max 16" in " ".join(ge.burst_violations(cfg, cmd, [(a, 17, 2, 1, 0)]))
    assert ge.burst_violations(cfg, cmd, good[:-1])                     # a byte missing
    assert ge.burst_violations(cfg, cmd, good + good[-1:])              # a byte twice
    assert ge.burst_violations(cfg, cmd, good[:3], failed_beat=5) == []
    assert ge.burst_violations(cfg, cmd, good[:1], failed_beat=good[0][1])   # beyond the prefix
    lsb = ge.command(addr=a, plane_mask=0b10)
    assert ge.burst_violations(cfg, lsb, _cut(cfg, cmd, 16))            # reads a plane too many
