"""pytest entry points: the bit-slice PE and its baselines.

* cocotb (Verilator and Icarus, ``elmoe3d.tb.pe_bench``): random volume with
  coverage at the default and the tiny geometry, the limits, every rule
  violation with recovery, stall recovery, throughput and latency;
* regression tests of issue 10's reproducers on the Amaranth simulator
  (top-level ports only);
* planted bugs the testbench must catch.
"""

import pytest

from elmoe3d.blocks import get_block
from elmoe3d.config import preset
from elmoe3d.sim.run.harness import SimulationFailed, simulate

from conftest import cross_sims, sim_params

pytestmark = pytest.mark.pe

VOLUME = 10000          # random dot products per default-geometry and tiny-geometry run (Verilator)
SHORT = 1500            # on Icarus, and on the extra slice widths


def _params(block, geometry, over=None):
    b = get_block(block)
    p = dict(b.params(preset(geometry)), **(over or {}))
    p["kind"] = {"mac_int8": "int8", "bitfusion": "bitfusion"}.get(block, "bitslice")
    return b, p


def _factory(block):
    b = get_block(block)
    return lambda kind, **kw: b.factory(**kw)


def _run(block, geometry, over, simulator, testcase, env=None, factory=None):
    b, p = _params(block, geometry, over)
    return simulate(factory or _factory(block), block=block, params=p, top=b.top,
                    simulator=simulator, test_module="elmoe3d.tb.pe_bench", testcase=testcase,
                    env=env)


BLOCKS = ["pe", "pe_plain", "mac_int8", "bitfusion"]
DIRECTED = "limits,errors_recover,stall_recovery"

# (block, geometry preset, block-parameter overrides, id)
CASES = [pytest.param(blk, geo, None, id=f"{blk}-{geo}") for blk in BLOCKS
         for geo in ("default", "tiny")]
EXTRA = [pytest.param("pe", "default", {"slice_bits": 2, "lanes": 8, "max_len": 512},
                      id="pe-s2-L8"),
         pytest.param("pe", "default", {"slice_bits": 1, "lanes": 4, "max_len": 64},
                      id="pe-s1-L4"),
         pytest.param("pe_plain", "default", {"slice_bits": 2, "lanes": 8, "max_len": 512},
                      id="plain-s2-L8")]
EXTRA_IDS = {c.id for c in EXTRA}


@pytest.mark.parametrize("block,geometry,over,simulator",
                         cross_sims(CASES + EXTRA, slow=lambda c: ("icarus",) if c in EXTRA_IDS else ()))
def test_pe_random(block, geometry, over, simulator):
    """Random volume (10,000 dot products on Verilator at the default and the
    tiny geometry) plus the directed tests, with functional coverage. Icarus
    runs the four blocks at both geometries; the extra slice widths run on
    Icarus under ``slow``."""
    volume = VOLUME if simulator == "verilator" and over is None else SHORT
    _run(block, geometry, over, simulator, f"random_vectors,{DIRECTED}",
         env={"ELMOE_PE_DOTS": str(volume)})


@pytest.mark.parametrize("simulator", sim_params(slow=("icarus",)))
@pytest.mark.parametrize("block,geometry,over", CASES[0::2] + EXTRA[:2])
def test_pe_throughput(block, geometry, over, simulator, measured_dir):
    """1 beat/cycle, DRAFT = k/n of FULL, single-beat dot products at full
    rate, every latency equal to the documented one; figures written to
    ``build/measured/throughput-<block>-<params>-<simulator>.json``. The
    figures are cycle counts of the same Verilog: Icarus repeats them under
    ``slow``."""
    tag = "-".join(f"{k}{v}" for k, v in (over or {}).items()) or geometry
    out = measured_dir / f"throughput-{block}-{tag}-{simulator}.json"
    _run(block, geometry, over, simulator, "throughput", env={"ELMOE_MEASURE_OUT": str(out)})
    import json
    res = json.loads(out.read_text())
    b, p = _params(block, geometry, over)
    assert res["latency"] == b.factory(**{k: v for k, v in p.items() if k != "kind"}).latency
    for name, f in res["figures"].items():
        assert f["input_cycles"] == f["beats"], name


