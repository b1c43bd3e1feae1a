"""Elaboration-time parameter checks and Verilog generation of every block."""

import pytest

from elmoe3d.blocks import blocks
from elmoe3d.config import PRESETS, Config, preset
from elmoe3d.hw.pe import BitSlicePE, Int8MacVector

pytestmark = pytest.mark.pe


@pytest.mark.parametrize("kw,exc,match", [
    (dict(lanes=0), ValueError, "Lane count must be in 1..1024, not 0"),
    (dict(lanes=2.0), TypeError, "Lane count must be an integer, not 2.0"),
    (dict(slice_bits=3), ValueError, "Slice width must be 1, 2 or 4, not 3"),
    (dict(slice_bits="4"), TypeError, "Slice width must be an integer"),
    (dict(max_len=0), ValueError, "Maximum dot-product length must be >= 1, not 0"),
    (dict(augment=1), TypeError, "augment must be a bool"),
])
def test_pe_bad_params(kw, exc, match):
    with pytest.raises(exc, match=match):
        BitSlicePE(**kw)


def test_mac_bad_params():
    with pytest.raises(ValueError, match="Lane count"):
        Int8MacVector(lanes=-1)
    with pytest.raises(ValueError, match="Adder levels per pipeline stage must be in 1..16, not 0"):
        Int8MacVector(levels_per_stage=0)
    from elmoe3d.hw.bitfusion import BitFusionPE
    with pytest.raises(TypeError, match="Maximum dot-product length must be an integer"):
        BitFusionPE(max_len=1.5)


@pytest.mark.parametrize("kw,exc,match", [
    (dict(top_k=17), ValueError, "Top-k must not exceed the expert count 16, not 17"),
    (dict(hb_words=1000), ValueError, "power of two, not 1000"),
    (dict(slice_bits=8), ValueError, "Slice width must be 1, 2 or 4, not 8"),
    (dict(experts=200), ValueError, "does not fit in expert id width"),
    (dict(axi_data_bits=16), ValueError,
     "AXI data width 16 is narrower than one 64-bit slice vector"),
    (dict(lpddr_bytes_per_cycle=0), ValueError, "LPDDR bytes per cycle must be >= 1, not 0"),
    (dict(lpddr_bytes_per_cycle=9), ValueError,
     "LPDDR bytes per cycle 9 exceeds one 64-bit AXI beat"),
    (dict(lpddr_bytes_per_cycle=2.5), TypeError, "LPDDR bytes per cycle must be an integer"),
])
def test_config_validation(kw, exc, match):
    with pytest.raises(exc, match=match):
        Config(**kw)


def test_lpddr_bandwidth():
    """LPDDR bandwidth is one AXI beat per cycle unless set (no RTL parameter:
    left out of ``to_dict`` at its default, so build keys stay as they were);
    the geometry shows it, and the system model's tile rates read it."""
    from elmoe3d.sim.perf import rtl_compare as rc
    d = preset("default")
    assert d.lpddr_rate == 8 and d.geometry()["lpddr_bytes_per_cycle"] == 8
    assert "lpddr_bytes_per_cycle" not in d.to_dict()
    slow = d.replace(lpddr_bytes_per_cycle=2)
    assert slow.lpddr_rate == 2 and slow.geometry()["lpddr_bytes_per_cycle"] == 2
    assert Config(**slow.to_dict()) == slow
    for cfg, rate in ((d, 8), (slow, 2)):
        assert rc.tile_run(cfg, "t", 1, "AR", [], dict.fromkeys(rc.COUNTERS, 0))[
            "rates"]["lpddr_bytes_per_cycle"] == rate
    # a beat narrower than the AXI width (halved until it divides the banks) bounds it
    assert preset("tiny").lpddr_rate == 4


def test_presets():
    assert set(PRESETS) >= {"tiny", "default", "fpga", "paper"}
    with pytest.raises(ValueError, match="Unknown configuration preset 'huge'"):
        preset("huge")
    assert preset("default").planes == 2


def test_pe_accumulator_sizing():
    """One formula: the PE, its result type and Config agree; the limit is in
    chunks per plane (ceil(max_len / L)), and the width holds that many
    chunks of L elements, also when L does not divide max_len."""
    from elmoe3d.golden.bitslice import acc_width
    from elmoe3d.hw.vocab import vocab
    pe = BitSlicePE(lanes=16, max_len=4096)
    assert pe.acc_width == 28 and pe.max_chunks == 256
    assert len(pe.o.payload.value) == 28
    cfg = preset("default")
    from amaranth.lib import data
    assert cfg.acc_bits == pe.acc_width == data.Layout.cast(vocab(cfg).PEResult)["value"].width
    pe7 = BitSlicePE(lanes=4, max_len=7)
    assert pe7.max_chunks == 2 and pe7.acc_width == acc_width(8) == 19
    assert BitSlicePE(lanes=16, max_len=4095).acc_width == 28


def test_every_block_has_distinct_top_and_elaborates():
    from amaranth.back import verilog
    tops = [b.top for b in blocks().values()]
    assert len(set(tops)) == len(tops)
    cfg = preset("tiny")
    for name in ("pe", "pe_plain", "mac_int8", "bitfusion"):
        b = blocks()[name]
        text = verilog.convert(b.build(cfg), name=b.top, emit_src=False)
        assert f"module {b.top}(" in text
