"""pytest entry points: the Elastic-SD controller + real tag unit + token
feed + real batched MoE datapath (``tb/esd_dp_join.EsdDpJoin``) decoding
Elastic-SD and AR rounds at ``tiny``: the trace equals the golden control
sequence event for event and every layer output the golden batched layer bit
for bit (``tb/esd_dp_join_bench.py``).

One Verilator build serves every test (about 6 minutes cold on the shared
2-core machine, ``-O0`` like the datapath's own tests; cached in
``sim_build/`` after). The default run is one short decode (an SD round and
an AR round); the longer decode and the two planted-bug runs are ``slow``."""

import json

import pytest

from elmoe3d.config import Config, preset
from elmoe3d.sim.run.harness import SimulationFailed, simulate

pytestmark = pytest.mark.tile

TB = "elmoe3d.tb.esd_dp_join_bench"
#: the datapath's C++ takes minutes at Verilator's -Os (as tests/test_moe_layer.py)
BUILD = {"extra_build_args": ["-CFLAGS", "-O0"], "icarus_always_comb": True}


def _factory(config):
    from elmoe3d.tb.esd_dp_join import EsdDpJoin
    return EsdDpJoin(Config(**config))


def _run(tmp_path, env=None, seed=1):
    out = tmp_path / "join.json"
    e = {"ELMOE_JOIN_OUT": str(out)}
    e.update(env or {})
    simulate(_factory, block="esd_dp_join", params={"config": preset("tiny").to_dict()},
             top="elmoe3d_esd_dp_join", simulator="verilator", test_module=TB, env=e,
             seed=seed, **BUILD)
    return json.loads(out.read_text())


def _fails(tmp_path, env):
    with pytest.raises(SimulationFailed) as exc:
        _run(tmp_path, env)
    log = str(exc.value).split("log=")[1].split()[0]
    return open(log).read()


def test_esd_dp_join_tiny(tmp_path, measured_dir):
    """An Elastic-SD round (the first DRAFT steps find no resident expert:
    ``none`` passes; VERIFY fills) and an AR round, batch 2, every layer."""
    res = _run(tmp_path, {"ELMOE_JOIN_ROUNDS": "SD,AR"})
    assert res["kinds"].get("FILL_END", 0) > 0 and res["tokens"] > 0
    (measured_dir / "esd_dp_join.json").write_text(json.dumps(res, indent=1))


@pytest.mark.slow
@pytest.mark.parametrize("batch", [2, 3])
def test_esd_dp_join_rounds(tmp_path, measured_dir, batch):
    """Two SD rounds (random acceptance: HB hits, SPLIT sources, TOUCHes,
    DECAY, a draft-length change) and an AR round."""
    res = _run(tmp_path, {"ELMOE_JOIN_ROUNDS": "SD,SD,AR", "ELMOE_JOIN_BATCH": str(batch)},
               seed=batch)
    assert res["kinds"].get("TOUCH", 0) > 0
    (measured_dir / f"esd_dp_join_b{batch}.json").write_text(json.dumps(res, indent=1))


@pytest.mark.slow
def test_esd_dp_join_catches_wrong_outputs(tmp_path):
    """A mutated golden layer (bit 0 of every output flipped) fails the join
    on the outputs."""
    text = _fails(tmp_path, {"ELMOE_GOLDEN_MUTATION": "1", "ELMOE_JOIN_ROUNDS": "AR"})
    assert "outputs differ" in text


@pytest.mark.slow
def test_esd_dp_join_catches_wrong_sequence(tmp_path):
    """A mutated golden controller (VERIFY hits TOUCHed) fails the join on
    the trace."""
    text = _fails(tmp_path, {"ELMOE_JOIN_MUTANT": "touch_verify",
                             "ELMOE_JOIN_ROUNDS": "SD,SD"})
    assert "differs" in text or " expected, " in text
