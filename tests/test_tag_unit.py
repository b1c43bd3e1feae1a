"""pytest entry points: the expert-cache tag unit in cocotb against the golden
cache policy (cycle by cycle, with HB commit strobes and KV moves), plus the
golden model's own checks and the issue-10 reproducers on the golden side."""

import gc
import json
import warnings

import pytest

from elmoe3d.blocks import get_block
from elmoe3d.config import preset
from elmoe3d.golden.tag_unit import (STAT_NAMES, SlotState, TagError, TagOp, TagUnitModel,
                                     params_from_config)
from elmoe3d.hw.tag_unit import TagUnit
from elmoe3d.sim.run.harness import SimulationFailed, simulate

from conftest import sim_params

pytestmark = pytest.mark.tag

TB = "elmoe3d.tb.tag_unit_bench"
DIRECTED = ("allocate_pins_its_victim,kv_disabled_slots,commit_same_edge,free_and_cover_same_cycle,"
            "invalidate_slot_and_mask,"
            "all_pinned,thrash,decay_and_saturation,latency_and_throughput,one_lookup_per_cycle")


def _params(name="default", **over):
    p = get_block("tag_unit").params(preset(name))
    if "tag_slots" in over:            # a tag-unit size, not a whole tile that must fit HB
        p["slots"] = over.pop("tag_slots")
    assert not over, over
    return p


# A narrow instance where every corner is reachable quickly: S not a power of
# two (BAD_SLOT on the slot-addressed ops), 4-bit hotness (saturation), d = 1,
# 10-bit statistics (counter saturation), 2-bit pins (PIN_LIMIT), 32 tags.
SMALL = dict(slots=12, layer_bits=2, expert_bits=3, hot_bits=4, decay_shift=1,
             plane_bits=2, stat_bits=10, pin_bits=2)


def _run(p, testcase, simulator="verilator", env=None, seed=None, run=""):
    env = dict(env or {}, ELMOE_COVERAGE_RUN=f"{run}-{simulator}")
    return simulate(TagUnit, block="tag_unit", params=p, top="elmoe3d_tag_unit",
                    simulator=simulator, test_module=TB, testcase=testcase, env=env, seed=seed)


def test_tag_default(measured_dir):
    """Default geometry (S = 16, full widths), Verilator: 10,000 random
    commands, every directed trace, a 5,000-command Zipf controller trace
    whose STATS equal the golden counters, and the latency / throughput
    figures."""
    p = _params()
    S = p["slots"]
    out = measured_dir / f"tag_unit-zipf-S{S}-5k.json"
    thr = measured_dir / f"tag_unit-throughput-S{S}.json"
    _run(p, "random_commands,zipf_trace," + DIRECTED, run="default",
         env={"ELMOE_TAG_COMMANDS": "10000", "ELMOE_TAG_ZIPF_COMMANDS": "5000",
              "ELMOE_MEASURE_OUT": str(out), "ELMOE_THROUGHPUT_OUT": str(thr)})
    fig = json.loads(out.read_text())
    assert fig["rtl_stats"] == fig["golden_stats"]
    assert fig["commands"] >= 5_000
    t = json.loads(thr.read_text())
    assert t["stalls"] == 0 and t["latency_cycles"] == [TagUnit.LATENCY]
    assert t["lookups_per_cycle"] == 1.0


@pytest.mark.parametrize("simulator", sim_params())
def test_tag_tiny(simulator):
    """``tiny`` geometry (S = 8): 10,000 random commands and every directed
    trace under Verilator; 2,000 random commands and the directed traces
    under Icarus."""
    n = "10000" if simulator == "verilator" else "2000"
    _run(_params("tiny"), "random_commands," + DIRECTED, simulator, run="tiny",
         env={"ELMOE_TAG_COMMANDS": n})


