"""The shared register slice (:class:`elmoe3d.hw.streams.RegisterSlice`):
formal proof of lossless in-order delivery and the stream rules, a planted
bug that must fail, and full throughput in simulation."""

import pytest
from amaranth.hdl import unsigned
from amaranth.sim import Simulator

from elmoe3d.hw.streams import RegisterSlice
from elmoe3d.sim.formal import formal_available, run_sby
from elmoe3d.tb.formal.streams import RegisterSliceFormal

_ok, _why = formal_available()


@pytest.mark.formal
@pytest.mark.skipif(not _ok, reason=_why)
def test_register_slice_formal():
    r = run_sby(RegisterSliceFormal(4), name="register_slice_prove", depth=12, mode="prove")
    assert r.status == "PASS"


@pytest.mark.formal
@pytest.mark.skipif(not _ok, reason=_why)
def test_register_slice_formal_catches_bug():
    r = run_sby(RegisterSliceFormal(4, bug="drop"), name="register_slice_bug", depth=8,
                expect="FAIL")
    assert r.status == "FAIL"


def test_register_slice_throughput_and_order():
    """Random ready on the output, always-valid input: everything arrives in
    order, and with ``o.ready`` high the slice moves one payload per cycle."""
    import random
    dut = RegisterSlice(unsigned(8))
    rnd = random.Random(1)
    got, sent = [], []

    async def bench(ctx):
        nxt = 0
        for cyc in range(400):
            ready = 1 if cyc < 200 else rnd.random() < 0.6
            ctx.set(dut.i.valid, 1)
            ctx.set(dut.i.payload, nxt & 0xFF)
            ctx.set(dut.o.ready, ready)
            _, _, iv, ir, ov, orr, op = await ctx.tick().sample(
                dut.i.valid, dut.i.ready, dut.o.valid, dut.o.ready, dut.o.payload)
            if iv and ir:
                sent.append(nxt & 0xFF)
                nxt += 1
            if ov and orr:
                got.append(op)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert got == sent[:len(got)] and len(sent) - len(got) <= 2
    assert len(got) >= 198 + 100           # full rate while o.ready is high
