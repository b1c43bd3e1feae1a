"""One policy, two implementations: the NumPy tag-unit policy of the system
model (``sim/perf/fastpolicy.py``) against the golden tag unit, op for op.

The test drives the golden only through its public interface (``execute``
with command dicts, ``stats()``, the documented per-slot state lists), so it
keeps working when the golden gains operations; if the golden's semantics of
these seven operations or of HB's commit strobe change, this test fails until
the NumPy policy follows. ALLOCATE pins its victim and leaves it PENDING (not
a hit, not a victim) until a commit strobe; the command stream therefore
carries commit strobes (``op`` = "commit"), most of them naming a PENDING
slot."""

import numpy as np
import pytest

from elmoe3d.golden.tag_unit import TagOp, TagUnitModel
from elmoe3d.sim.perf.cache import TagCache
from elmoe3d.sim.perf.fastpolicy import FastTagUnit

pytestmark = pytest.mark.perf

COMMIT = "commit"
OPS = (TagOp.LOOKUP, TagOp.TOUCH, TagOp.DECAY, TagOp.ALLOCATE, TagOp.INVALIDATE, TagOp.PIN,
       TagOp.UNPIN, COMMIT)
#: op mix: lookups and allocations dominate (as in a controller trace); about
#: one commit strobe per ALLOCATE
WEIGHTS = np.array([0.30, 0.14, 0.03, 0.27, 0.06, 0.10, 0.14, 0.25])
PARAMS = dict(slots=32, layer_bits=3, expert_bits=4, hot_bits=6, decay_shift=2, plane_bits=2,
              stat_bits=12, pin_bits=2)


def _commands(n, rng, zipf: bool, p=PARAMS):
    """``n`` command dicts: random ops; tags uniform over a pool 3x the slot
    count, or Zipf-distributed (a few hot experts, a long tail)."""
    pool = rng.choice(1 << (p["layer_bits"] + p["expert_bits"]), 3 * p["slots"], replace=False)
    if zipf:
        w = 1.0 / np.arange(1, len(pool) + 1) ** 1.1
        tags = pool[rng.choice(len(pool), n, p=w / w.sum())]
    else:
        tags = pool[rng.integers(0, len(pool), n)]
    ops = rng.choice(len(OPS), n, p=WEIGHTS / WEIGHTS.sum())
    hot_max = (1 << p["hot_bits"]) - 1
    amounts = rng.integers(0, hot_max + 1, n)
    planes = rng.integers(0, 1 << p["plane_bits"], n)
    slots = rng.integers(0, p["slots"] + 1, n)               # slots == S: BAD_SLOT
    pick = rng.random(n)
    for i in range(n):
        op = OPS[ops[i]]
        if op == COMMIT:                    # 90 %: a PENDING slot (chosen at replay time)
            yield dict(op=COMMIT, slot=int(slots[i]), pick=float(pick[i]))
            continue
        yield dict(op=int(op), tag=int(tags[i]), slot=int(slots[i]),
                   amount=int(amounts[i]), planes=int(planes[i]))


def _state(m):
    return [list(map(int, x)) for x in (m.valid, m.pending, m.tags, m.planes, m.hot, m.pins)]


def _replay(golden, fast, cmds, every=1):
    """Same commands to both: responses equal always, state and statistics
    every ``every`` commands. Returns the number of commands and the ops seen."""
    seen = {}
    n = 0
    for i, c in enumerate(cmds):
        if c["op"] == COMMIT:
            pend = [s for s in range(golden.slots) if golden.pending[s]]
            s = pend[int(c["pick"] * len(pend) / 0.9)] if pend and c["pick"] < 0.9 else c["slot"]
            r_g, r_f = golden.commit(s), fast.commit(s)
            assert r_g == r_f, (i, s, r_g, r_f)
            seen[(COMMIT, int(r_g))] = seen.get((COMMIT, int(r_g)), 0) + 1
            n += 1
            continue
        r_g, r_f = golden.execute(c), fast.execute(c)
        assert r_f == r_g, (i, c, r_g, r_f)
        key = (c["op"], r_g["error"])
        seen[key] = seen.get(key, 0) + 1
        if i % every == 0:
            assert _state(fast) == _state(golden), (i, c)
            assert fast.stats() == golden.stats(), i
        n += 1
    assert _state(fast) == _state(golden) and fast.stats() == golden.stats()
    fast.check_invariants()
    return n, seen


