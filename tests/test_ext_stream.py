"""pytest entry points: the AXI4 stream engine in cocotb with cocotbext-axi's
AxiRamRead as the LPDDR, alone and wired to the HB bank controller."""

import json

import pytest

from elmoe3d.blocks import get_block
from elmoe3d.config import preset
from elmoe3d.golden.hb_map import ExpertLayout, FillKind, bursts, split_command
from elmoe3d.hw.ext_stream import ExtHBPair, ExtStream, ext_params
from elmoe3d.hw.hb_bank import hb_params
from elmoe3d.sim.harness import SimulationFailed, simulate

from conftest import sim_params

pytestmark = pytest.mark.ext

# 4 banks, 16-bit slice vectors, 64-bit AXI: 4 words per beat, 512-byte experts
CASES = [
    pytest.param(dict(pes=4), id="s4-B4-D64"),
    pytest.param(dict(pes=4, slice_bits=2, lanes=8), id="s2-B4-D64"),
]


def _cfg(over):
    return preset("tiny").replace(**over)


def _run(over, simulator, testcase, env=None, ext_over=None):
    b = get_block("ext_stream")
    p = {**ext_params(_cfg(over)), **(ext_over or {})}
    return simulate(b.factory, block="ext_stream", params=p, top=b.top, simulator=simulator,
                    test_module="elmoe3d.tb.test_ext_stream", testcase=testcase, env=env)


def _run_pair(over, simulator, testcase, env=None):
    cfg = _cfg(over)
    p = {"ext": ext_params(cfg), "hb": hb_params(cfg)}
    return simulate(lambda ext, hb: ExtHBPair(ext=ext, hb=hb), block="ext_hb", params=p,
                    top="elmoe3d_ext_hb", simulator=simulator,
                    test_module="elmoe3d.tb.test_ext_stream", testcase=testcase, env=env)


@pytest.mark.parametrize("simulator", sim_params())
@pytest.mark.parametrize("over", CASES)
def test_ext_random(over, simulator):
    env = {"ELMOE_EXT_CMDS": "120" if simulator == "verilator" else "40"}
    _run(over, simulator, "random_commands", env)


@pytest.mark.parametrize("latency", [10, 100])
def test_ext_random_latency(latency):
    _run(CASES[0].values[0], "verilator", "random_commands",
         {"ELMOE_EXT_CMDS": "60", "ELMOE_EXT_LATENCY": str(latency)})


@pytest.mark.parametrize("simulator", sim_params())
def test_ext_error_never_resident(simulator):
    env = {"ELMOE_EXT_CMDS": "120" if simulator == "verilator" else "40"}
    _run_pair(CASES[0].values[0], simulator, "error_never_resident", env)


def test_ext_bandwidth(measured_dir):
    out = measured_dir / "ext_bandwidth.json"
    _run(CASES[0].values[0], "verilator", "bandwidth", {"ELMOE_MEASURE_OUT": str(out)})
    fig = json.loads(out.read_text())["figures"]
    for lat in (10, 50, 100):
        assert fig[f"pe_only_lat{lat}"]["beats_per_cycle_steady"] >= 0.95, fig
        assert fig[f"miss_with_fill_lat{lat}"]["beats_per_cycle_steady"] >= 0.95, fig


@pytest.mark.slow
@pytest.mark.parametrize("outstanding,burst", [(1, 16), (2, 16), (4, 16), (8, 4), (8, 16),
                                               (16, 16)])
def test_ext_bandwidth_sweep(outstanding, burst, measured_dir):
    """Beats/cycle at latencies 10/50/100 against outstanding bursts and burst length."""
    out = measured_dir / f"ext_bandwidth-out{outstanding}-burst{burst}.json"
    _run(CASES[0].values[0], "verilator", "bandwidth", {"ELMOE_MEASURE_OUT": str(out)},
         ext_over={"max_outstanding": outstanding, "max_burst": burst})
    assert json.loads(out.read_text())["figures"]


def test_ext_golden_mutation_fails():
    """The scoreboard can fail: a golden model off by one bit is caught."""
    with pytest.raises(SimulationFailed):
        _run(CASES[0].values[0], "verilator", "random_commands",
             {"ELMOE_EXT_CMDS": "10", "ELMOE_GOLDEN_MUTATION": "1"})


def test_ext_split_golden():
    lay = ExpertLayout(slice_bits=4, lanes=4, banks=4, rows=32, hb_planes=1, data_bits=64,
                       max_burst=16)
    assert lay.fill_words == 4 and lay.plane_beats == 32 and lay.expert_bytes == 512
    b = bursts(lay, 4096 - 3 * 8, 0b11, False)
    assert [x["len"] for x in b] == [3, 16, 13, 16, 16]          # 4 KiB split
    assert b[1]["addr"] == 4096 and b[3]["plane"] == 1
    assert [x["plane"] for x in bursts(lay, 0, 0b10, True)] == [0, 0, 1, 1]
    assert bursts(lay, 0, 0, False) == []
    mem = bytes(range(256)) * 4
    pe, fl, rsp = split_command(lay, mem, {"addr": 0, "planes": 0b11, "fill": 1, "slot": 3,
                                           "id": 5})
    assert len(pe) == 64 and len(fl) == 33 and rsp == {"id": 5, "ok": 1, "resident": 1, "slot": 3}
    assert pe[-1]["last"] == 1 and sum(x["last"] for x in pe) == 1
    assert pe[1]["bank"] == 0 and pe[1]["row"] == 1 and pe[0]["data"][1] == 0x0302
    assert fl[-1]["kind"] == FillKind.COMMIT
    pe, fl, rsp = split_command(lay, mem, {"addr": 0, "planes": 0b11, "fill": 1, "slot": 3,
                                           "id": 5}, error_beat=7)
    assert len(pe) == 7 and len(fl) == 8 and fl[-1]["kind"] == FillKind.ABORT
    assert rsp["ok"] == 0 and rsp["resident"] == 0 and not any(x["last"] for x in pe)


@pytest.mark.parametrize("kw,match", [
    (dict(data_bits=48), "48"), (dict(max_burst=300), "300"), (dict(max_outstanding=0), "0"),
    (dict(banks=3), "3"), (dict(addr_bits=8), "8"), (dict(hb_planes=5), "5"),
])
def test_ext_bad_params(kw, match):
    base = ext_params(_cfg({"pes": 4}))
    with pytest.raises((TypeError, ValueError), match=match):
        ExtStream(**{**base, **kw})


@pytest.mark.xfail(strict=True, reason="issue 10 defect 3: fails on the engine as it is")
@pytest.mark.parametrize("fault", ["slverr", "early_rlast", "missing_rlast", "bad_rid", "exokay",
                                   "range"])
def test_ext_defect3_regression(fault):
    _run(CASES[0].values[0], "verilator", "defect3", {"ELMOE_EXT_DEFECT": fault})