# L16-n4095 has its own build (42 s) for one test: the default run has its
# Amaranth-simulator reproducer (test_repro_max_len_4095_lanes_16); here ``slow``
REPRO = [pytest.param("pe", "default", None, id="pe-default"),
         pytest.param("pe", "default", {"lanes": 4, "max_len": 7}, id="pe-L4-n7"),
         pytest.param("pe", "default", {"lanes": 16, "max_len": 4095}, id="pe-L16-n4095",
                      marks=pytest.mark.slow),
         EXTRA[0], EXTRA[1]]


@pytest.mark.parametrize("simulator", sim_params())
@pytest.mark.parametrize("block,geometry,over", REPRO)
def test_repro_issue10_cocotb(block, geometry, over, simulator):
    """Issue 10, defect 1 on Verilator and Icarus (cocotb ``repro_issue10``):
    overflow at the longest FULL dot product (``L = 4, max_len = 7``: 131072,
    not -131072), one-plane dot products past the limit (MSB and DRAFT, also at
    ``s = 2`` and ``s = 1``) and FULL with repeated or missing planes are
    errors; every result against the golden model and the issue's figures."""
    _run(block, geometry, over, simulator, "repro_issue10")


# -- issue 10's reproducers, on the Amaranth simulator (top-level ports only) ------------------

def _sim_results(dut, dots, *, flat=None):
    """Drive ``dots`` (lists of beat payload dicts, ``last`` added here) back
    to back into ``dut.i`` with ``o`` always ready; return ``[(value, error)]``."""
    from amaranth.sim import Simulator
    flat = flat or (lambda b: b)
    beats = [dict(flat(b), last=int(k == len(d) - 1)) for d in dots for k, b in enumerate(d)]
    got = []

    async def bench(ctx):
        ctx.set(dut.o.ready, 1)
        k = cyc = 0
        while len(got) < len(dots) and cyc < len(beats) + 200:
            if k < len(beats):
                ctx.set(dut.i.payload, beats[k])
            ctx.set(dut.i.valid, k < len(beats))
            _, _, iv, ir, ov, op = await ctx.tick().sample(dut.i.valid, dut.i.ready,
                                                           dut.o.valid, dut.o.payload)
            k += bool(iv and ir)
            if ov:
                got.append((op.value, op.error))
            cyc += 1

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert len(got) == len(dots), f"{len(got)} results for {len(dots)} dot products"
    return got


def _beats(L, planes, chunks, act, slices, mode, keep=1):
    return [{"act": [act] * L, "sv": {"slices": [slices[q]] * L, "plane": q}, "mode": mode,
             "keep": keep} for q in planes for _ in range(chunks)]


def _pe(**kw):
    from elmoe3d.hw.pe import BitSlicePE
    return BitSlicePE(**kw)


def test_repro_max_len_not_a_multiple_of_lanes():
    """Issue 10, 1(a): ``L = 4, max_len = 7`` accepts 2 chunks = 8 elements;
    eight (-128)·(-128) are 131072, not -131072, and a third chunk is an error."""
    m8 = {0: 0x8, 1: 0x0}                         # w = -128: m = -8, l = 0
    got = _sim_results(_pe(lanes=4, max_len=7), [
        _beats(4, (0, 1), 2, -128, m8, 0), _beats(4, (0, 1), 3, -128, m8, 0),
        _beats(4, (0, 1), 1, -128, m8, 0)])
    assert got == [(131072, 0), (got[1][0], 1), (65536, 0)]


def test_repro_max_len_4095_lanes_16():
    """Issue 10, 1(a): ``max_len = 4095, L = 16``: 256 chunks of (-128)·(-128)."""
    m8 = {0: 0x8, 1: 0x0}
    got = _sim_results(_pe(lanes=16, max_len=4095), [_beats(16, (0, 1), 256, -128, m8, 0)])
    assert got == [(1 << 26, 0)]


@pytest.mark.parametrize("mode,s", [(2, 4), (1, 2), (1, 1)], ids=["MSB-s4", "DRAFT-s2", "DRAFT-s1"])
def test_repro_one_plane_longer_than_max_len(mode, s):
    """Issue 10, 1(b): default ``L = 16, max_len = 4096``, one-plane mode,
    ``keep = 1``, 512 beats of act = -128 on the MSB slice 0b1..0 (m = min): the
    accumulator wrapped (-134217728, error 0); 512 chunks are past the limit
    of 256, so it is an error. 256 beats give the exact value."""
    m_min = 1 << (s - 1)                           # most negative signed slice
    m = -(1 << (s - 1))
    d = 8 - s                                      # bits below the MSB slice
    aug = (1 << (d - 1)) if mode == 1 else 0
    want = 256 * 16 * (-128) * ((m << d) + aug)
    got = _sim_results(_pe(lanes=16, slice_bits=s, max_len=4096), [
        _beats(16, (0,), 512, -128, {0: m_min}, mode), _beats(16, (0,), 256, -128, {0: m_min}, mode)])
    assert got[0][1] == 1 and got[1] == (want, 0)


