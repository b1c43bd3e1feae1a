"""The synthesis flow: generic Yosys numbers and the ECP5 Fmax run."""

import pytest

from elmoe3d.blocks import get_block
from elmoe3d.config import preset
from elmoe3d.sim.synth import synth_block

pytestmark = pytest.mark.synth


def test_generic_and_fmax_on_tiny_pe(tmp_path):
    b = get_block("pe")
    r = synth_block(b.build(preset("tiny")), b.top, tmp_path, fmax=True)
    assert r["cells"] > 100 and r["flip_flops"] > 10 and r["logic_depth"] > 5
    assert r["lut4"] > 0 and r["ff"] > 0
    assert 10 < r["fmax_mhz"] < 1000
    assert (tmp_path / "nextpnr.log").exists()


def test_area_grows_with_lanes(tmp_path):
    b = get_block("pe")
    small = synth_block(b.build(preset("tiny").replace(lanes=4)), b.top, tmp_path / "a")
    big = synth_block(b.build(preset("tiny").replace(lanes=8)), b.top, tmp_path / "b")
    assert 1.6 < big["cells"] / small["cells"] < 2.4