@pytest.mark.parametrize("zipf", [False, True], ids=["random", "zipf"])
def test_op_for_op_against_golden(zipf):
    """100,000 commands per distribution: identical responses after every
    command, identical state and statistics every 10 commands."""
    rng = np.random.default_rng(11 + zipf)
    golden, fast = TagUnitModel(**PARAMS), FastTagUnit(**PARAMS)
    n, seen = _replay(golden, fast, _commands(100_000, rng, zipf), every=10)
    assert n == 100_000
    # every op ran, with hits, evictions and each error class that op can produce
    for op in OPS:
        assert any(k[0] == op and k[1] == (1 if op == COMMIT else 0) for k in seen), op
    st = golden.stats()
    assert st["hits"] > 1000 and st["evictions"] > 1000
    assert st["pending"] > 50 and st["commits"] > 1000
    errors = {k[1] for k in seen if k[0] != COMMIT and k[1]}
    # BAD_SLOT RESIDENT NOT_VALID NOT_PINNED PINNED PENDING
    assert {2, 3, 5, 6, 8, 10} <= errors, errors


def test_saturation_and_all_pinned():
    """Counters saturate, hotness saturates, NO_VICTIM and PIN_LIMIT behave
    the same (small widths, so the limits are reached)."""
    p = dict(PARAMS, slots=4, stat_bits=4, pin_bits=1, hot_bits=3)
    rng = np.random.default_rng(3)
    golden, fast = TagUnitModel(**p), FastTagUnit(**p)
    n, seen = _replay(golden, fast, _commands(20_000, rng, True, p))
    assert golden.stats()["lookups"] == 15                 # saturated at 2**4 - 1
    assert (TagOp.ALLOCATE, 4) in seen and (TagOp.PIN, 7) in seen


def test_test_can_fail():
    """A golden whose victim ties go to the highest index, which decays by
    d + 1, or which reports PENDING slots as hits is caught."""
    rng = np.random.default_rng(5)
    golden, fast = TagUnitModel(**PARAMS, mutant="tie"), FastTagUnit(**PARAMS)
    with pytest.raises(AssertionError):
        _replay(golden, fast, _commands(5_000, rng, False))
    golden, fast = TagUnitModel(**PARAMS, mutant="decay"), FastTagUnit(**PARAMS)
    with pytest.raises(AssertionError):
        _replay(golden, fast, _commands(5_000, rng, False))
    golden, fast = TagUnitModel(**PARAMS, mutant="pending_hit"), FastTagUnit(**PARAMS)
    with pytest.raises(AssertionError):
        _replay(golden, fast, _commands(5_000, rng, False))


def test_allocate_pins_its_victim():
    """Issue 10 defect 5 on the NumPy policy: on a full cache ALLOCATE A then
    ALLOCATE B get different slots (A's victim is PENDING and pinned), and A
    is a hit only after its commit strobe."""
    p = dict(PARAMS, slots=4)
    for m in (TagUnitModel(**p), FastTagUnit(**p)):
        for t in range(4):
            m.allocate(t, 1, 5)                          # pure-cache form: RESIDENT, unpinned
        a = m.execute(dict(op=int(TagOp.ALLOCATE), tag=10))
        b = m.execute(dict(op=int(TagOp.ALLOCATE), tag=11))
        assert a["error"] == b["error"] == 0 and a["slot"] != b["slot"], (a, b)
        assert m.execute(dict(op=int(TagOp.LOOKUP), tag=10))["pending"] == 1
        assert m.commit(a["slot"])
        assert m.execute(dict(op=int(TagOp.LOOKUP), tag=10))["hit"] == 1
        assert m.pins[a["slot"]] == 1