@pytest.mark.parametrize("planes,ok", [((0, 0, 1), False), ((0,), False), ((0, 1, 0, 1), False),
                                       ((1, 0), False), ((0, 1, 1), False), ((0, 1), True),
                                       ((0, 0, 1, 1), True)],
                         ids=["repeat", "missing", "chunk-major", "reversed", "more-lsb",
                              "ok-1", "ok-2"])
def test_repro_full_plane_sequence(planes, ok):
    """Issue 10, 1: FULL accepted repeated or missing planes. Only every plane
    in increasing order with the same chunk count is a dot product; a clean
    one follows each."""
    beats = [{"act": [3] * 4, "sv": {"slices": [5] * 4, "plane": q}, "mode": 0, "keep": 0}
             for q in planes]
    got = _sim_results(_pe(lanes=4, max_len=16), [beats, _beats(4, (0, 1), 1, 1, {0: 1, 1: 1}, 0)])
    assert got[0][1] == (0 if ok else 1) and got[1] == (4 * 17, 0)
    if ok:
        assert got[0][0] == 4 * 3 * 0x55 * len(planes) // 2


# -- the rule checker against the golden rule, exhaustively on short sequences ----------------

def test_rule_exhaustive_short_sequences():
    """Every plane sequence of 1..3 beats at ``s = 2`` (4 planes), in every
    mode and keep (valid and not), with ``max_len = 2 L`` (limit 2 chunks):
    the PE's error flag equals ``golden.bitslice.check_beats``."""
    import itertools
    from elmoe3d.golden import bitslice as gbs
    dots, want = [], []
    mks = [(0, 3), (0, 5)] + [(m, k) for m in (1, 2, 3) for k in range(0, 6)]
    for mode, keep in mks:
        for length in (1, 2, 3):
            for planes in itertools.product(range(4), repeat=length):
                dots.append([{"act": [1], "sv": {"slices": [1], "plane": q}, "mode": mode,
                              "keep": keep} for q in planes])
                want.append(int(gbs.check_beats(2, [(q, mode, keep) for q in planes],
                                                max_len=2, lanes=1) is not gbs.SeqError.OK))
    got = _sim_results(_pe(lanes=1, slice_bits=2, max_len=2), dots)
    bad = [(d, w, g) for d, w, g in zip(dots, want, got) if g[1] != w]
    assert not bad, f"{len(bad)} of {len(dots)} differ, first {bad[0]}"
    assert 0 < sum(want) < len(want)


# -- boundary: ready is a register, outputs come from registers --------------------------------

@pytest.mark.parametrize("block", BLOCKS)
def test_registered_boundary(block):
    """Under random traffic, flipping ``o.ready`` never changes ``i.ready`` in
    the same cycle, and flipping ``i.valid``/``i.payload`` never changes
    ``o.valid``/``o.payload`` in the same cycle: no combinational path crosses
    the block."""
    import random
    from amaranth.sim import Simulator
    b, p = _params(block, "tiny")
    dut = b.factory(**{k: v for k, v in p.items() if k != "kind"})
    rnd = random.Random(5)
    width = len(dut.i.payload.as_value())
    seen = {"ready_low": 0}

    async def bench(ctx):
        for _ in range(400):
            beat, valid = rnd.getrandbits(width), rnd.random() < 0.8
            ctx.set(dut.i.payload.as_value(), beat)
            ctx.set(dut.i.valid, valid)
            ctx.set(dut.o.ready, 0)
            r0 = ctx.get(dut.i.ready)
            ctx.set(dut.o.ready, 1)
            assert ctx.get(dut.i.ready) == r0, "i.ready follows o.ready"
            ov, op = ctx.get(dut.o.valid), ctx.get(dut.o.payload.as_value())
            ctx.set(dut.i.valid, not valid)
            ctx.set(dut.i.payload.as_value(), rnd.getrandbits(width))
            assert (ctx.get(dut.o.valid), ctx.get(dut.o.payload.as_value())) == (ov, op)
            ctx.set(dut.i.payload.as_value(), beat)
            ctx.set(dut.i.valid, valid)
            ctx.set(dut.o.ready, rnd.random() < 0.2)
            seen["ready_low"] += not r0
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert seen["ready_low"] > 0, "the test never filled the result slots"