def test_tag_small():
    """The narrow instance (S = 12, 4-bit hotness, 10-bit statistics, 2-bit
    pins): 10,000 random commands and the directed traces, so that every
    saturation and BAD_SLOT corner is reached."""
    _run(SMALL, "random_commands," + DIRECTED, run="small", env={"ELMOE_TAG_COMMANDS": "10000"})


@pytest.mark.slow
def test_tag_zipf_1m(measured_dir):
    """The 1,000,000-command Zipf controller trace at the default geometry;
    hit rate from the unit's own STATS, equal to the golden model's."""
    p = _params()
    out = measured_dir / f"tag_unit-zipf-S{p['slots']}-1M.json"
    _run(p, "zipf_trace", run="zipf1m", env={"ELMOE_TAG_ZIPF_COMMANDS": "1000000",
                                             "ELMOE_MEASURE_OUT": str(out)})
    fig = json.loads(out.read_text())
    assert fig["rtl_stats"] == fig["golden_stats"]
    assert fig["commands"] >= 1_000_000


@pytest.mark.slow
@pytest.mark.parametrize("slots", [8, 32, 128])
def test_tag_sizes(slots):
    """The sweep sizes: 200,000 random commands and the directed traces."""
    _run(_params(tag_slots=slots), "random_commands," + DIRECTED, run=f"S{slots}",
         env={"ELMOE_TAG_COMMANDS": "200000"})


@pytest.mark.parametrize("env", [{"ELMOE_TAG_MUTANT": "tie"}, {"ELMOE_TAG_MUTANT": "decay"},
                                 {"ELMOE_TAG_MUTANT": "pending_hit"},
                                 {"ELMOE_GOLDEN_MUTATION": "1"}],
                         ids=["tie-order", "decay-shift", "pending-hit", "value-bit0"])
def test_tag_mutant_golden_fails(env):
    """A subtly wrong golden model (victim ties to the highest index; decay by
    d + 1; PENDING reported as a hit; value bit 0 flipped) must make the
    testbench fail. The random run alone may meet no eviction among equally
    cold slots (seed 862770700: none in 3,000 commands, so the tie mutant
    passed); ``thrash`` evicts among equal hotness every time, so every
    mutant fails at every seed."""
    with pytest.raises(SimulationFailed):
        _run(SMALL, "random_commands,thrash", run="mutant",
             env={"ELMOE_TAG_COMMANDS": "3000", **env})


@pytest.mark.parametrize("width", [1, 3, 8, 12, 16, 32, 64, 128])
def test_kv_popcount_pipeline(width):
    """The ``kv_frees`` popcount (4-bit counts in logic, then adders with a
    register every ``KV_ADDER_LEVELS_PER_STAGE`` levels), in Amaranth's
    simulator: random masks back to back, every count exact
    ``kv_count_stages`` cycles later (the last stage is the caller's
    register), one stage up to 16 slots, two at 32 and 64, three at 128."""
    import random

    from amaranth.hdl import Module, Signal
    from amaranth.sim import Simulator

    from elmoe3d.hw.tag_unit import _popcount_pipeline, popcount_stages

    stages = popcount_stages(width, TagUnit.KV_ADDER_LEVELS_PER_STAGE)
    assert stages == (1 if width <= 16 else 2 if width <= 64 else 3)
    if width >= 8:
        assert stages == TagUnit(slots=width).kv_count_stages
    m = Module()
    v, clear = Signal(width), Signal()
    count, regs = _popcount_pipeline(m, v, TagUnit.KV_ADDER_LEVELS_PER_STAGE, clear=clear)
    out = Signal(range(width + 1))
    m.d.sync += out.eq(count)
    assert len(regs) == stages - 1
    rng = random.Random(width)
    masks = [rng.getrandbits(width) & rng.getrandbits(width) for _ in range(60)] + \
        [0, (1 << width) - 1]
    got = []

    async def bench(ctx):
        for mask in masks + [0] * stages:
            ctx.set(v, mask)
            await ctx.tick()
            got.append(ctx.get(out))

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert got[stages - 1:stages - 1 + len(masks)] == [bin(x).count("1") for x in masks]


