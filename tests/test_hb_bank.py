"""pytest entry points: HB bank controller in cocotb against the golden HB model."""

import json

import pytest

from elmoe3d.blocks import get_block
from elmoe3d.config import preset
from elmoe3d.golden.hb_map import HBMap, HBModel, FillKind
from elmoe3d.hw.hb_bank import HBBank, hb_params
from elmoe3d.sim.harness import simulate

from conftest import sim_params

pytestmark = pytest.mark.hb

# small banks so that a random run covers every slot many times
CASES = [
    pytest.param(dict(pes=4, axi_data_bits=32), id="s4-B4-fw2"),
    pytest.param(dict(pes=4, slice_bits=2, lanes=8, axi_data_bits=64), id="s2-B4-fw4"),
]


def _params(over):
    return hb_params(preset("tiny").replace(**over))


def _run(over, simulator, testcase, env=None):
    b = get_block("hb_bank")
    return simulate(b.factory, block="hb_bank", params=_params(over), top=b.top,
                    simulator=simulator, test_module="elmoe3d.tb.test_hb_bank",
                    testcase=testcase, env=env)


@pytest.mark.parametrize("simulator", sim_params())
@pytest.mark.parametrize("over", CASES)
def test_hb_random(over, simulator):
    env = {"ELMOE_HB_OPS": "300" if simulator == "verilator" else "80"}
    _run(over, simulator, "random_traffic,torn_expert", env)


def test_hb_bandwidth(measured_dir):
    out = measured_dir / "hb_bandwidth.json"
    _run(CASES[0].values[0], "verilator", "bandwidth", {"ELMOE_MEASURE_OUT": str(out)})
    fig = json.loads(out.read_text())["figures"]
    assert fig["reads_only"]["words_per_cycle_per_bank"] >= 0.95


def test_hb_golden_mutation_fails():
    """The scoreboard can fail: a golden model off by one bit is caught."""
    from elmoe3d.sim.harness import SimulationFailed
    with pytest.raises(SimulationFailed):
        _run(CASES[0].values[0], "verilator", "random_traffic",
             {"ELMOE_HB_OPS": "20", "ELMOE_GOLDEN_MUTATION": "1"})


def test_hb_map_golden():
    m = HBMap(banks=2, words=64, slots=4, planes=2, sv_bits=8)
    assert m.slot_words == 16 and m.rows == 8
    assert m.addr(2, 1, 3) == 2 * 16 + 8 + 3 and m.decode(43) == (2, 1, 3)
    assert m.covered(0) == 0 and m.covered(1) == 0b1 and m.covered(16) == 0b1
    assert m.covered(17) == 0b11 and m.covered(64) == 0b1111
    g = HBModel(m)
    g.fill(FillKind.DATA, 1, 0, 0, 0, [5, 6])
    g.fill(FillKind.COMMIT, 1)
    assert g.valid == 0b10 and g.read(1, 1, 0, 0)[0]["data"] == 6
    assert g.move_boundary(16) == (0b1, 0)
    assert g.move_boundary(17) == (0b10, 0b10) and g.valid == 0
    assert g.kv(True, 0, 16, 9) == (0, 0) and g.kv(False, 0, 16) == (9, 0)
    assert g.kv(True, 0, 17, 9) == (0, 1)
    assert g.read(0, 1, 0, 0)[0]["error"] == 1          # covered slot
    g.fill(FillKind.DATA, 1, 0, 1, 0, [7, 7])              # covered: not written
    assert g.mem[0, 17] == 0
    with pytest.raises(ValueError, match="17"):
        HBMap(banks=2, words=64, slots=17, planes=1, sv_bits=8)


@pytest.mark.parametrize("kw,match", [
    (dict(banks=0), "0"), (dict(fill_words=3), "3"), (dict(planes=3), "3"),
    (dict(words=100), "100"), (dict(slice_bits=3), "3"), (dict(fill_depth=1), "1"),
])
def test_hb_bad_params(kw, match):
    base = dict(banks=4, words=256, slots=8, planes=1, lanes=4, slice_bits=4, fill_words=2)
    with pytest.raises((TypeError, ValueError), match=match):
        HBBank(**{**base, **kw})
