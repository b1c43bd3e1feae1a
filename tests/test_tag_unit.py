"""pytest entry points: the expert-cache tag unit in cocotb against the golden
cache policy, plus the golden model's own checks."""

import gc
import json
import warnings

import pytest

from elmoe3d.blocks import get_block
from elmoe3d.config import preset
from elmoe3d.golden.tag_unit import TagError, TagOp, TagUnitModel
from elmoe3d.hw.tag_unit import TagUnit
from elmoe3d.sim.harness import SimulationFailed, simulate

from conftest import sim_params

pytestmark = pytest.mark.tag

TB = "elmoe3d.tb.test_tag_unit"
DIRECTED = "all_pinned,thrash,decay_and_saturation,lookup_throughput"


def _default_params(**over):
    p = get_block("tag_unit").params(preset("default"))
    if "tag_slots" in over:            # a tag-unit size, not a whole tile that must fit HB
        p["slots"] = over.pop("tag_slots")
    assert not over, over
    return p


# A narrow instance where every corner is reachable quickly: S not a power of
# two (BAD_SLOT on PIN/UNPIN), 4-bit hotness (saturation), d = 1, 10-bit
# statistics (counter saturation), 2-bit pins (PIN_LIMIT), 32 tags.
SMALL = dict(slots=12, layer_bits=2, expert_bits=3, hot_bits=4, decay_shift=1,
             plane_bits=2, stat_bits=10, pin_bits=2)


def _run(p, testcase, simulator="verilator", env=None, seed=None):
    return simulate(TagUnit, block="tag_unit", params=p, top="elmoe3d_tag_unit",
                    simulator=simulator, test_module=TB, testcase=testcase, env=env, seed=seed)


@pytest.mark.parametrize("simulator", sim_params())
def test_tag_random_small(simulator):
    """>= 200,000 random commands with idle/back-pressure plus the directed
    traces, on the narrow instance (Icarus runs a shorter random run)."""
    env = {"ELMOE_TAG_COMMANDS": "200000" if simulator == "verilator" else "20000"}
    _run(SMALL, "random_commands," + DIRECTED, simulator, env)


def test_tag_default(measured_dir):
    """Default size (S = 32, full widths): 200,000 random commands, the
    directed traces and a Zipf controller trace whose STATS must equal the
    golden counters (100,000 commands by default; the 1,000,000-command
    trace is ``test_tag_zipf_1m``, marked slow)."""
    p = _default_params()
    out = measured_dir / "tag_unit-zipf-S32-100k.json"
    thr = measured_dir / "tag_unit-throughput-S32.json"
    _run(p, "random_commands,zipf_trace," + DIRECTED,
         env={"ELMOE_TAG_COMMANDS": "200000", "ELMOE_TAG_ZIPF_COMMANDS": "100000",
              "ELMOE_MEASURE_OUT": str(out), "ELMOE_THROUGHPUT_OUT": str(thr)})
    fig = json.loads(out.read_text())
    assert fig["rtl_stats"] == fig["golden_stats"]
    assert fig["commands"] >= 100_000
    t = json.loads(thr.read_text())
    assert t["stalls"] == 0 and t["latency_cycles"] == [2]


@pytest.mark.slow
def test_tag_zipf_1m(measured_dir):
    """The 1,000,000-command Zipf trace at S = 32; hit rate from the unit's
    own STATS, equal to the golden model's to the count."""
    p = _default_params()
    out = measured_dir / "tag_unit-zipf-S32-1M.json"
    _run(p, "zipf_trace", env={"ELMOE_TAG_ZIPF_COMMANDS": "1000000",
                               "ELMOE_MEASURE_OUT": str(out)})
    fig = json.loads(out.read_text())
    assert fig["rtl_stats"] == fig["golden_stats"]
    assert fig["commands"] >= 1_000_000


@pytest.mark.slow
@pytest.mark.parametrize("slots", [8, 128])
def test_tag_sizes(slots):
    """The other two sweep sizes: random commands and directed traces."""
    _run(_default_params(tag_slots=slots), "random_commands," + DIRECTED,
         env={"ELMOE_TAG_COMMANDS": "200000"})


@pytest.mark.parametrize("env", [{"ELMOE_TAG_MUTANT": "tie"}, {"ELMOE_TAG_MUTANT": "decay"},
                                 {"ELMOE_GOLDEN_MUTATION": "1"}],
                         ids=["tie-order", "decay-shift", "value-bit0"])