# -- the golden model on its own ----------------------------------------------

def _model(**kw):
    p = dict(slots=4, layer_bits=2, expert_bits=2, hot_bits=3, decay_shift=1)
    p.update(kw)
    return TagUnitModel(**p)


def test_golden_policy_basics():
    """The pure-cache form of the Python methods (the system model's use)."""
    m = _model()
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
    assert m.stats() == dict(lookups=1, hits=1, allocations=5, evictions=1, pending=0,
                             commits=5, aborts=0, kv_frees=0)
    m.check_invariants()
    m.reset()
    assert m.stats()["allocations"] == 0 and not any(m.valid)


def test_golden_allocate_pins_its_victim():
    """Issue 10, defect 5 (golden side): on a full cache ALLOCATE A then
    ALLOCATE B take different slots; B never evicts A while A is PENDING;
    a PENDING tag is not a hit and not a victim; commit makes it a hit."""
    m = _model()
    t = [m.make_tag(0, e) for e in range(4)] + [m.make_tag(1, 0), m.make_tag(1, 1)]
    for k in range(4):
        m.allocate(t[k], 1, hot=1)
    ra = m.execute({"op": TagOp.ALLOCATE, "tag": t[4]})
    rb = m.execute({"op": TagOp.ALLOCATE, "tag": t[5]})
    assert ra["error"] == rb["error"] == TagError.OK
    assert (ra["slot"], rb["slot"]) == (0, 1) and rb["evicted_tag"] == t[1]
    assert m.pending[0] and m.pins[0] == 1 and m.slot_state(0) == SlotState.PENDING
    r = m.execute({"op": TagOp.LOOKUP, "tag": t[4]})
    assert (r["hit"], r["pending"], r["slot"]) == (0, 1, 0)
    assert m.execute({"op": TagOp.ALLOCATE, "tag": t[4]})["error"] == TagError.PENDING
    assert m.execute({"op": TagOp.ALLOCATE, "tag": t[2]})["error"] == TagError.RESIDENT
    m.unpin(0)                                             # even unpinned: never a victim
    assert m.choose_victim() == 2
    assert m.commit(0) and not m.commit(0)                 # a second strobe is ignored
    assert m.lookup(t[4]) == (True, 0, 0)
    assert m.stats()["pending"] == 1 and m.stats()["commits"] == 5
    m.check_invariants()


def test_golden_kv_and_victim_order():
    """KV covers the highest slots first, victims are searched from slot 0:
    a covered slot is freed at once (pins too), never hit, never a victim;
    with every enabled slot pinned there is no victim."""
    m = _model(slots=6)
    tags = [m.make_tag(0, e) for e in range(4)] + [m.make_tag(1, e) for e in range(4)]
    for k in range(6):
        assert m.allocate(tags[k])[1] == k
    m.pin(5)
    dropped = m.set_disabled(0b110000)
    assert dropped == [(4, tags[4]), (5, tags[5])] and m.stats()["kv_frees"] == 2
    assert m.lookup(tags[5]) == (False, 0, 0) and m.pins[5] == 0
    for s in range(4):
        m.pin(s)
    assert m.choose_victim() is None
    assert m.execute({"op": TagOp.ALLOCATE, "tag": tags[6]})["error"] == TagError.NO_VICTIM
    assert m.execute({"op": TagOp.PIN, "slot": 4})["error"] == TagError.NOT_VALID
    m.set_disabled(0)
    assert m.choose_victim() == 4
    m.check_invariants()