# -- latency and throughput as documented -------------------------------------------------------

def test_documented_latencies():
    """The latencies the docstrings and docs/blocks/pe.md state, at the
    default configuration (the cocotb throughput test measures every
    result's latency against the same attribute)."""
    want = {"pe": 14, "pe_plain": 14, "mac_int8": 12, "bitfusion": 15}
    for name, lat in want.items():
        b = get_block(name)
        dut = b.build(preset("default"))
        assert dut.latency == lat, (name, dut.latency)
        assert dut.depth == lat + 1


# -- planted bugs the testbench must catch --------------------------------------------------------

@pytest.mark.parametrize("bug", ["chunks", "limit", "round"])
def test_planted_bug_fails(bug, tmp_path):
    """A PE with one planted bug (tb/pe_mutants.py) fails the cocotb
    testbench (tiny geometry; Icarus where installed: it builds in seconds).
    Its coverage goes to a scratch folder, not into build/coverage."""
    from elmoe3d.sim.run.harness import simulator_available
    from elmoe3d.tb.pe_mutants import mutant
    sim = "icarus" if simulator_available("icarus")[0] else "verilator"
    b, p = _params("pe", "tiny", {"slice_bits": 2, "max_len": 32} if bug != "limit" else None)
    with pytest.raises(SimulationFailed, match="cocotb tests failed"):
        simulate(lambda kind, **kw: mutant("pe", bug, **kw), block=f"pe-bug-{bug}", params=p,
                 top=b.top, simulator=sim, test_module="elmoe3d.tb.pe_bench",
                 testcase="limits,errors_recover" if bug != "round" else "random_vectors",
                 env={"ELMOE_PE_DOTS": "300", "ELMOE_COVERAGE_DIR": str(tmp_path)})


# -- formal (SymbiYosys BMC) ---------------------------------------------------------------------

def _formal_available():
    from elmoe3d.sim.run.formal import formal_available
    return formal_available()


_FORMAL_OK, _FORMAL_WHY = _formal_available()
FORMAL_DEPTH = 16       # cycles: covers a dot product at the limit (4 beats) plus a latency of 10-13


def _formal_dut(block, bug=None):
    from elmoe3d.tb.pe_mutants import mutant
    p = dict(lanes=1, max_len=2)                       # 2 chunks per plane at most
    if block in ("pe", "pe_plain"):
        p.update(slice_bits=4, augment=block == "pe")
    return mutant(block, bug, **p) if bug else get_block(block).factory(**p)


def _formal(block, *, values=False, bug=None, depth=FORMAL_DEPTH):
    from elmoe3d.sim.run.formal import run_sby
    from elmoe3d.tb.formal.pe import PEFamilyFormal
    kind = {"mac_int8": "int8", "bitfusion": "bitfusion"}.get(block, "bitslice")
    w = PEFamilyFormal.build(_formal_dut(block, bug), kind=kind, values=values)
    name = f"pe_family_{block}{'_values' if values else ''}{'_' + bug if bug else ''}"
    return run_sby(w, name=name, depth=depth, expect="FAIL" if bug else "PASS")


@pytest.mark.formal
@pytest.mark.skipif(not _FORMAL_OK, reason=_FORMAL_WHY)
@pytest.mark.parametrize("block", BLOCKS)
def test_formal_rules(block):
    """Stream rules on ``i`` and ``o``, no result refused, one result per
    ``last`` in order, its ``error`` equal to the reference rule (BMC depth
    16, ``L = 1``, ``max_len = 2``)."""
    assert _formal(block).status == "PASS"


#: BMC depth of the value checks: the longest accepted dot product at L = 1,
#: max_len = 2 (2 planes x 2 chunks = 4 beats from cycle 0) delivers its result
#: at cycle latency + 3 (13 for the PE, 10 for the MAC), the last step checked.
VALUE_DEPTH = {"pe": 14, "mac_int8": 11}