def test_tag_mutant_golden_fails(env):
    """A subtly wrong golden model (victim ties to the highest index; decay by
    d + 1; value bit 0 flipped) must make the testbench fail."""
    with pytest.raises(SimulationFailed):
        _run(SMALL, "random_commands", env={"ELMOE_TAG_COMMANDS": "5000", **env})


# -- the golden model on its own ----------------------------------------------

def test_golden_policy_basics():
    m = TagUnitModel(slots=4, layer_bits=2, expert_bits=2, hot_bits=3, decay_shift=1)
    t = [m.make_tag(1, e) for e in range(4)] + [m.make_tag(2, 0)]
    assert m.split_tag(t[3]) == (1, 3)
    for k in range(4):
        assert m.allocate(t[k], 1, hot=k + 1) == (True, k, None)
    assert m.lookup(t[2]) == (True, 2, 1)
    assert m.touch(t[0], 7) and m.hot[0] == 7                # saturates at 7
    assert not m.touch(t[4], 1)
    m.pin(1)
    assert m.allocate(t[4], 2) == (True, 2, t[2])            # coldest unpinned: slot 2 (hot 3)
    with pytest.raises(ValueError):
        m.allocate(t[4])
    m.decay()
    assert m.hot == [7 - 3, 2 - 1, 0, 4 - 2]
    m.pin(0), m.pin(2), m.pin(3)
    assert m.allocate(t[2]) == (False, None, None)
    with pytest.raises(ValueError):
        m.invalidate(t[0])
    m.unpin(3)
    with pytest.raises(ValueError):
        m.unpin(3)
    assert m.invalidate(t[3]) and not m.valid[3]
    assert m.stats() == dict(lookups=1, hits=1, allocations=5, evictions=1)
    m.check_invariants()
    m.reset()
    assert m.stats()["allocations"] == 0 and not any(m.valid)


def test_golden_errors_change_nothing():
    """Every error code of the command form leaves the state untouched."""
    m = TagUnitModel(slots=6, layer_bits=1, expert_bits=2, hot_bits=2, pin_bits=1)
    for k in range(6):
        m.execute({"op": TagOp.ALLOCATE, "tag": k})
    m.execute({"op": TagOp.PIN, "slot": 0})
    m.execute({"op": TagOp.INVALIDATE, "tag": 5})
    bad = [({"op": 12}, TagError.BAD_OP), ({"op": TagOp.PIN, "slot": 7}, TagError.BAD_SLOT),
           ({"op": TagOp.STATS, "slot": 4}, TagError.BAD_SLOT),
           ({"op": TagOp.ALLOCATE, "tag": 1}, TagError.RESIDENT),
           ({"op": TagOp.PIN, "slot": 5}, TagError.NOT_VALID),
           ({"op": TagOp.UNPIN, "slot": 1}, TagError.NOT_PINNED),
           ({"op": TagOp.PIN, "slot": 0}, TagError.PIN_LIMIT),
           ({"op": TagOp.INVALIDATE, "tag": 0}, TagError.PINNED)]
    for cmd, code in bad:
        before = (list(m.valid), list(m.tags), list(m.hot), list(m.pins), m.stats())
        r = m.execute(cmd)
        assert r["error"] == code, (cmd, r)
        assert all(v == 0 for k, v in r.items() if k not in ("op", "error"))
        assert before == (list(m.valid), list(m.tags), list(m.hot), list(m.pins), m.stats())
    for k in (1, 2, 3, 4):
        m.execute({"op": TagOp.PIN, "slot": k})
    m.execute({"op": TagOp.ALLOCATE, "tag": 5})              # takes free slot 5
    m.execute({"op": TagOp.PIN, "slot": 5})
    assert m.execute({"op": TagOp.ALLOCATE, "tag": 6})["error"] == TagError.NO_VICTIM


@pytest.mark.parametrize("kw,exc", [({"slots": 1}, ValueError), ({"slots": 8.0}, TypeError),
                                    ({"hot_bits": 0}, ValueError),
                                    ({"decay_shift": 9}, ValueError)])
def test_parameter_validation(kw, exc):
    """Bad parameters raise TypeError/ValueError naming the value, in the
    golden model and in the component."""
    with pytest.raises(exc, match=repr(next(iter(kw.values())))):
        TagUnitModel(**kw)
    with warnings.catch_warnings():         # the half-built component is never elaborated
        warnings.simplefilter("ignore")
        with pytest.raises(exc, match=repr(next(iter(kw.values())))) as info:
            TagUnit(**kw)
        del info
        gc.collect()
