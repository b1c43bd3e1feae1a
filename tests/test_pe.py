"""pytest entry points: the bit-slice PE and its baselines in cocotb."""

import pytest

from elmoe3d.blocks import get_block
from elmoe3d.config import preset
from elmoe3d.sim.harness import simulate

from conftest import sim_params

pytestmark = pytest.mark.pe

# (block, overrides of the default config) -- default size plus s=2 and s=1
CASES = [
    pytest.param("pe", {}, id="pe-s4-L16"),
    pytest.param("pe", {"slice_bits": 2, "lanes": 8, "max_len": 512}, id="pe-s2-L8"),
    pytest.param("pe", {"slice_bits": 1, "lanes": 4, "max_len": 64}, id="pe-s1-L4"),
    pytest.param("pe_plain", {"slice_bits": 2, "lanes": 8, "max_len": 512}, id="plain-s2-L8"),
    pytest.param("mac_int8", {"lanes": 8, "max_len": 512}, id="mac-L8"),
    pytest.param("bitfusion", {"lanes": 4, "max_len": 256}, id="bitfusion-L4"),
]


def _params(block, over):
    b = get_block(block)
    # block-level parameters (the PE is a leaf component with explicit
    # parameters; a whole-tile Config with these lane/slice overrides need not fit HB)
    p = {**b.params(preset("default")), **{k: v for k, v in over.items()
                                           if k in b.params(preset("default"))}}
    p["kind"] = {"mac_int8": "int8", "bitfusion": "bitfusion"}.get(block, "bitslice")
    return b, p


def _factory(block):
    b = get_block(block)
    return lambda kind, **kw: b.factory(**kw)


@pytest.mark.parametrize("simulator", sim_params())
@pytest.mark.parametrize("block,over", CASES)
def test_pe_random(block, over, simulator):
    b, p = _params(block, over)
    simulate(_factory(block), block=block, params=p, top=b.top, simulator=simulator,
             test_module="elmoe3d.tb.test_pe", testcase="random_vectors,too_long")


@pytest.mark.parametrize("simulator", sim_params())
@pytest.mark.parametrize("block,over", CASES[:3] + CASES[4:])
def test_pe_throughput(block, over, simulator, measured_dir):
    b, p = _params(block, over)
    out = measured_dir / f"throughput-{block}-{'-'.join(f'{k}{v}' for k, v in over.items()) or 'default'}-{simulator}.json"
    simulate(_factory(block), block=block, params=p, top=b.top, simulator=simulator,
             test_module="elmoe3d.tb.test_pe", testcase="throughput",
             env={"ELMOE_MEASURE_OUT": str(out)})
    import json
    fig = json.loads(out.read_text())["figures"]
    for name, f in fig.items():
        assert f["input_cycles"] == f["beats"], name