@pytest.mark.formal
@pytest.mark.skipif(not _FORMAL_OK, reason=_FORMAL_WHY)
@pytest.mark.parametrize("block", ["pe", "mac_int8"])
def test_formal_values_no_overflow(block):
    """The result values equal a reference 8 bits wider, at the extreme
    operands, for every beat sequence whose result falls within the depth,
    which includes every accepted dot product: none overflows."""
    assert _formal(block, values=True, depth=VALUE_DEPTH[block]).status == "PASS"


@pytest.mark.formal
@pytest.mark.skipif(not _FORMAL_OK, reason=_FORMAL_WHY)
@pytest.mark.parametrize("block,bug,values", [("pe", "chunks", False), ("pe", "limit", False),
                                              ("mac_int8", "limit", True)])
def test_formal_catches_planted_bug(block, bug, values):
    """A planted bug (tb/pe_mutants.py) makes the same properties fail."""
    depth = VALUE_DEPTH[block] if values else FORMAL_DEPTH
    assert _formal(block, values=values, bug=bug, depth=depth).status == "FAIL"


# -- formal equivalence: augmented PE FULL == INT8 MAC, MSB + LSB == FULL (issue 14, item 4) ---

def _equiv(bug=None, *, lanes=1, slice_bits=4, max_len=1):
    from elmoe3d.hw.pe import BitSlicePE, Int8MacVector
    from elmoe3d.sim.run.formal import run_sby
    from elmoe3d.tb.formal.pe_equiv import PEEquivalence
    from elmoe3d.tb.pe_mutants import mutant
    p = dict(lanes=lanes, slice_bits=slice_bits, max_len=max_len)
    pe = mutant("pe", bug, **p) if bug else BitSlicePE(**p)
    w = PEEquivalence(pe, Int8MacVector(lanes=lanes, max_len=max_len))
    name = f"pe_equiv_L{lanes}_s{slice_bits}_n{max_len}{'_' + bug if bug else ''}"
    return run_sby(w, name=name, depth=w.bound + 1, ports=[], expect="FAIL" if bug else "PASS")


@pytest.mark.formal
@pytest.mark.skipif(not _FORMAL_OK, reason=_FORMAL_WHY)
def test_formal_equivalence_full_vs_mac():
    """For every INT8 activation and weight (``L = 1``, ``s = 4``,
    ``max_len = 1``): the augmented PE's FULL result equals the INT8 MAC's,
    and its MSB-partial plus LSB-partial results equal FULL (BMC to the
    cycle by which every result must have arrived; tb/formal/pe_equiv.py)."""
    assert _equiv().status == "PASS"


@pytest.mark.formal
@pytest.mark.slow
@pytest.mark.skipif(not _FORMAL_OK, reason=_FORMAL_WHY)
@pytest.mark.parametrize("lanes,slice_bits,max_len", [(2, 4, 4), (1, 2, 1)],
                         ids=["L2-s4-C2", "L1-s2-keep1to3"])
def test_formal_equivalence_larger(lanes, slice_bits, max_len):
    """The same on two lanes with two chunks (a dot product of four
    products, accumulated across beats), and at ``s = 2`` (four planes, every
    ``keep`` of 1 .. 3)."""
    assert _equiv(lanes=lanes, slice_bits=slice_bits, max_len=max_len).status == "PASS"


@pytest.mark.formal
@pytest.mark.skipif(not _FORMAL_OK, reason=_FORMAL_WHY)
@pytest.mark.parametrize("bug", ["corner", "msb_round"])
def test_formal_equivalence_catches_planted_difference(bug):
    """A PE that differs from the MAC at one operand pair only (``corner``:
    act -128, MSB slice 0b1000) or whose MSB-partial rounds (``msb_round``)
    fails the equivalence check."""
    assert _equiv(bug).status == "FAIL"


# -- the token-parallel PE (the MoE layer's PE array: one slice vector, P tokens) ---------

