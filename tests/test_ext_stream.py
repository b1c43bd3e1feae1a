"""pytest entry points: the AXI4 stream engine in cocotb with cocotbext-axi's
AxiRamRead as the LPDDR (``tb/test_ext_stream.py``), its formal checks
(``tb/formal/ext_stream.py``) and the engine wired to the HB controller
(``tb/ext_hb_pair.py``)."""

import json

import pytest

from elmoe3d.blocks import get_block
from elmoe3d.config import preset
from elmoe3d.hw.ext_stream import ExtStream, ext_params
from elmoe3d.sim.harness import SimulationFailed, simulate

from conftest import sim_params

pytestmark = pytest.mark.ext

#: Geometries: `default` and `tiny` (users build these), one with 4 planes
#: (2 in HB, interleaved) and the LPDDR window not at 0, and one with 3 banks
#: (a dense row of 6 bytes: the row offset needs a division).
CFGS = {
    "default": preset("default"),
    "tiny": preset("tiny"),
    "tiny-s2": preset("tiny").replace(slice_bits=2, hb_words=8192, lpddr_base=0x10000),
    "tiny-B3": preset("tiny").replace(pes=3, hidden=12, ffn=24, experts=6, top_k=2),
}

#: Bursts per default run: the volume bar (10,000 random AXI bursts at
#: `default` and at `tiny`) on Verilator, a short Icarus run at `tiny` and
#: `tiny-B3`; the longer Icarus runs are `slow` (Icarus runs this design
#: about 10x slower than Verilator).
#: `tiny-s2` (4 planes) is the geometry whose 16 plane masks fill the
#: `plane_mask` coverpoint.
VOLUME = {("verilator", "default"): 10_000, ("verilator", "tiny"): 10_000,
          ("verilator", "tiny-s2"): 1_000,
          ("icarus", "tiny"): 300, ("icarus", "tiny-B3"): 300}
VOLUME_SLOW = {("icarus", "tiny-s2"): 2_000, ("icarus", "tiny-B3"): 2_000,
               ("icarus", "default"): 500, ("verilator", "tiny-s2"): 5_000}


def _run(name, simulator, testcase, env=None, cfg=None):
    b = get_block("ext_stream")
    cfg = cfg or CFGS[name]
    return simulate(b.factory, block="ext_stream", params=b.params(cfg), top=b.top,
                    simulator=simulator, test_module="elmoe3d.tb.test_ext_stream",
                    testcase=testcase, env=env)


def _sim_param(sim):
    return [p for p in sim_params() if p.values[0] == sim][0]


@pytest.mark.parametrize("simulator,name", [
    pytest.param(*k, id=f"{k[0]}-{k[1]}", marks=_sim_param(k[0]).marks) for k in VOLUME])
def test_ext_random(simulator, name):
    """Random commands until the burst target is met (faults, pauses,
    back-pressure, refused commands)."""
    _run(name, simulator, "random_commands",
         {"ELMOE_EXT_MIN_BURSTS": str(VOLUME[(simulator, name)]), "ELMOE_EXT_CMDS": "20"})


@pytest.mark.slow
@pytest.mark.parametrize("simulator,name", [
    pytest.param(*k, id=f"{k[0]}-{k[1]}", marks=_sim_param(k[0]).marks) for k in VOLUME_SLOW])
def test_ext_random_long(simulator, name):
    """The longer random runs (Icarus at three geometries, Verilator at tiny-s2)."""
    _run(name, simulator, "random_commands",
         {"ELMOE_EXT_MIN_BURSTS": str(VOLUME_SLOW[(simulator, name)]), "ELMOE_EXT_CMDS": "20"})


@pytest.mark.parametrize("simulator,name", [
    pytest.param("verilator", "default", id="verilator-default",
                 marks=_sim_param("verilator").marks),
    pytest.param("icarus", "tiny", id="icarus-tiny", marks=_sim_param("icarus").marks)])
def test_ext_stock_axi_ram(simulator, name):
    """cocotbext-axi's stock AxiRamRead with pause generators on AR and R."""
    _run(name, simulator, "stock_axi_ram", {"ELMOE_EXT_CMDS": "30"})


@pytest.mark.parametrize("simulator", sim_params())
@pytest.mark.parametrize("name", ["tiny", "default", "tiny-s2", "tiny-B3"])
def test_ext_directed(name, simulator):
    """Every fault at the first, a middle and the last burst; every range
    limit and one past it; the longest commands; bounded response wait."""
    if simulator == "icarus" and name not in ("tiny", "tiny-B3"):
        pytest.skip("Icarus runs the directed test at tiny and tiny-B3 only (wall time)")
    _run(name, simulator, "directed")


