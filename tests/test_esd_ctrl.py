"""pytest entry points: the Elastic-SD controller RTL in cocotb, its trace
event for event against the golden control sequence (blocks modelled by
their golden models; see ``tb/test_esd_ctrl.py``)."""

import json
import pickle

import numpy as np
import pytest

from elmoe3d.config import Config, preset
from elmoe3d.golden import esd as gesd
from elmoe3d.golden.vocab import ExtError
from elmoe3d.hw.esd_ctrl import EsdCtrl
from elmoe3d.sim.harness import simulate

from conftest import sim_params

pytestmark = pytest.mark.esd

TB = "elmoe3d.tb.test_esd_ctrl"


def _factory(**fields):
    return EsdCtrl(Config(**fields))


def _case(cfg, batch, steps, seed, faults=None, tokens=400):
    R = gesd.synthetic_trace(np.random.default_rng(seed), requests=batch, tokens=tokens,
                             layers=cfg.layers, experts=cfg.experts)
    run = gesd.run_trace(cfg, R, batch=batch, steps=steps, seed=seed, faults=faults,
                         check=False)
    return run, dict(script=run.script, events=run.events, counters=run.counters,
                     faults={int(k): int(v) for k, v in (faults or {}).items()})


def _run(tmp_path, cfg, batch, steps, seed=1, faults=None, simulator="verilator", env=None):
    run, case = _case(cfg, batch, steps, seed, faults)
    f = tmp_path / "case.pkl"
    f.write_bytes(pickle.dumps(case))
    out = tmp_path / "out.json"
    e = {"ELMOE_ESD_CASE": str(f), "ELMOE_ESD_OUT": str(out)}
    e.update(env or {})
    simulate(_factory, block="esd_ctrl", params=cfg.to_dict(), top="elmoe3d_esd_ctrl",
             simulator=simulator, test_module=TB, env=e, seed=seed)
    return run, json.loads(out.read_text())


TINY_KV = preset("tiny").replace(kv_words_per_token=2, min_free_slots=3)


@pytest.mark.parametrize("simulator", sim_params())
def test_esd_ctrl_tiny(tmp_path, simulator):
    """tiny geometry, batch 4 (Elastic-SD, with KV moves both ways and
    back-off): the trace equals the golden sequence."""
    run, out = _run(tmp_path, TINY_KV, 4, 60 if simulator == "verilator" else 30,
                    simulator=simulator)
    assert out["events"] == len(run.events)


@pytest.mark.parametrize("batch", [1, 4, 16])
def test_esd_ctrl_default(tmp_path, batch):
    cfg = preset("default").replace(kv_words_per_token=8)
    run, out = _run(tmp_path, cfg, batch, 40, seed=batch)
    assert out["events"] == len(run.events)


def test_esd_ctrl_faults(tmp_path):
    faults = {i: [ExtError.SLVERR, ExtError.DECERR, ExtError.PROTOCOL][i % 3]
              for i in range(3, 600, 37)}
    run, out = _run(tmp_path, TINY_KV, 4, 40, seed=5, faults=faults)
    assert run.counters["aborts"] > 0 and out["counters"]["aborts"] == run.counters["aborts"]


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 4, 16])
def test_esd_ctrl_2000_steps(tmp_path, batch):
    cfg = preset("default").replace(kv_words_per_token=8)
    run, out = _run(tmp_path, cfg, batch, 2000, seed=batch)
    assert run.counters["decode_steps"] >= 2000