def test_golden_step_order():
    """One cycle = the command (on the state at the start of the cycle),
    then disabled, then commit: a LOOKUP in the cycle of the commit strobe
    still sees PENDING; an ABORT in that cycle wins (the strobe is ignored);
    an ALLOCATE and the commit of its victim in one cycle make it RESIDENT;
    a commit of a slot covered in the same cycle is ignored."""
    m = _model()
    m.execute({"op": TagOp.ALLOCATE, "tag": 5})
    assert m.step({"op": TagOp.LOOKUP, "tag": 5}, commit=0)["pending"] == 1
    assert m.resident(0)
    m.execute({"op": TagOp.ALLOCATE, "tag": 6})
    assert m.step({"op": TagOp.ABORT, "slot": 1}, commit=1)["error"] == TagError.OK
    assert not m.valid[1]
    assert m.step({"op": TagOp.ALLOCATE, "tag": 7}, commit=1)["slot"] == 1
    assert m.resident(1)
    m.execute({"op": TagOp.ALLOCATE, "tag": 8})
    assert m.step(None, commit=2, disabled=0b0100) is None
    assert m.stats()["commits"] == 2 and m.stats()["kv_frees"] == 1 and not m.valid[2]


def test_golden_errors_change_nothing():
    """Every error code of the command form leaves the state untouched and
    zeroes every response field but op and error."""
    m = TagUnitModel(slots=6, layer_bits=1, expert_bits=2, hot_bits=2, pin_bits=1)
    for k in range(5):
        m.execute({"op": TagOp.ALLOCATE, "tag": k})
    for s in range(4):
        m.commit(s)
    m.execute({"op": TagOp.UNPIN, "slot": 1})
    m.execute({"op": TagOp.UNPIN, "slot": 2})
    bad = [({"op": 13}, TagError.BAD_OP), ({"op": TagOp.PIN, "slot": 7}, TagError.BAD_SLOT),
           ({"op": TagOp.ABORT, "slot": 6}, TagError.BAD_SLOT),
           ({"op": TagOp.INVALIDATE_SLOT, "slot": 6}, TagError.BAD_SLOT),
           ({"op": TagOp.STATS, "slot": len(STAT_NAMES)}, TagError.BAD_SLOT),
           ({"op": TagOp.ALLOCATE, "tag": 1}, TagError.RESIDENT),
           ({"op": TagOp.ALLOCATE, "tag": 4}, TagError.PENDING),
           ({"op": TagOp.PIN, "slot": 5}, TagError.NOT_VALID),
           ({"op": TagOp.UNPIN, "slot": 1}, TagError.NOT_PINNED),
           ({"op": TagOp.PIN, "slot": 0}, TagError.PIN_LIMIT),
           ({"op": TagOp.LOOKUP_PIN, "tag": 0}, TagError.PIN_LIMIT),
           ({"op": TagOp.INVALIDATE, "tag": 0}, TagError.PINNED),
           ({"op": TagOp.INVALIDATE_SLOT, "slot": 0}, TagError.PINNED),
           ({"op": TagOp.INVALIDATE_MASK, "slot_mask": 0b111}, TagError.PINNED),
           ({"op": TagOp.ABORT, "slot": 1}, TagError.NOT_PENDING)]
    for cmd, code in bad:
        before = (list(m.valid), list(m.pending), list(m.tags), list(m.hot), list(m.pins),
                  m.stats())
        r = m.execute(cmd)
        assert r["error"] == code, (cmd, r)
        assert all(v == 0 for k, v in r.items() if k not in ("op", "error"))
        assert before == (list(m.valid), list(m.pending), list(m.tags), list(m.hot),
                          list(m.pins), m.stats())
    for s in (1, 2, 3):
        m.execute({"op": TagOp.PIN, "slot": s})
    m.execute({"op": TagOp.ALLOCATE, "tag": 5})            # takes free slot 5 (pending, pinned)
    assert m.execute({"op": TagOp.ALLOCATE, "tag": 6})["error"] == TagError.NO_VICTIM
    assert {c for _, c in bad} | {TagError.NO_VICTIM} == set(TagError) - {TagError.OK}


def test_golden_from_config():
    cfg = preset("default")
    m = TagUnitModel.from_config(cfg)
    assert m.params() == params_from_config(cfg) == get_block("tag_unit").params(cfg)
    assert m.slots == cfg.tag_slots and m.hot_bits == cfg.hot_bits


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