def test_batch_operations_equal_sequential_golden():
    """lookup_many / touch_many / pin_many / allocate_pinned / unpin_many ==
    the golden's single operations in order, on layer-shaped batches."""
    rng = np.random.default_rng(7)
    p = dict(PARAMS, slots=48)
    golden, fast = TagUnitModel(**p), FastTagUnit(**p)
    hot_max = golden.hot_max
    for it in range(3000):
        layer = int(rng.integers(0, 8))
        ids = np.sort(rng.choice(16, int(rng.integers(1, 12)), replace=False))
        tags = (layer << p["expert_bits"]) | ids
        hots = rng.integers(0, hot_max + 1, len(tags))
        # golden: LOOKUP each, PIN hits, TOUCH hits, ALLOCATE + PIN misses
        g_hit = []
        pinned = []
        for t in tags.tolist():
            hit, s, _ = golden.lookup(t)
            g_hit.append(hit)
            if hit:
                pinned.append(s)
        for s in pinned:
            golden.pin(s)
        for t, h, a in zip(tags.tolist(), g_hit, hots.tolist()):
            if h:
                golden.touch(t, a)
        g_ok = []
        for t, h, a in zip(tags.tolist(), g_hit, hots.tolist()):
            if not h:
                ok, v, _ = golden.allocate(t, 1, a)
                g_ok.append(ok)
                if ok:
                    golden.pin(v)
                    pinned.append(v)
        # fast: the batch operations
        hit, slots = fast.lookup_many(tags)
        fast.pin_many(slots[hit])
        fast.touch_many(tags[hit], hots[hit])
        ok, vs, _ = fast.allocate_pinned(tags[~hit], 1, hots[~hit])
        assert hit.tolist() == g_hit and ok.tolist() == g_ok, it
        assert sorted(pinned) == sorted(np.concatenate([slots[hit], vs[ok]]).tolist())
        if it % 3 == 0:                     # sometimes two layers are pinned at once
            for s in pinned:
                golden.unpin(s)
            fast.unpin_many(np.array(pinned, np.int64))
        else:
            for s in pinned:
                golden.unpin(s)
            fast.unpin_many(np.concatenate([slots[hit], vs[ok]]))
        if it % 5 == 4:
            golden.decay()
            fast.decay()
        assert _state(fast) == _state(golden), it
        assert fast.stats() == golden.stats()


@pytest.mark.parametrize("engine", ["numpy", "numba"])
def test_tag_cache_engines_agree(engine):
    """The system model's cache driver gives the same answers with the golden
    model (op by op) and the NumPy policy, vectorised or compiled (a missing
    release of pinned hits in the NumPy path was caught by this test)."""
    rng = np.random.default_rng(9)
    caches = [TagCache(40, 6, 32, hot_bits=8, decay_shift=2, engine=e) for e in ("golden", engine)]
    for it in range(1500):
        layer = int(rng.integers(0, 6))
        ids = np.sort(rng.choice(32, int(rng.integers(1, 20)), replace=False))
        hots = rng.integers(1, 40, len(ids))
        out = [c.access_layer(layer, ids, planes=1, hots=hots, touch=hots // 2) for c in caches]
        assert [o.tolist() for o in out[0]] == [o.tolist() for o in out[1]], it
        if it % 4 == 0:
            ids2 = np.sort(rng.choice(32, 5, replace=False))
            for c in caches:
                c.touch_layer(layer, ids2, np.full(5, 3))
        for c in caches:
            c.release()
            if it % 3 == 2:
                c.decay()
        assert np.array_equal(caches[0].resident_mask(), caches[1].resident_mask())
    assert caches[0].stats() == caches[1].stats()
    assert isinstance(caches[0].tu, TagUnitModel) and isinstance(caches[1].tu, FastTagUnit)
    assert caches[1].tu.impl == engine
    caches[1].tu.check_invariants()
