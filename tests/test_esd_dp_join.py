"""pytest entry point: the Elastic-SD controller + real tag unit + token feed
+ real batched MoE datapath (``tb/esd_dp_join.EsdDpJoin``) decoding Elastic-SD
and AR rounds at ``tiny``: the trace equals the golden control sequence event
for event and every layer output the golden batched layer bit for bit
(``tb/test_esd_dp_join.py``)."""

import json

import pytest

from elmoe3d.config import Config, preset
from elmoe3d.sim.harness import SimulationFailed, simulate

pytestmark = pytest.mark.tile

TB = "elmoe3d.tb.test_esd_dp_join"
#: the datapath's C++ takes minutes at Verilator's -Os (as tests/test_moe_layer.py)
BUILD = {"extra_build_args": ["-CFLAGS", "-O0"], "icarus_always_comb": True}


def _factory(config):
    from elmoe3d.tb.esd_dp_join import EsdDpJoin
    return EsdDpJoin(Config(**config))


def _run(tmp_path, cfg, env=None, seed=1):
    out = tmp_path / "join.json"
    e = {"ELMOE_JOIN_OUT": str(out)}
    e.update(env or {})
    simulate(_factory, block="esd_dp_join", params={"config": cfg.to_dict()},
             top="elmoe3d_esd_dp_join", simulator="verilator", test_module=TB, env=e,
             seed=seed, **BUILD)
    return json.loads(out.read_text())


def test_esd_dp_join_tiny(tmp_path, measured_dir):
    """Two Elastic-SD rounds (random acceptance) and an AR round, batch 2,
    every layer: trace == golden sequence, outputs == golden batched layer."""
    res = _run(tmp_path, preset("tiny"))
    assert res["events"] > 0 and res["tokens"] > 0
    (measured_dir / "esd_dp_join.json").write_text(json.dumps(res, indent=1))


def test_esd_dp_join_catches_wrong_golden(tmp_path):
    """A mutated golden layer (bit 0 of every output flipped) fails the join."""
    with pytest.raises(SimulationFailed):
        _run(tmp_path, preset("tiny"), {"ELMOE_GOLDEN_MUTATION": "1", "ELMOE_JOIN_ROUNDS": "AR"})