def _tp_run(dut, s, lanes, P, seqs, rng):
    """Drive ``seqs`` (dot products: lists of ``(acts[P][L], slices[L],
    plane, mode, keep)`` beats) into a token-parallel PE with random idle
    cycles and back-pressure; returns the results ``(values[P], error)``."""
    from amaranth.sim import Simulator
    beats = [(b, i == len(sq) - 1) for sq in seqs for i, b in enumerate(sq)]
    out = []

    async def bench(ctx):
        bi, idle = 0, 0
        while len(out) < len(seqs):
            ctx.set(dut.o.ready, int(rng.random() < 0.7))
            if bi < len(beats) and rng.random() < 0.8:
                (acts, sl, plane, mode, keep), last = beats[bi]
                ctx.set(dut.i.payload, {"act": acts, "sv": {"slices": sl, "plane": plane},
                                        "mode": mode, "keep": keep, "last": int(last)})
                ctx.set(dut.i.valid, 1)
            else:
                ctx.set(dut.i.valid, 0)
            await ctx.delay(0)
            took = ctx.get(dut.i.valid) and ctx.get(dut.i.ready)
            if ctx.get(dut.o.valid) and ctx.get(dut.o.ready):
                p = ctx.get(dut.o.payload)
                out.append(([int(v) for v in p.value], int(p.error)))
            await ctx.tick()
            bi += bool(took)
            idle += 1
            assert idle < 50000, "the PE stopped"
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return out


def _tp_seqs(s, lanes, P, rng, count):
    """Random dot products of every mode (and some that break the beat rule)
    with ``P`` activation vectors per beat."""
    from elmoe3d.golden import bitslice as gbs
    n = gbs.n_planes(s)
    seqs = []
    for _ in range(count):
        mode = gbs.Mode(int(rng.integers(0, 4)))
        keep = int(rng.integers(1, n)) if n > 1 else 1
        chunks = int(rng.integers(1, 4))
        planes = list(gbs.plane_range(s, mode, keep))
        acts = rng.integers(-128, 128, (chunks, P, lanes))
        sq = []
        for q in planes:
            for c in range(chunks):
                sq.append((acts[c].tolist(), rng.integers(0, 1 << s, lanes).tolist(), q,
                           int(mode), keep))
        if rng.random() < 0.1 and len(sq) > 1:
            sq = sq[:-1]                                   # a missing beat: an error result
        seqs.append(sq)
    return seqs


@pytest.mark.parametrize("s,P", [(4, 2), (4, 4), (2, 3)])
def test_token_parallel_pe_equals_golden_per_lane(s, P):
    """A PE with ``P`` token lanes gives, per lane, the golden PE's result for
    that lane's activations (every mode, random lengths, rule-breaking
    sequences flagged ``error``), with random idle and back-pressure."""
    import numpy as np
    from elmoe3d.golden import bitslice as gbs
    from elmoe3d.hw.pe import BitSlicePE
    lanes, max_len = 4, 64
    rng = np.random.default_rng(10 + P)
    seqs = _tp_seqs(s, lanes, P, rng, 40)
    dut = BitSlicePE(lanes=lanes, slice_bits=s, max_len=max_len, tokens=P)
    got = _tp_run(dut, s, lanes, P, seqs, rng)
    for i, (sq, (vals, err)) in enumerate(zip(seqs, got)):
        for p in range(P):
            exp, eerr, _ = gbs.pe_result(s, [(a[p], sl, q, m, k) for a, sl, q, m, k in sq],
                                         max_len=max_len, lanes=lanes)
            assert err == eerr, f"dot product {i}: error {err}, expected {eerr}"
            if not eerr:
                assert vals[p] == exp, f"dot product {i} lane {p}: {vals[p]} != {exp}"


def test_token_parallel_pe_mutant_fails():
    """A planted bug (every token lane multiplies lane 0's activations) is
    caught by the per-lane comparison."""
    import numpy as np
    from elmoe3d.golden import bitslice as gbs
    from elmoe3d.hw.pe import BitSlicePE
    from elmoe3d.tb.pe_mutants import mutant
    s, lanes, P, max_len = 4, 4, 2, 64
    rng = np.random.default_rng(3)
    seqs = _tp_seqs(s, lanes, P, rng, 12)
    dut = mutant("pe", "lane0", lanes=lanes, slice_bits=s, max_len=max_len, tokens=P)
    got = _tp_run(dut, s, lanes, P, seqs, rng)
    bad = 0
    for sq, (vals, err) in zip(seqs, got):
        exp, eerr, _ = gbs.pe_result(s, [(a[1], sl, q, m, k) for a, sl, q, m, k in sq],
                                     max_len=max_len, lanes=lanes)
        bad += not eerr and vals[1] != exp
    assert bad, "the planted bug went unnoticed"
