"""The weight-bit-serial MAC vector peer: golden model on its own, parameter
checks, and the RTL against the golden model in cocotb."""

import json

import numpy as np
import pytest

from elmoe3d.golden import bitserial as gbsr
from elmoe3d.hw.bitserial import BitSerialMAC
from elmoe3d.sim.run.harness import simulate

from conftest import sim_params

pytestmark = pytest.mark.pe


# ---- golden model -----------------------------------------------------------

@pytest.mark.golden
@pytest.mark.parametrize("b", gbsr.DIGIT_BITS)
@pytest.mark.parametrize("p", [8, 4])
def test_digits_reconstruct_every_weight(b, p):
    if p % b:
        pytest.skip("precision not a multiple of the digit width")
    w = np.arange(-(1 << (p - 1)), 1 << (p - 1))
    d = gbsr.digits(w, p, b)
    g = p // b
    back = sum(d[k] * (1 << (b * (g - 1 - k))) for k in range(g))
    assert (back == w).all()
    assert d[0].min() >= -(1 << (b - 1)) and (d[1:] >= 0).all()


@pytest.mark.golden
@pytest.mark.parametrize("b", gbsr.DIGIT_BITS)
def test_run_equals_numpy_dot(b):
    r = np.random.default_rng(b)
    beats, expect = [], []
    for _ in range(50):
        n = int(r.integers(1, 70))
        p = int(r.choice([8, 4])) if b != 1 else int(r.choice([8, 4, 3]))
        a = r.integers(-128, 128, n)
        w = r.integers(-(1 << (p - 1)), 1 << (p - 1), n)
        bt, v = gbsr.dot_beats(a, w, p, b, 16)
        beats += bt
        expect.append((v, 0))
    assert gbsr.run(beats, b=b, lanes=16, max_len=4096) == expect


@pytest.mark.golden
def test_run_flags_every_error_case():
    b, L = 4, 4
    good = gbsr.weight_beats(np.ones(4, int), np.full(4, -3), 8, b, L)
    assert gbsr.run(good, b=b, lanes=L, max_len=8) == [(-12, 0)]
    no_msd = [dict(good[0], msd=0), good[1]]
    no_lsd = [dict(good[0], lsd=0, last=1)]
    wide = [dict(good[0]), dict(good[1], lsd=0, last=0), dict(good[1])]
    msd_inside = [good[0], dict(good[1], msd=1)]
    too_long = good * 2 + good      # three groups, limit ceil(8/4) = 2
    too_long = [dict(x, last=0) for x in too_long[:-1]] + [too_long[-1]]
    for bad in (no_msd, no_lsd, wide, msd_inside, too_long):
        assert gbsr.run(bad, b=b, lanes=L, max_len=8)[0][1] == 1
    # the next dot product starts clean
    assert gbsr.run(no_lsd + good, b=b, lanes=L, max_len=8)[1] == (-12, 0)


@pytest.mark.golden
def test_truncate_is_the_top_bits():
    w = np.arange(-128, 128)
    assert (gbsr.truncate(w, 4) == np.floor(w / 16)).all()


def test_parameter_errors():
    with pytest.raises(ValueError, match="Digit width must be 1, 2 or 4, not 3"):
        BitSerialMAC(digit_bits=3)
    with pytest.raises(TypeError, match="Digit width must be an integer"):
        BitSerialMAC(digit_bits=2.0)
    with pytest.raises(ValueError, match="Lane count"):
        BitSerialMAC(lanes=0)
    with pytest.raises(ValueError, match="Maximum dot-product length"):
        BitSerialMAC(max_len=0)
    with pytest.raises(ValueError, match="multiple of the digit width"):
        gbsr.digits([1], 3, 2)


# ---- RTL --------------------------------------------------------------------

CASES = [
    pytest.param({"lanes": 16, "digit_bits": 4, "max_len": 4096}, id="b4-L16"),
    pytest.param({"lanes": 8, "digit_bits": 2, "max_len": 256}, id="b2-L8"),
    pytest.param({"lanes": 4, "digit_bits": 1, "max_len": 64}, id="b1-L4"),
]


def _factory(latency=None, **kw):
    return BitSerialMAC(**kw)


def _params(over):
    p = dict(over)
    p["latency"] = BitSerialMAC(**over).latency
    return p


@pytest.mark.parametrize("simulator", sim_params())
@pytest.mark.parametrize("over", CASES)
def test_bitserial_random(over, simulator):
    """600 random dot products on Verilator, 300 on Icarus, and the buffer-fill test."""
    simulate(_factory, block="bitserial", params=_params(over), top="elmoe3d_bitserial",
             simulator=simulator, test_module="elmoe3d.tb.bitserial_bench",
             testcase="random_vectors,one_beat_dots_fill_the_buffer",
             env={"ELMOE_BITSERIAL_DOTS": "600" if simulator == "verilator" else "300"})


@pytest.mark.parametrize("over", CASES[:2])
def test_bitserial_throughput(over, measured_dir):
    out = measured_dir / f"throughput-bitserial-b{over['digit_bits']}-L{over['lanes']}.json"
    simulate(_factory, block="bitserial", params=_params(over), top="elmoe3d_bitserial",
             test_module="elmoe3d.tb.bitserial_bench", testcase="throughput",
             env={"ELMOE_MEASURE_OUT": str(out)})
    fig = json.loads(out.read_text())["figures"]
    b = over["digit_bits"]
    assert fig["W8"]["beats"] == 32 * 4 * 8 // b
    assert fig["W4"]["ratio_to_W8"] == 0.5


def test_bitserial_testbench_can_fail():
    """A golden model with one bit flipped makes the scoreboard fail."""
    from elmoe3d.sim.run.harness import SimulationFailed
    over = CASES[2].values[0]                     # the b1-L4 build, shared with the random run
    with pytest.raises(SimulationFailed):
        simulate(_factory, block="bitserial", params=_params(over), top="elmoe3d_bitserial",
                 test_module="elmoe3d.tb.bitserial_bench", testcase="random_vectors",
                 env={"ELMOE_GOLDEN_MUTATION": "1", "ELMOE_BITSERIAL_DOTS": "40"})


# ---- formal: the stream rules on both ports (the generic wrapper of tb/formal/moe.py) ----

from elmoe3d.sim.run.formal import formal_available, run_sby  # noqa: E402

_fok, _fwhy = formal_available()


def _formal(bug=None):
    from elmoe3d.tb.formal.moe import _UnitFormal
    return _UnitFormal(BitSerialMAC(lanes=2, digit_bits=2, max_len=4), bug=bug)


@pytest.mark.formal
@pytest.mark.skipif(not _fok, reason=_fwhy)
def test_bitserial_formal_stream_rules():
    """Stream rules on ``i`` (assumed) and ``o`` (asserted), k-induction at
    k = 3 (an unbounded proof); ``o`` is reachable while it waits."""
    f = _formal()
    assert run_sby(f, name="bitserial_rules", depth=3, mode="prove").status == "PASS"
    assert len(f.covered) == 2
    assert run_sby(_formal(), name="bitserial_cover", depth=16, mode="cover").status == "PASS"


@pytest.mark.formal
@pytest.mark.skipif(not _fok, reason=_fwhy)
@pytest.mark.parametrize("bug", ["drop_valid", "payload"])
def test_bitserial_formal_catches_bug(bug):
    r = run_sby(_formal(bug), name=f"bitserial_bug_{bug}", depth=18, expect="FAIL")
    assert r.status == "FAIL"