DEFECT3_FAULTS = ("slverr", "decerr", "early_rlast", "missing_rlast", "bad_rid", "exokay",
                  "range")


@pytest.mark.parametrize("simulator", sim_params())
def test_ext_defect3_regression(simulator):
    """Issue 10 defect 3, every reproducer in one run: SLVERR, DECERR, an early
    and a missing RLAST, an unexpected RID, EXOKAY on a normal read, a command
    outside the LPDDR window. On the engine before the rework each of these
    failed (commit 5683fc1: strict xfail, every case failing); now they pass."""
    _run("tiny", simulator, "defect3", {"ELMOE_EXT_DEFECT": ",".join(DEFECT3_FAULTS)})


#: Latencies stated in hw/ext_stream.py and docs/blocks/ext_stream.md: the
#: first AR handshake after the command's (always-ready slave), a PE beat
#: after its R handshake (whole-expert commands; measured, then frozen here).
FIRST_AR_CYCLES = {"default": 16, "tiny": 19}
PE_AFTER_R_CYCLES = 4


@pytest.mark.parametrize("name", ["default", "tiny"])
def test_ext_bandwidth(name, measured_dir):
    """R beats per cycle at read latencies 10/50/100 (bus peak 1 beat/cycle)."""
    out = measured_dir / ("ext_bandwidth.json" if name == "default"
                          else f"ext_bandwidth-{name}.json")
    _run(name, "verilator", "bandwidth", {"ELMOE_MEASURE_OUT": str(out)})
    fig = json.loads(out.read_text())["figures"]
    for lat in (10, 50, 100):
        for kind in ("full", "full_with_fill"):
            assert fig[f"{kind}_lat{lat}"]["beats_per_cycle_steady"] >= 0.99, fig
        # the latencies stated in the docstring and docs
        assert fig[f"full_lat{lat}"]["first_ar_after_cmd"] == FIRST_AR_CYCLES[name], fig
        assert fig[f"full_lat{lat}"]["pe_beat_after_r"] == PE_AFTER_R_CYCLES, fig


@pytest.mark.slow
@pytest.mark.parametrize("outstanding,burst", [(1, 16), (2, 16), (4, 16), (8, 4), (8, 16),
                                               (16, 16), (16, 64)])
def test_ext_bandwidth_sweep(outstanding, burst, measured_dir):
    """Beats/cycle at latencies 10/50/100 against outstanding bursts and burst length."""
    out = measured_dir / f"ext_bandwidth-out{outstanding}-burst{burst}.json"
    cfg = CFGS["default"].replace(axi_outstanding=outstanding, axi_max_burst=burst)
    _run("default", "verilator", "bandwidth", {"ELMOE_MEASURE_OUT": str(out)}, cfg=cfg)
    assert json.loads(out.read_text())["figures"]


def test_ext_golden_mutation_fails():
    """The scoreboard can fail: a golden model off by one bit is caught."""
    with pytest.raises(SimulationFailed):
        _run("tiny", "verilator", "random_commands",
             {"ELMOE_EXT_CMDS": "10", "ELMOE_GOLDEN_MUTATION": "1"})


def test_ext_bad_params():
    with pytest.raises(TypeError, match="needs a Config, not"):
        ExtStream({"pes": 4})
    assert ext_params(preset("tiny"))["config"]["pes"] == 2


# -- formal (SymbiYosys BMC on tb/formal/ext_stream.FORMAL_CONFIG) ------------------------

from elmoe3d.sim.formal import formal_available, run_sby  # noqa: E402
from elmoe3d.tb.formal.ext_stream import ExtStreamFormal  # noqa: E402

_fok, _fwhy = formal_available()

#: BMC depths in clock cycles. A command's first AR leaves 8 cycles after it
#: is accepted; at depth 24 the solver reaches refused, dense and
#: partly-read expert commands with faults on any beat, and two bursts in
#: flight (the `Cover`s say so).
FORMAL_DEPTH = 24


@pytest.mark.formal
@pytest.mark.skipif(not _fok, reason=_fwhy)
@pytest.mark.parametrize("single", [False, True], ids=["free", "single"])
def test_ext_formal_bmc(single):
    r = run_sby(ExtStreamFormal(single=single), name=f"ext_stream_bmc_{single}",
                depth=FORMAL_DEPTH)
    assert r.status == "PASS"


@pytest.mark.formal
@pytest.mark.skipif(not _fok, reason=_fwhy)
@pytest.mark.parametrize("bug,single", [("hide_rlast", True), ("outstanding", False)])
def test_ext_formal_catches_bug(bug, single):
    r = run_sby(ExtStreamFormal(single=single, bug=bug), name=f"ext_stream_bug_{bug}",
                depth=FORMAL_DEPTH, expect="FAIL")
    assert r.status == "FAIL"
